"""The cache policies and cache implementations a session can run, with their help texts and checks.

A *policy* is how the cache is handled across turns: the correct reuse, or one of the classic
mistakes reproduced on purpose. An *implementation* is the cache class transformers builds. The CLI's
flags, the window's choosers and About box, and ``kvinspect compare`` all name them from here; the
driver that runs them is :mod:`.chat`.
"""

from __future__ import annotations

from kvinspect.core.errors import ScriptError

POLICIES = ("reuse", "recreate", "refeed", "nocache", "cache-without-config", "cache-and-use-cache-false")
POLICY_HELP = {
    "reuse": "one cache across turns; full prompt + prefix check + crop (the correct way)",
    "recreate": "a new cache object every turn (the cache created inside the loop)",
    "refeed": "the full history fed onto the reused cache by a manual forward loop (duplicated context)",
    "nocache": "use_cache=False (the slow baseline: every step re-reads the whole sequence)",
    "cache-without-config": "DynamicCache() built without the model config (a window is never applied)",
    "cache-and-use-cache-false": "a cache passed together with use_cache=False (the cache swallows every step)",
}
CACHE_IMPLS = ("dynamic", "static", "offloaded", "quantized")
CACHE_HELP = {
    "dynamic": "DynamicCache built with the model config (grows; sliding layers keep their window)",
    "static": "StaticCache: buffers of max_cache_len rows allocated up front",
    "offloaded": "DynamicCache(offloading=True): layers rest on the CPU between uses (CUDA only)",
    "quantized": "QuantizedCache (full-attention models only; fp8 on transformers 5.x)",
}


def check_policy(policy: str) -> str:
    p = (policy or "reuse").strip().lower().replace("_", "-")
    if p not in POLICIES:
        raise ScriptError(f"unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    return p


def check_cache_impl(impl: str) -> str:
    c = (impl or "dynamic").strip().lower()
    if c not in CACHE_IMPLS:
        raise ScriptError(f"unknown cache implementation {impl!r}; choose one of: {', '.join(CACHE_IMPLS)}")
    return c
