"""Compare-mode configurations: what a name such as ``static+compile`` means, and whether it can run here.

A configuration is a (policy, cache implementation, compiled?) triple with the name the user
typed. Availability is decided by feature detection before anything runs, so a configuration
that cannot run on this machine or model is reported as skipped with a one-line reason
instead of failing every turn.
"""

from __future__ import annotations

import contextlib
import re
import types
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kvinspect.core import compat
from kvinspect.core.errors import ScriptError, UnsupportedCacheError, first_line
from kvinspect.core.model.loading import LoadedModel
from kvinspect.core.session.policies import (
    CACHE_IMPLS,
    POLICIES,
    POLICY_HELP,
    check_cache_available,
    check_cache_impl,
    check_policy,
)

COMPILE_SUFFIX = "+compile"

#: The named configurations, in the order reports list them.
NAMED = {
    "dynamic": ("reuse", "dynamic", False),
    "static": ("reuse", "static", False),
    "static+compile": ("reuse", "static", True),
    "offloaded": ("reuse", "offloaded", False),
    "quantized": ("reuse", "quantized", False),
    "nocache": ("nocache", "dynamic", False),
}
DEFAULT_CONFIGS = "dynamic,static,static+compile,offloaded,quantized,nocache"

CONFIG_HELP = {
    "dynamic": "DynamicCache reused across turns (full prompt, prefix check, crop)",
    "static": "StaticCache of max_cache_len rows reused across turns, eager forward",
    "static+compile": "StaticCache + torch.compile of the decode step (warm-up reported apart)",
    "offloaded": "DynamicCache(offloading=True): layers wait on the CPU between uses (CUDA only)",
    "quantized": "QuantizedCache (fp8 on transformers 5.x, else optimum-quanto or hqq)",
    "nocache": "use_cache=False: every step re-reads the whole sequence",
}


@dataclass(frozen=True)
class CompareConfig:
    """One column of a comparison: how the cache is handled, as the user named it."""

    name: str
    policy: str = "reuse"
    cache_impl: str = "dynamic"
    compile: bool = False

    @property
    def slug(self) -> str:
        """The name made safe for a folder (``recreate:static`` → ``recreate-static``)."""
        return re.sub(r"[^A-Za-z0-9+._-]+", "-", self.name).strip("-") or "config"

    @property
    def uses_static(self) -> bool:
        return self.cache_impl == "static" and self.policy != "nocache"

    @property
    def description(self) -> str:
        if self.name in CONFIG_HELP:
            return CONFIG_HELP[self.name]
        text = POLICY_HELP.get(self.policy, self.policy)
        if self.cache_impl != "dynamic":
            text += f"; {self.cache_impl} cache"
        return text + (" + compiled decode step" if self.compile else "")

    def to_dict(self) -> dict:
        return {"name": self.name, "policy": self.policy, "cache_impl": self.cache_impl, "compile": self.compile,
                "description": self.description}


def canonical_name(policy: str, impl: str, compile: bool = False) -> str:
    """The one name of a (policy, cache, compiled) triple: ``reuse`` and ``dynamic`` are the defaults.

    ``reuse:static`` → ``static``, ``recreate:dynamic`` → ``recreate``, ``reuse:static+compile`` →
    ``static+compile``; anything else is ``POLICY:IMPL`` (+``+compile``).
    """
    for name, triple in NAMED.items():
        if triple == (policy, impl, compile):
            return name
    if policy == "reuse":
        base = impl
    elif impl == "dynamic":
        base = policy
    else:
        base = f"{policy}:{impl}"
    return base + (COMPILE_SUFFIX if compile else "")


#: Policies that never use the cache the configuration names, and why (refused with an explicit cache).
_CACHE_IGNORED = {
    "nocache": "nocache runs without a cache object (use_cache=False), so a cache implementation would be "
               "ignored; write plain 'nocache'",
    "cache-without-config": "cache-without-config always builds a plain DynamicCache() without the model config, "
                            "so another cache implementation would be ignored; write plain 'cache-without-config'",
}


