"""What a trace header records about the machine, the software and the model's cache config."""

from __future__ import annotations

import functools
import platform
import sys
from datetime import UTC, datetime
from typing import Any

from . import compat

#: Config fields that decide what the cache does (read from the text config).
CACHE_CONFIG_FIELDS = (
    "model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_size", "max_position_embeddings", "sliding_window", "attention_chunk_size",
    "use_sliding_window", "max_window_layers", "sliding_window_pattern", "layer_types",
    "num_kv_shared_layers", "use_cache",
)
GEN_CONFIG_FIELDS = ("cache_implementation", "cache_config", "use_cache", "eos_token_id", "max_length")


def versions() -> dict[str, str]:
    """The versions of what runs. Read once per process: ~25 ms of package metadata, at every
    ``kvinspect.observe()`` and session start, and the imported code cannot change under a process."""
    return dict(_versions())


@functools.cache
def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("kvinspect", "transformers", "torch", "PySide6-Essentials", "pyqtgraph", "numpy", "accelerate", "gguf"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            continue
    return out


def machine() -> dict:
    out: dict[str, Any] = {
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "python_impl": sys.implementation.name,
    }
    try:
        import torch

        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            out["cuda"] = torch.version.cuda
        mps = getattr(torch.backends, "mps", None)
        out["mps_available"] = bool(mps is not None and mps.is_available())
        out["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return out


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def cache_config(config) -> dict:
    tc = compat.text_config(config)
    out = {}
    for name in CACHE_CONFIG_FIELDS:
        if hasattr(tc, name):
            out[name] = _jsonable(getattr(tc, name))
    out["architectures"] = _jsonable(getattr(config, "architectures", None))
    return out


def generation_config(model) -> dict:
    gc = getattr(model, "generation_config", None)
    if gc is None:
        return {}
    return {name: _jsonable(getattr(gc, name, None)) for name in GEN_CONFIG_FIELDS}


def config_layers(config) -> list[dict]:
    types = compat.config_layer_types(config)
    from kvinspect.core.cache.layer_shapes import ATTENTION_OF_LAYER_TYPE

    return [
        {"index": i, "config_attention": ATTENTION_OF_LAYER_TYPE.get(t, "full"), "layer_type": t,
         "window": compat.config_window(config, t)}
        for i, t in enumerate(types)
    ]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
