"""The cache policies and cache implementations a session can run, with their help texts and checks.

A *policy* is how the cache is handled across turns: the correct reuse, or one of the classic
mistakes reproduced on purpose. An *implementation* is the cache class transformers builds. The CLI's
flags, the window's choosers and About box, and ``kvinspect compare`` all name them from here; the
driver that runs them is :mod:`.chat`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvinspect.core import compat, env
from kvinspect.core.errors import ScriptError, UnsupportedCacheError

if TYPE_CHECKING:
    from kvinspect.core.model.loading import LoadedModel

POLICIES = ("reuse", "recreate", "refeed", "nocache", "cache-without-config", "cache-and-use-cache-false",
            "image-as-text", "images-again", "image-no-token-types")
#: The image mistakes: each reuses the cache as "reuse" does and gets one thing about the pictures wrong.
MEDIA_POLICIES = ("image-as-text", "images-again", "image-no-token-types")
POLICY_HELP = {
    "reuse": "one cache across turns; full prompt + prefix check + crop (the correct way)",
    "recreate": "a new cache object every turn (the cache created inside the loop)",
    "refeed": "the full history fed onto the reused cache by a manual forward loop (duplicated context)",
    "nocache": "use_cache=False (the slow baseline: every step re-reads the whole sequence)",
    "cache-without-config": "DynamicCache() built without the model config (a window is never applied)",
    "cache-and-use-cache-false": "a cache passed together with use_cache=False (the cache swallows every step)",
    "image-as-text": "image turns rendered with the tokenizer alone: the placeholder is never expanded, no pixels "
                     "(vision-language models)",
    "images-again": "every picture of the conversation passed again with the reused cache (vision-language models)",
    "image-no-token-types": "image prefills without token_type_ids: the image block runs causally (Gemma 3 style)",
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


def check_cache_available(loaded: LoadedModel, impl: str) -> None:
    """Raise UnsupportedCacheError (one line) when ``impl`` cannot run with this model here."""
    impl = check_cache_impl(impl)
    name = loaded.name
    if impl == "offloaded":
        if not (loaded.device.startswith("cuda") or loaded.device == "multi-gpu"):
            raise UnsupportedCacheError(
                f"--cache offloaded needs a CUDA device (offloading moves layers between GPU and CPU); "
                f"this run is on {loaded.device}"
            )
    if impl == "quantized":
        kinds = {lay["config_attention"] for lay in env.config_layers(loaded.model.config)}
        if kinds - {"full"}:
            raise UnsupportedCacheError(
                f"--cache quantized supports full-attention models only; {name} has "
                f"{'/'.join(sorted(kinds - {'full'}))} layers"
            )
        if not compat.quantized_backends():
            raise UnsupportedCacheError(
                "--cache quantized needs a backend: transformers >= 5 (fp8), optimum-quanto or hqq"
            )
