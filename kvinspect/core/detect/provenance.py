"""Where ``cache_implementation``, ``cache_config`` and ``use_cache`` came from for one call.

A checkpoint's ``generation_config.json`` on the Hub can set ``cache_implementation``; the
user's own cache then collides with it and ``generate()`` refuses, although the user's code never
named it (huggingface/transformers #35026; the HF forum thread "KV caching problem with Gemma 3").
So each effective value gets its source, found by comparing the layers generate() merges:

- ``generate() kwarg``: the call's own keyword;
- ``GenerationConfig passed in``: the ``generation_config=`` argument (the merged value differs
  from ``model.generation_config``'s without a keyword);
- ``generation_config.json``: ``model.generation_config`` holds what the checkpoint's file says
  (its path is recorded);
- ``code set model.generation_config``: it holds something the file does not say;
- ``kvinspect --generation-config``: kvinspect's own override (``kvinspect run``);
- ``default``: none of these set it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KEYS = ("cache_implementation", "cache_config", "use_cache")
KWARG = "generate() kwarg"
PASSED = "GenerationConfig passed in"
FILE = "generation_config.json"
CODE = "code set model.generation_config"
OPTION = "kvinspect --generation-config"
DEFAULT = "default"

_DEFAULTS: dict[str, Any] = {"cache_implementation": None, "cache_config": None, "use_cache": True}
_UNSET = object()


def checkpoint_file(model) -> tuple[str | None, dict]:
    """The model's ``generation_config.json`` (path, contents), when it exists on disk; ``(None, {})`` if not."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not name:
        return None, {}
    path: Path | None = Path(name) / "generation_config.json"
    if path is not None and not path.is_file():
        path = None
        try:  # a hub id: only what is already in the local cache, never a download
            from transformers.utils import cached_file

            found = cached_file(str(name), "generation_config.json", local_files_only=True,
                                _raise_exceptions_for_missing_entries=False)
            path = Path(found) if found else None
        except Exception:  # noqa: BLE001 - no file is an answer, not an error
            path = None
    if path is None:
        return None, {}
    try:
        return str(path), dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return str(path), {}


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    to_dict = getattr(v, "to_dict", None)
    if callable(to_dict):
        try:
            return _plain(to_dict())
        except Exception:  # noqa: BLE001
            pass
    return repr(v)


def config_sources(model, *, kwargs: dict | None = None, effective=None, overrides: dict | None = None,
                   file: tuple[str | None, dict] | None = None) -> dict[str, dict]:
    """``{key: {"value", "source", "path"?}}`` for :data:`KEYS`.

    ``kwargs``: the generate() call's keywords; ``effective``: the GenerationConfig it merged (None:
    the model's own); ``overrides``: kvinspect's ``--generation-config`` values; ``file``: from
    :func:`checkpoint_file` (looked up when None).
    """
    path, contents = file if file is not None else checkpoint_file(model)
    model_gc = getattr(model, "generation_config", None)
    out: dict[str, dict] = {}
    for key in KEYS:
        model_value = getattr(model_gc, key, _DEFAULTS[key]) if model_gc is not None else _DEFAULTS[key]
        if kwargs and key in kwargs:
            value, source = kwargs[key], KWARG
        elif effective is not None and getattr(effective, key, model_value) != model_value:
            value, source = getattr(effective, key), PASSED
        elif overrides and key in overrides:
            value, source = overrides[key], OPTION
        else:
            value = model_value
            in_file = contents.get(key, _UNSET)
            if in_file is not _UNSET and _plain(in_file) == _plain(value):
                source = FILE
            elif value != _DEFAULTS[key]:
                source = CODE
            else:
                source = DEFAULT
        entry = {"value": _plain(value), "source": source}
        if source == FILE and path:
            entry["path"] = path
        out[key] = entry
    return out


def shown(value: Any) -> str:
    """A config value for messages and reports: ``unset`` for None, JSON otherwise (never Python's None)."""
    return "unset" if value is None else json.dumps(value)


def describe(entry: dict | None) -> str:
    """``from generation_config.json (/path)`` and the like, for messages."""
    if not entry:
        return ""
    src = entry.get("source", "")
    return f"from {src} ({entry['path']})" if entry.get("path") else f"from {src}"
