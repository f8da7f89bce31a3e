"""Device and dtype choice, feature-detected (CPU-only torch must work everywhere)."""

from __future__ import annotations

from kvinspect.core.errors import ModelSpecError

DEVICES = ("auto", "cpu", "cuda", "mps", "multi-gpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def has_mps() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(device: str) -> tuple[str, str | dict | None]:
    """Return ``(label, device_map)``; ``device_map`` is what ``from_pretrained`` gets.

    ``auto`` picks cuda > mps > cpu. ``multi-gpu`` spreads the model over every visible GPU
    with accelerate's ``device_map="auto"`` (for models too big for one card).
    """
    d = (device or "auto").strip().lower()
    if d == "auto":
        d = "cuda" if has_cuda() else "mps" if has_mps() else "cpu"
    if d == "multi-gpu":
        if not has_cuda():
            raise ModelSpecError("--device multi-gpu needs CUDA, and this torch sees no GPU")
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise ModelSpecError("--device multi-gpu needs accelerate: pip install accelerate") from None
        return "multi-gpu", "auto"
    if d.startswith("cuda"):
        if not has_cuda():
            raise ModelSpecError(f"--device {device}: this torch has no CUDA (torch.cuda.is_available() is False)")
        return d, d
    if d == "mps":
        if not has_mps():
            raise ModelSpecError("--device mps: MPS is not available in this torch")
        return d, d
    if d == "cpu":
        return "cpu", "cpu"
    raise ModelSpecError(f"unknown device {device!r}; use one of {', '.join(DEVICES)} or cuda:N")


def resolve_dtype(dtype: str, device_label: str):
    """``auto``: float32 on CPU (half precision is many times slower there), bf16/fp16 on GPUs."""
    import torch

    d = (dtype or "auto").strip().lower()
    if d == "auto":
        if device_label == "cpu":
            return torch.float32
        if device_label == "mps":
            return torch.float16
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if d not in table:
        raise ModelSpecError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return table[d]


def dtype_name(dt) -> str:
    return str(dt).removeprefix("torch.")
