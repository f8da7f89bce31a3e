"""Feature detection across transformers 4.56 → 5.x. Never compare version strings.

Each helper answers one question the rest of the core asks of transformers, in the way
that works on every supported release (see docs/compat.md for what differs).
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any


def dtype_kwarg() -> str:
    # 4.56 already accepts ``dtype=`` (``torch_dtype`` is the deprecated spelling).
    return "dtype"


@lru_cache(maxsize=64)
def _forward_params(cls: type[Any]) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def compiling_test():
    """torch's own answer to "is torch.compile tracing this call?" (``torch.compiler.is_compiling``).

    Every observation hook asks it first and steps aside when it says yes: a hook that Dynamo traces into
    a compiled graph breaks ``fullgraph=True`` and adds graph breaks elsewhere (docs/observe.md). Dynamo
    folds the call to a constant, so the hook costs the graph nothing."""
    import torch

    test = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return test if test is not None else torch._dynamo.is_compiling


def cache_kwarg(model) -> str:
    """``cache`` on 5.24+, ``past_key_values`` before."""
    # The ignore: mypy does not see a class object as Hashable (it checks object.__hash__ unbound).
    return "cache" if "cache" in _forward_params(type(model)) else "past_key_values"  # type: ignore[arg-type]


def cache_from_call(kwargs: dict, output: Any):
    """The cache object a forward call used or returned, without touching deprecated properties."""
    cache = None
    if isinstance(output, dict):
        # A ModelOutput is an OrderedDict: dict's own lookup, as its get() and [] warn about the old
        # name (5.x) or copy every field (``[]``), costly right after a forward (the step hook).
        cache = dict.get(output, "cache")
        if cache is None:
            cache = dict.get(output, "past_key_values")
    elif output is not None and hasattr(output, "keys"):
        keys = output.keys()
        if "cache" in keys:
            cache = output["cache"]
        elif "past_key_values" in keys:
            cache = output["past_key_values"]
    if cache is None:
        cache = kwargs.get("cache")
        if cache is None:
            cache = kwargs.get("past_key_values")
    return cache


def cache_from_generate_output(out: Any):
    keys = out.keys() if hasattr(out, "keys") else ()
    if "cache" in keys:
        return out["cache"]
    if "past_key_values" in keys:
        return out["past_key_values"]
    return None


def layer_capacity(layer) -> int | None:
    """Max rows a layer can hold; None when unbounded (dynamic full layers report -1)."""
    fn = getattr(layer, "get_max_length", None) or getattr(layer, "get_max_cache_shape", None)
    if fn is None:
        return None
    try:
        cap = int(fn())
    except Exception:  # noqa: BLE001 - dummy/linear layers may refuse
        return None
    return None if cap < 0 else cap


def crop(cache, new_len: int) -> None:
    """Crop ``cache`` to ``new_len`` tokens; works on 4.56–5.x (negative form only).

    Raises ``ValueError``/``RuntimeError`` when a sliding layer is past its window.
    """
    cur = int(cache.get_seq_length())
    if new_len >= cur:
        return
    cache.crop(new_len - cur)


def text_config(config):
    try:
        return config.get_text_config(decoder=True)
    except TypeError:  # very old signature
        return config.get_text_config()


def max_positions(config) -> int | None:
    """``max_position_embeddings`` of the text model, when it declares one."""
    mpe = getattr(text_config(config), "max_position_embeddings", None)
    return int(mpe) if isinstance(mpe, int) and mpe > 0 else None


def config_layer_types(config) -> list[str]:
    """The attention type of every decoder layer, as the cache would build it.

    ``config.layer_types`` when present; else one global rule (sliding if
    ``sliding_window`` is set, chunked if ``attention_chunk_size`` is), as transformers
    does when it builds ``DynamicCache(config=...)``.
    """
    tc = text_config(config)
    n = int(getattr(tc, "num_hidden_layers", 0) or 0)
    types = getattr(tc, "layer_types", None)
    if types:
        return [str(t) for t in types][:n] if n else [str(t) for t in types]
    if getattr(tc, "sliding_window", None):
        return ["sliding_attention"] * n
    if getattr(tc, "attention_chunk_size", None):
        return ["chunked_attention"] * n
    return ["full_attention"] * n


def config_window(config, layer_type: str) -> int | None:
    tc = text_config(config)
    if layer_type == "sliding_attention":
        return getattr(tc, "sliding_window", None) or getattr(tc, "attention_chunk_size", None)
    if layer_type == "chunked_attention":
        return getattr(tc, "attention_chunk_size", None) or getattr(tc, "sliding_window", None)
    return None


def new_dynamic_cache(config=None, offloading: bool = False):
    from transformers import DynamicCache

    if config is None:
        return DynamicCache()
    if offloading:
        return DynamicCache(config=config, offloading=True)
    return DynamicCache(config=config)


def new_static_cache(config, max_cache_len: int):
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=max_cache_len)


def quantized_backends() -> list[str]:
    """Quantized-cache backends usable here: fp8 (5.x, no extras), quanto, hqq (extras)."""
    import importlib.util

    out = []
    try:
        from transformers import cache_utils

        if hasattr(cache_utils, "Fp8QuantizedLayer"):
            out.append("fp8")
    except ImportError:
        pass
    if importlib.util.find_spec("optimum") and importlib.util.find_spec("optimum.quanto"):
        out.append("quanto")
    if importlib.util.find_spec("hqq"):
        out.append("hqq")
    return out


def new_quantized_cache(config, backend: str):
    from transformers import QuantizedCache

    return QuantizedCache(backend=backend, config=config)


def has_past_recording(cache) -> bool:
    return hasattr(cache, "activate_past_recording")


_refeeds: bool | None = None


def assisted_refeeds_prefix() -> bool:
    """Whether this transformers' assisted / prompt-lookup decoding feeds a filled cache's prefix again.

    Read from its own source (``_assisted_decoding`` passes no ``next_sequence_length`` on the first
    iteration, so ``prepare_inputs_for_generation`` keeps the whole prompt; 5.24 does, 4.56 slices by
    ``cache_position``), once: a version number would not say which releases carry it."""
    global _refeeds
    if _refeeds is None:
        try:
            import inspect

            from transformers.generation.utils import GenerationMixin

            src = inspect.getsource(GenerationMixin._assisted_decoding)
            _refeeds = "if not is_first_iteration else None" in src
        except Exception:  # noqa: BLE001 - no source (a frozen install): not known to re-feed
            _refeeds = False
    return _refeeds
