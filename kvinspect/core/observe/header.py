"""The trace header for a model kvinspect did not load: what the model object itself says."""

from __future__ import annotations

import os
import re
import sys

from kvinspect.core import env
from kvinspect.core.model.devices import dtype_name


def device_label(model) -> str:
    """``cpu``, ``cuda:0``, ``mps`` … or ``multi-gpu`` for a model spread by a device map."""
    dmap = getattr(model, "hf_device_map", None)
    if isinstance(dmap, dict) and len({str(v) for v in dmap.values()}) > 1:
        return "multi-gpu"
    try:
        dev = str(next(model.parameters()).device)
    except StopIteration:
        return "cpu"
    return "cuda:0" if dev == "cuda" else dev


def model_name(model) -> str:
    """A short name: the checkpoint folder or hub id, else the model type."""
    cfg = model.config
    path = str(getattr(cfg, "_name_or_path", "") or "").rstrip("/\\")
    if path:
        return os.path.basename(path) if os.path.isabs(path) or path.startswith(".") else path
    return str(getattr(cfg, "model_type", None) or type(model).__name__)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "model"


def observed_header(model, device: str, memory, mode: str, command: list[str] | None) -> dict:
    cfg = model.config
    name = model_name(model)
    return {
        "created": env.now_iso(),
        "versions": env.versions(),
        "machine": env.machine(),
        "model": {
            "spec": str(getattr(cfg, "_name_or_path", "") or name),
            "name": name,
            "source": "observed",
            "class": type(model).__name__,
            "device": device,
            "dtype": dtype_name(getattr(model, "dtype", "")),
            "load_seconds": None,
            "notes": [],
            "config": env.cache_config(cfg),
            "generation_config": env.generation_config(model),
        },
        "device": device,
        "memory": memory.describe(),
        "layers": env.config_layers(cfg),
        # The user's code decided everything below; the keys stay for readers that expect them.
        "session": {
            "policy": "observed",
            "cache_impl": None,
            "system": None,
            "chat_template": None,
            "max_cache_len": None,
            "generation_config_overrides": {},
            "respect_generation_config": True,
            "settings": {},
        },
        "command": command,
        "observed": {
            "mode": mode,  # "api" (kvinspect.observe) or "trace" (kvinspect trace)
            "pid": os.getpid(),
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "cwd": os.getcwd(),
        },
    }