def parse_config(name: str) -> CompareConfig:
    """``dynamic``, ``static+compile``, a policy name (``recreate``) or ``POLICY:IMPL`` (``recreate:static``).

    The configuration gets its canonical name (:func:`canonical_name`), whatever the spelling.
    """
    raw = (name or "").strip()
    key = raw.lower().replace("_", "-")
    if not key:
        raise ScriptError("--configs has an empty entry (two commas in a row, or a leading/trailing comma); "
                          "e.g. dynamic,static,nocache")
    if key in NAMED:
        policy, impl, comp = NAMED[key]
        return CompareConfig(key, policy, impl, comp)
    comp = key.endswith(COMPILE_SUFFIX)
    base = key.removesuffix(COMPILE_SUFFIX)
    explicit_impl = False
    try:
        if ":" in base:
            pol, impl = base.split(":", 1)
            policy, impl = check_policy(pol), check_cache_impl(impl)
            explicit_impl = True
        elif base in CACHE_IMPLS:
            policy, impl = "reuse", base
        elif base in POLICIES:
            policy, impl = base, "dynamic"
        else:
            raise ScriptError("")
    except ScriptError:
        raise ScriptError(
            f"unknown configuration {raw!r}; use {', '.join(NAMED)}, a policy ({', '.join(POLICIES)}) "
            f"or POLICY:IMPL (e.g. recreate:static)"
        ) from None
    if policy in _CACHE_IGNORED and (comp or (explicit_impl and (policy == "nocache" or impl != "dynamic"))):
        raise ScriptError(f"configuration {raw!r}: {_CACHE_IGNORED[policy]}")
    if comp and impl != "static":
        raise ScriptError(f"configuration {raw!r}: +compile needs a static cache (e.g. static+compile); "
                          f"a dynamic cache changes shape every step, so there is nothing stable to compile")
    return CompareConfig(canonical_name(policy, impl, comp), policy, impl, comp)


def parse_configs(text: str) -> list[CompareConfig]:
    """A comma-separated list; empty entries and duplicates (after canonical naming) are refused."""
    raw = [n.strip() for n in (text or "").split(",")]
    if not any(raw):
        raise ScriptError("--configs needs at least one configuration, e.g. dynamic,static,nocache")
    if not all(raw):
        raise ScriptError(f"--configs {text.strip()!r} has an empty entry (two commas in a row, or a "
                          f"leading/trailing comma); list configurations like dynamic,static,nocache")
    out: list[CompareConfig] = []
    typed: dict[str, str] = {}
    for n in raw:
        cfg = parse_config(n)
        if cfg.name in typed:
            first = typed[cfg.name]
            if first.lower() == n.lower():
                raise ScriptError(f"configuration {cfg.name!r} is listed twice in --configs")
            raise ScriptError(f"--configs lists the same configuration twice: {first!r} and {n!r} are both "
                              f"{cfg.name!r} (policy {cfg.policy}, {cfg.cache_impl} cache"
                              + (", compiled" if cfg.compile else "") + "); list it once")
        typed[cfg.name] = n
        out.append(cfg)
    return out


# -- availability ---------------------------------------------------------------------------------
def unavailable_reason(loaded: LoadedModel, cfg: CompareConfig) -> str | None:
    """Why ``cfg`` cannot run with this model on this machine (one line), or None when it can."""
    if cfg.policy == "nocache":
        return None  # no cache object at all: always runs
    try:
        check_cache_available(loaded, cfg.cache_impl)
    except UnsupportedCacheError as exc:
        return str(exc).removeprefix("--cache ")
    if cfg.cache_impl == "static":
        why = _static_reason(loaded)
        if why:
            return why
    if cfg.compile:
        return compile_reason(loaded)
    return None


def _static_reason(loaded: LoadedModel) -> str | None:
    try:
        compat.new_static_cache(loaded.model.config, 16)
    except Exception as exc:  # noqa: BLE001 - any refusal means: not for this model
        return f"StaticCache cannot be built for this model: {first_line(exc)}"
    return None


def compile_reason(loaded: LoadedModel) -> str | None:
    """Why torch.compile of the decode step is not available for this model here, or None."""
    model = loaded.model
    if not getattr(type(model), "_can_compile_fullgraph", False):
        return f"transformers marks {type(model).__name__} as not compilable (_can_compile_fullgraph is False)"
    if "llama4" in str(getattr(model.config, "model_type", "")):
        # transformers' own get_compiled_call refuses these too (hybrid chunked cache).
        return "transformers does not compile llama4 models (hybrid chunked attention)"
    dev = loaded.device
    if dev == "mps":
        return "torch.compile of the decode step is not supported on MPS here"
    if dev == "multi-gpu":
        return "torch.compile is not used with a model spread over several GPUs"
    return _compile_probe("cuda" if dev.startswith("cuda") else "cpu")


