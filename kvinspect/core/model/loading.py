"""Load a causal LM and its tokenizer from any model spec: one function for CLI, GUI, tests.

A spec is a built-in name (``tiny-*``, ``smollm2``), a ``.gguf`` file, a local model
directory, or a Hugging Face hub id. Cheap checks run first, so a wrong spec fails in
milliseconds with one line instead of after importing torch.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvinspect.core.errors import Cancelled, ModelLoadError, ModelSpecError, RuntimeFault, exc_line, runtime_fault
from kvinspect.core.model.catalog import BuiltinModel, builtin_names, find_builtin

log = logging.getLogger(__name__)

Progress = Callable[[str, float | None], None]
CancelCheck = Callable[[], bool]

#: Longer than any path the filesystem takes (PATH_MAX) or any hub id.
MAX_SPEC_CHARS = 4096
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")

#: Used when a checkpoint ships no chat template (base models): ChatML, clearly flagged.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class ResolvedSpec:
    """What a spec points at, before anything heavy is imported."""

    spec: str
    kind: str  # "builtin" | "gguf" | "dir" | "hub"
    location: str  # built-in name, file, directory or hub id
    builtin: BuiltinModel | None = None
    gguf_file: str | None = None


@dataclass
class LoadedModel:
    """A model ready to chat with, plus what the inspector needs to know about it."""

    model: Any
    tokenizer: Any
    spec: str
    resolved: ResolvedSpec
    device: str
    dtype: str
    load_seconds: float
    trust_remote_code: bool = False
    notes: list[str] = field(default_factory=list)
    #: Where the weights came from: gguf | converted-cache | folder | hub | builtin (summary.json model_info).
    load_source: str = "builtin"
    #: A vision-language model's processor (images and text into ids, pixels, token types); None: text only.
    processor: Any = None

    @property
    def config(self):
        return self.model.config

    @property
    def name(self) -> str:
        return self.resolved.builtin.name if self.resolved.builtin else self.spec

    @property
    def input_device(self):
        """Where input ids must go (the embedding's device, also under a device map)."""
        return self.model.get_input_embeddings().weight.device


def resolve_spec(spec: str) -> ResolvedSpec:
    """Classify ``spec`` and check that it names something that exists. Raises ModelSpecError."""
    if spec is None or not str(spec).strip():
        raise ModelSpecError("no model given; try a built-in: " + ", ".join(builtin_names()))
    spec = str(spec).strip()
    if len(spec) > MAX_SPEC_CHARS:
        raise ModelSpecError(f"the model spec is {len(spec):,} characters long; a built-in name, a path or a hub id "
                             f"is at most {MAX_SPEC_CHARS:,}")
    if "\x00" in spec or any("\ud800" <= ch <= "\udfff" for ch in spec):
        raise ModelSpecError("the model spec holds a NUL or a lone surrogate: not a name, a path or a hub id")
    try:
        return _resolve(spec)
    except OSError as exc:  # a name too long for the filesystem, a folder that cannot be read
        raise ModelSpecError(f"cannot use {spec!r} as a model: {exc.strerror or exc}") from None


def _resolve(spec: str) -> ResolvedSpec:
    b = find_builtin(spec)
    if b is not None:
        if b.fetch:
            from kvinspect.core.model.fetch import fetched_path, is_fetched

            if not is_fetched(b.fetch):
                raise ModelSpecError(
                    f"{b.name} is not fetched yet; run: kvinspect models fetch {b.fetch}"
                )
            p = fetched_path(b.fetch)
            return ResolvedSpec(spec, "gguf", str(p.parent), builtin=b, gguf_file=p.name)
        return ResolvedSpec(spec, "builtin", b.name, builtin=b)
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # ~nosuchuser: no home directory to expand
        raise ModelSpecError(f"no such file or directory: {spec} (no user {spec[1:].split('/', 1)[0]!r} "
                             f"to expand ~ for)") from None
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelSpecError(f"GGUF file not found: {spec}")
        return ResolvedSpec(spec, "gguf", str(path.resolve().parent), gguf_file=path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ResolvedSpec(spec, "gguf", str(path.resolve()), gguf_file=ggufs[0].name)
            raise ModelSpecError(f"{spec} is a directory without config.json (not a transformers model folder)")
        return ResolvedSpec(spec, "dir", str(path.resolve()))
    if path.exists():
        raise ModelSpecError(f"{spec} is a file but not a .gguf; give a model directory, a .gguf file or a hub id")
    looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec.strip("/").replace("/", os.sep, 1)[1:]
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return ResolvedSpec(spec, "hub", spec)
    if spec.lower().startswith("tiny-"):
        raise ModelSpecError(f"unknown built-in model {spec!r}; built-ins: {', '.join(builtin_names())}")
    if looks_like_path or "/" in spec:
        raise ModelSpecError(f"no such file or directory: {spec}")
    raise ModelSpecError(
        f"{spec!r} is not a built-in ({', '.join(builtin_names())}), a local path, or a hub id (org/name)"
    )


def _check_config_json(directory: Path) -> dict:
    cfg = directory / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ModelLoadError(f"{cfg} is not text (corrupt config.json)") from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{cfg} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{cfg} is not a JSON object")
    return data


def _check_causal(config, where: str) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(
            f"{where} is an encoder-decoder model ({config.model_type}); kvinspect inspects decoder-only causal LMs"
        )
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(
            f"{where} is not a causal language model (model_type {config.model_type!r} has no causal-LM head)"
        )
    archs = list(getattr(config, "architectures", None) or [])
    causal_markers = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
    if archs and not any(m in a for a in archs for m in causal_markers):
        raise ModelLoadError(
            f"{where} is not a causal language model (its checkpoint is {', '.join(archs)}, "
            f"a {config.model_type} without a causal-LM head)"
        )


def _check_gguf_header(path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    if len(head) < 8 or head[:4] != b"GGUF":
        raise ModelLoadError(f"{path.name} is not a GGUF file (no GGUF magic at its start)")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelLoadError("loading .gguf files needs the gguf package: pip install gguf") from None


def _gguf_error(path_name: str, exc: BaseException) -> ModelLoadError:
    text = _first_line(exc)
    # numpy/struct say "unpack_from requires a buffer of at least N bytes" / "mmap length is greater
    # than file size": the reader's words for a file that ends early (an interrupted download).
    if any(k in text for k in ("requires a buffer", "greater than file size", "cannot reshape array")):
        return ModelLoadError(f"{path_name} is truncated: the file ends before the data its header describes "
                              f"(an interrupted download or copy?); fetch or copy it again")
    return ModelLoadError(f"{path_name} is not a readable GGUF file (truncated or corrupt): {text}")


def load_model(
    spec: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
) -> LoadedModel:
    """Load ``spec``. Progress is reported as ``(stage, fraction or None)``.

    Cancellation is checked between stages (transformers' own loading cannot be
    interrupted); a cancelled load raises :class:`Cancelled` and returns nothing.
    """
    t0 = time.perf_counter()

    def step(stage: str, frac: float | None) -> None:
        if cancel and cancel():
            raise Cancelled("load cancelled")
        if progress:
            progress(stage, frac)

    resolved = resolve_spec(spec)
    notes: list[str] = []
    if trust_remote_code:
        log.warning("trust_remote_code is on: %s may run code from the model repository", spec)
        notes.append("trust_remote_code on: code from the model repository was allowed to run")
    if resolved.kind == "dir":
        _check_config_json(Path(resolved.location))
    if resolved.gguf_file is not None and resolved.builtin is None:  # kind "gguf", not a fetched built-in
        # A header check only (a full GGUFReader pass costs seconds on a 49k-token vocabulary);
        # truncation deeper in the file surfaces when transformers reads it (_load_pretrained).
        _check_gguf_header(Path(resolved.location) / resolved.gguf_file)

    step("importing torch and transformers", 0.05)
    from kvinspect.core.model.devices import dtype_name, resolve_device, resolve_dtype

    if progress is not None:
        # We report our own stages; transformers' tqdm bars would only clutter a terminal or log.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    dev_label, device_map = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, "cuda" if dev_label == "multi-gpu" else dev_label)

    load_source = "builtin"
    processor = None
    if resolved.kind == "builtin":
        from kvinspect.core.model.tiny import build_model, build_tokenizer

        tiny = resolved.builtin.tiny if resolved.builtin is not None else None
        if tiny is None:  # resolve_spec gives kind "builtin" only to a built-in with a TinySpec
            raise ModelSpecError(f"{spec} is not a tiny built-in model")
        step("building tokenizer", 0.3)
        if tiny.vision is not None:
            from kvinspect.core.model import tiny_vl

            tok = tiny_vl.build_tokenizer(tiny.vision)
            processor = tiny_vl.build_processor(tiny.vision, tok)
            step("building model", 0.5)
            model = tiny_vl.build_model(tiny, tiny.vision, tok)
        else:
            tok = build_tokenizer()
            step("building model", 0.5)
            model = build_model(tiny)
        if torch_dtype != model.dtype:
            model = model.to(torch_dtype)
        if dev_label != "cpu":
            step("moving to " + dev_label, 0.85)
            model = model.to(device_map if isinstance(device_map, str) and device_map != "auto" else "cuda")
    else:
        model, tok, load_source = _load_weights(resolved, device_map, torch_dtype, trust_remote_code, step)
        b = resolved.builtin
        if tok.chat_template is None and b is not None and b.chat_template:
            tok.chat_template = b.chat_template
            notes.append(f"{b.name} is a base model: it continues text rather than chats "
                         "(a plain User:/Assistant: transcript template is used)")
        elif tok.chat_template is None:
            tok.chat_template = FALLBACK_CHAT_TEMPLATE
            notes.append("the tokenizer has no chat template; a ChatML fallback is used")
    model.eval()
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    step("ready", 1.0)
    return LoadedModel(
        model=model,
        tokenizer=tok,
        spec=spec,
        resolved=resolved,
        device=dev_label,
        dtype=dtype_name(model.dtype),
        load_seconds=time.perf_counter() - t0,
        trust_remote_code=trust_remote_code,
        notes=notes,
        load_source=load_source,
        processor=processor,
    )


def _load_weights(resolved: ResolvedSpec, device_map, torch_dtype, trust_remote_code, step):
    """``(model, tokenizer, load_source)``; a GGUF goes through the conversion cache unless it is off."""
    if resolved.kind != "gguf":
        model, tok = _load_pretrained(resolved, device_map, torch_dtype, trust_remote_code, step)
        return model, tok, "folder" if resolved.kind == "dir" else "hub"
    import transformers

    if os.environ.get(NO_CONVERSION_CACHE_ENV, "").strip() not in ("", "0") or not _conversion_round_trips():
        model, tok = _load_pretrained(resolved, device_map, torch_dtype, trust_remote_code, step)
        return model, tok, "gguf"

    from kvinspect.core.model import conversion_cache as cc
    from kvinspect.core.model.devices import dtype_name

    gguf = Path(resolved.location) / str(resolved.gguf_file)
    step("checking the conversion cache", 0.08)
    try:
        key = cc.entry_key(cc.gguf_sha256(gguf), transformers.__version__, dtype_name(torch_dtype))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {gguf.name}: {exc.strerror or exc}") from None
    folder = cc.lookup(key)
    if folder is not None:
        converted = ResolvedSpec(resolved.spec, "dir", str(folder), builtin=resolved.builtin)
        tokenizer = (lambda: cc.load_tokenizer(folder)) if cc.fast_tokenizer(folder) else None
        try:
            model, tok = _load_pretrained(converted, device_map, torch_dtype, trust_remote_code, step,
                                          tokenizer=tokenizer)
            return model, tok, "converted-cache"
        except ModelLoadError as exc:
            # The manifest matched but transformers could not read it: rebuild it from the GGUF.
            log.warning("conversion cache %s unreadable (%s); converting again", folder.name, exc)
            shutil.rmtree(folder, ignore_errors=True)
    model, tok = _load_pretrained(resolved, device_map, torch_dtype, trust_remote_code, step)
    step("storing the conversion for the next load", 0.9)
    cc.store(model, tok, key)
    return model, tok, "gguf"


#: Set to 1 to always de-quantise a GGUF (no conversion cache read or written).
NO_CONVERSION_CACHE_ENV = "KVINSPECT_NO_CONVERSION_CACHE"


def _conversion_round_trips() -> bool:
    """Whether a stored conversion loads back as a working model on this transformers.

    On 4.5x (4.56.2 + torch 2.13, measured) the stored folder loads but ``generate()`` then raises
    ``RuntimeError: unsupported scalarType`` in the rotary embedding's autocast, so 4.x always
    de-quantises the GGUF (docs/compat.md).
    """
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


def _load_pretrained(resolved: ResolvedSpec, device_map, torch_dtype, trust_remote_code, step,
                     tokenizer: Callable[[], Any] | None = None):
    """``(model, tokenizer)``; ``tokenizer`` builds the tokenizer instead of ``AutoTokenizer`` (a stored conversion)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from kvinspect.core.compat import dtype_kwarg

    where = resolved.gguf_file or resolved.location  # gguf_file is set exactly for kind "gguf"
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if resolved.gguf_file:
        kw["gguf_file"] = resolved.gguf_file
    step("reading config", 0.1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(resolved.location, **kw)
    except Exception as exc:  # noqa: BLE001 - the GGUF reader raises struct/numpy/index errors alike
        if resolved.gguf_file:
            raise _gguf_error(resolved.gguf_file, exc) from None
        # Any other type too: huggingface_hub's strict config dataclasses raise their own
        # (num_hidden_layers "four"), and a config is the user's file, not our bug.
        raise _spec_or_load_error(resolved, exc) from None
    _check_causal(config, where)
    check_config_size(config, where, torch_dtype)
    step("loading tokenizer", 0.2)
    if resolved.kind == "dir" and not any((Path(resolved.location) / n).exists() for n in _TOKENIZER_FILES):
        raise ModelLoadError(f"{where} has no tokenizer files (looked for {', '.join(_TOKENIZER_FILES[:4])}, …); "
                             "copy the model's tokenizer next to its config.json")
    try:
        tok = tokenizer() if tokenizer is not None else AutoTokenizer.from_pretrained(resolved.location, **kw)
    except Exception as exc:  # noqa: BLE001 - tokenizer backends raise many types
        raise ModelLoadError(f"could not load the tokenizer of {where}: {_first_line(exc)}") from None
    step("loading weights" + (" (de-quantising GGUF)" if resolved.gguf_file else ""), 0.35)
    map_kw = {"device_map": device_map} if device_map not in (None, "cpu") else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            resolved.location, config=config, **{dtype_kwarg(): torch_dtype}, **map_kw, **kw
        )
    except Exception as exc:  # noqa: BLE001 - SafetensorError, UnpicklingError, struct errors: damaged files alike
        # Out of memory or a failing disk is the machine's fault, not the files': same line, exit 1.
        fault = RuntimeFault if runtime_fault(exc) is not None else ModelLoadError
        why = exc_line(exc) if fault is ModelLoadError else _first_line(exc)
        if type(exc).__name__ == "UnpicklingError":  # torch's advice to unpickle anyway is not ours to give
            why = "UnpicklingError: the .bin file is not a PyTorch checkpoint (damaged or not weights)"
        raise fault(f"could not load the weights of {where}: {why[:200]}") from None
    return model, tok


#: Config fields that size a model; a value outside these bounds is a damaged or hostile config.
_SIZE_FIELDS = {"num_hidden_layers": 10_000, "hidden_size": 1 << 20, "intermediate_size": 1 << 22,
                "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14, "vocab_size": 1 << 24}


def check_config_size(config, where: str, torch_dtype=None) -> None:
    """Refuse a config whose sizes are not counts, or whose weights cannot fit in memory, before building it."""
    for name, cap in _SIZE_FIELDS.items():
        v = getattr(config, name, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= cap:
            raise ModelLoadError(f"{where}: config {name} is {v!r}, not a size (1 to {cap:,})")
    h = getattr(config, "hidden_size", None)
    n = getattr(config, "num_hidden_layers", None)
    if not h or not n:
        return
    inter = getattr(config, "intermediate_size", None) or 4 * h
    vocab = getattr(config, "vocab_size", None) or 0
    params = n * (4 * h * h + 3 * h * inter) + 2 * vocab * h  # attention + MLP per layer, embeddings and head
    itemsize = getattr(torch_dtype, "itemsize", None) or 4
    need = params * itemsize
    try:
        import psutil

        have = psutil.virtual_memory().total
    except Exception:  # noqa: BLE001 - no psutil: no estimate
        return
    if need > have:
        raise ModelLoadError(f"{where}: its config describes about {params / 1e9:,.1f}B parameters "
                             f"(num_hidden_layers {n:,}, hidden_size {h:,}), about {need / 2**30:,.0f} GiB, more "
                             f"than this machine's {have / 2**30:,.0f} GiB of memory")


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model",
                    "vocab.txt", "merges.txt", "tiktoken.model")


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """One line for the user; a first line that announces a list ("… one of:") keeps its list."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    rest = lines[1:]
    while text.endswith(":") and rest:
        text += " " + "; ".join(rest)
        rest = []
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _spec_or_load_error(resolved: ResolvedSpec, exc: BaseException):
    if resolved.kind == "hub":
        offline = os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True", "YES", "yes")
        mode = "offline (HF_HUB_OFFLINE=1), " if offline else ""
        return ModelSpecError(
            f"{resolved.location!r}: {mode}not a built-in, not a local path, and not found on the hub"
            f" or in the Hugging Face cache ({_first_line(exc)[:160]})"
        )
    return ModelLoadError(f"could not read the config of {resolved.location}: {_first_line(exc)}")