@lru_cache(maxsize=4)
def _compile_probe(device: str) -> str | None:
    """Compile and run a two-op function once: inductor needs a working C++/Triton toolchain."""
    import torch

    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        import torch._dynamo as dynamo

        if hasattr(dynamo, "is_dynamo_supported") and not dynamo.is_dynamo_supported():
            return "torch.compile is not supported on this Python/torch"
        fn = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="inductor")
        fn(torch.ones(8, device=device))
    except Exception as exc:  # noqa: BLE001 - a missing compiler shows up as many error types
        return f"torch.compile does not work here ({type(exc).__name__}: {first_line(exc)[:160]})"
    return None


# -- compiled decode step -------------------------------------------------------------------------
#: Where the compiled decode step is kept: on the model itself (a cycle the collector frees with the
#: model), because the compiled function holds the model and a module-level cache would keep it alive.
_COMPILED_ATTR = "_kvinspect_compiled_decode"


def default_compile_mode(device: str) -> str:
    """CUDA graphs (``reduce-overhead``, transformers' own default) on CUDA; plain inductor elsewhere."""
    return "reduce-overhead" if device.startswith("cuda") else "default"


def compiled_graph_count() -> int:
    """Graphs dynamo has compiled in this process (to tell warm-up from recompiles in steady state)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - private counters: best effort
        return -1


@contextlib.contextmanager
def compiled_decode(model, mode: str):
    """Route one-token (decode) forwards of ``model`` through ``torch.compile``; prefill stays eager.

    This is transformers' own split (its auto-compile compiles decoding only, so prompts of new
    lengths never recompile), done on the instance's ``forward`` rather than ``__call__`` so the
    inspector's forward hook keeps running eagerly around the compiled graph. The compiled
    function is kept per model: later runs reuse the warm graphs. The instance is restored on exit.
    """
    import torch

    per_model = vars(model).get(_COMPILED_ATTR)
    if per_model is None:
        per_model = {}
        object.__setattr__(model, _COMPILED_ATTR, per_model)
    had = "forward" in vars(model)
    saved = vars(model).get("forward")
    eager = saved if had else types.MethodType(type(model).forward, model)
    compiled = per_model.get(mode)
    if compiled is None:
        compiled = per_model[mode] = torch.compile(eager, mode=mode, fullgraph=False, dynamic=False)

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is not None and getattr(ids, "dim", lambda: 0)() == 2 and ids.shape[1] == 1:
            return compiled(*args, **kwargs)
        return eager(*args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        if had:
            model.forward = saved
        else:
            del model.forward


#: The dynamo loggers whose "hit config.recompile_limit" warning a compiled run may trigger.
_DYNAMO_LOGGERS = ("torch._dynamo.convert_frame", "torch._dynamo")


class _RecompileLimitCapture:
    """A logging filter that swallows dynamo's "hit config.recompile_limit" warning and keeps what it said."""

    def __init__(self):
        self.hits: list[dict] = []

    def filter(self, record) -> bool:
        msg = str(getattr(record, "msg", ""))
        if "hit config." not in msg:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        hit: dict[str, Any] = {"limit_type": None, "limit": None, "function": None, "reason": None}
        for key, val in zip(("limit_type", "limit", "function", "reason"), args):
            hit[key] = val if isinstance(val, (int, float)) or val is None else str(val)
        if hit["reason"]:  # "1/7: <guard>  # <source line>": keep the guard
            hit["reason"] = re.sub(r"^\d+/\d+:\s*", "", hit["reason"].split("#", 1)[0].strip())[:200]
        self.hits.append(hit)
        return False


@contextlib.contextmanager
def quiet_recompiles():
    """Keep dynamo's recompile-limit warning off stderr for the duration of a compiled run; yield the hits.

    A multi-turn chat feeds the compiled decode step new shapes or guarded values (e.g. the sliding
    layers' position counters), so recompiling is expected here and hitting the limit means "the
    rest runs eagerly", which the report states instead. The filter is removed on exit, so the
    process's logging is as it was before the run.
    """
    import logging

    cap = _RecompileLimitCapture()
    loggers = [logging.getLogger(n) for n in _DYNAMO_LOGGERS]
    for lg in loggers:
        lg.addFilter(cap)
    try:
        yield cap.hits
    finally:
        for lg in loggers:
            lg.removeFilter(cap)
