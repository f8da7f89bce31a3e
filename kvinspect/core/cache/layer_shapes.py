"""What a cache layer is: its class, attention, storage, window and capacity, from the layer and the config.

Read from class names and attributes, never isinstance: several classes are absent on 4.56, and most
are not exported. The cache layers without a plain growing K/V pair, as transformers 5.x builds them
from ``config.layer_types`` (``cache_utils.DYNAMIC_LAYER_TYPE_MAPPING``):

- ``LinearAttentionLayer`` (``linear_attention`` / ``conv``: Qwen3-Next, LFM2, Jamba, …) keeps
  fixed-size ``conv_states`` / ``recurrent_states`` dicts and no token axis. Such a layer is a
  **state** layer: it has bytes, but "tokens seen / stored" would be invented numbers.
- ``LinearAttentionAnd{Full,SlidingWindow,Static…}AttentionLayer`` (``hybrid`` layer types:
  Falcon-H1) run attention and a state side by side in one layer: the kind is its attention's,
  and its bytes are its K/V rows plus the state.
- ``DummyLayer`` stands for a layer that reads another layer's K/V (``kv_sharing_modes`` "reuse",
  Gemma 3n's last ``num_kv_shared_layers``) and stores nothing: a **shared** layer, 0 bytes of its
  own, reading from the last non-shared layer of its attention type.
- ``DynamicIndexedLayer`` / ``StaticIndexedLayer`` (``indexed_attention``: DeepSeek V3.2, GLM DSA)
  keep K/V plus a 3-D ``indexer_keys`` cache, one row per token: an **indexed** layer, whose
  bytes count the indexer keys too (and whose values may be narrower than its keys, MLA).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvinspect.core import compat
from kvinspect.core.cache import layer_kinds
from kvinspect.core.cache.layer_kinds import INDEXED, SHARED, STATE
from kvinspect.core.errors import UnsupportedCacheError

#: Attention kinds as shown to users; ``config_attention`` is what the model config asks for.
ATTENTION_OF_LAYER_TYPE = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    **layer_kinds.KIND_OF_LAYER_TYPE,
}


@dataclass(frozen=True)
class LayerShape:
    """What a cache layer is; fixed for the life of one cache object."""

    index: int
    cls: str
    attention: str  # full | sliding | chunked | state | shared | indexed  (what the cache does)
    config_attention: str  # what the model config asks for
    storage: str  # dynamic | static | quantized | linear | none | legacy
    window: int | None
    capacity: int | None
    reads_from: int | None = None  # shared layers: the layer whose K/V they read

    @property
    def kind(self) -> str:
        return layer_kinds.kind_of_shape(self.attention, self.storage)


def cls_name(obj) -> str:
    return type(obj).__name__


def storage_of(layer) -> str:
    name = cls_name(layer)
    if name == "DummyLayer":
        return "none"
    if "Quantized" in name:
        return "quantized"
    if name.startswith("LinearAttention") and "And" not in name:
        return "linear"
    if "Static" in name or name in ("SlidingWindowLayer", "ChunkedSlidingLayer"):
        return "static"
    return "dynamic"


def attention_of(layer, storage: str, config_attention: str) -> str:
    if storage == "none":
        return SHARED
    if storage == "linear":
        return STATE
    if is_indexed_layer(layer):
        return INDEXED
    name = cls_name(layer)
    sliding = bool(getattr(layer, "is_sliding", False)) or "Sliding" in name or "Chunked" in name
    if not sliding:
        return "full"
    # Chunked layers use the very same class as sliding ones: only the config tells them apart.
    if name == "ChunkedSlidingLayer" or config_attention == "chunked":
        return "chunked"
    return "sliding"


def window_of(layer, attention: str, config_window: int | None) -> int | None:
    if attention not in ("sliding", "chunked"):
        return None
    w = getattr(layer, "sliding_window", None)
    if isinstance(w, int) and w > 0:
        return w
    return config_window


def reader_for(shape: LayerShape) -> str:
    """How the step read reads a layer of this shape (:mod:`.step_read`)."""
    if shape.storage == "legacy":
        return "legacy"
    if shape.storage == "none":
        return "na"
    if shape.storage == "linear":
        return "state"
    if shape.storage == "quantized":
        return "quant"
    if shape.storage == "static":
        return "static"
    if shape.attention in ("sliding", "chunked"):
        return "dynslide"
    return "dyn"


def is_hybrid_class(name: str) -> bool:
    """``LinearAttentionAnd…Layer`` (``hybrid`` layer types: Falcon-H1): K/V rows *and* a fixed-size state."""
    return name.startswith("LinearAttentionAnd")


def is_indexed_layer(layer) -> bool:
    return "Indexed" in cls_name(layer) or hasattr(layer, "indexer_keys")


def shared_sources(config) -> dict[int, int]:
    """``{consumer layer: the layer whose K/V it reads}`` for KV-sharing configs; {} otherwise."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    explicit = getattr(text, "kv_source_layers", None)  # Mistral Large 4 names its sources
    try:
        modes = list(getattr(text, "kv_sharing_modes", None) or [])
    except (ValueError, TypeError):  # an inconsistent sharing config: the cache cannot be built either
        return {}
    if not modes or "reuse" not in modes:
        return {}
    if isinstance(explicit, (list, tuple)) and len(explicit) == len(modes):
        return {i: int(explicit[i]) for i, m in enumerate(modes) if m == "reuse"}
    types = list(getattr(text, "layer_types", None) or ["full_attention"] * len(modes))
    out: dict[int, int] = {}
    for i, mode in enumerate(modes):
        if mode != "reuse":
            continue
        # Gemma 3n / Gemma 4: the last non-shared layer of the same attention type produces the K/V.
        producers = [j for j in range(i) if modes[j] != "reuse" and types[j] == types[i]]
        if producers:
            out[i] = producers[-1]
    return out


def uncroppable_state_layers(cache) -> list[int]:
    """Indices of layers whose conv/recurrent state cannot be rolled back (``crop`` would raise or lie).

    transformers crops a linear-attention layer only after ``activate_past_recording()`` and only
    while no recurrent state exists (``is_croppable``); a recurrent state has already folded every
    token in, so a shorter prefix cannot be recovered from it.
    """
    out = []
    for i, layer in enumerate(getattr(cache, "layers", None) or []):
        if not hasattr(layer, "conv_states"):
            continue
        if not (getattr(layer, "record_past", False) and getattr(layer, "is_croppable", False)):
            out.append(i)
    return out


class LayerClassifier:
    """The shapes of one model's cache layers: the config's layer types and windows, read once."""

    def __init__(self, config, n_layers: int | None = None):
        self.config = config
        self.config_types = compat.config_layer_types(config)
        self.n_layers = int(n_layers or len(self.config_types) or 0)
        self.shared_sources = shared_sources(config)
        self._windows = {t: compat.config_window(config, t) for t in {*self.config_types, "full_attention"}}

    def _layers(self, cache) -> list:
        layers = getattr(cache, "layers", None)
        if layers is not None:
            return list(layers)
        if isinstance(cache, (tuple, list)):
            return list(cache)
        raise UnsupportedCacheError(f"cannot read a cache of type {cls_name(cache)}")

    def _shape_like(self, i: int, layer, seen: dict) -> LayerShape:
        """:meth:`_shape_of`, once per distinct kind of layer in one cache: the first forward of a new
        model's cache reads them all right after that forward (80 layers: half of that read)."""
        if isinstance(layer, (tuple, list)):
            return self._shape_of(i, layer)
        ctype = self.config_types[i] if i < len(self.config_types) else "full_attention"
        key = (type(layer), ctype, getattr(layer, "is_sliding", None), getattr(layer, "sliding_window", None),
               getattr(layer, "max_cache_len", None))
        try:
            s = seen.get(key)
        except TypeError:  # an unhashable attribute: no sharing
            return self._shape_of(i, layer)
        if s is None:
            s = seen[key] = self._shape_of(i, layer)
            return s
        reads_from = self.shared_sources.get(i) if s.attention == SHARED else None
        return LayerShape(i, s.cls, s.attention, s.config_attention, s.storage, s.window, s.capacity, reads_from)

    def _shape_of(self, i: int, layer) -> LayerShape:
        ctype = self.config_types[i] if i < len(self.config_types) else "full_attention"
        config_attention = ATTENTION_OF_LAYER_TYPE.get(ctype, "full")
        if isinstance(layer, (tuple, list)):
            return LayerShape(i, "tuple", "full", config_attention, "legacy", None, None)
        storage = storage_of(layer)
        attention = attention_of(layer, storage, config_attention)
        window = window_of(layer, attention, self._windows.get(ctype))
        capacity = compat.layer_capacity(layer) if storage not in ("none", "linear") else None
        if storage == "dynamic" and attention in ("sliding", "chunked") and capacity is None:
            capacity = window
        reads_from = self.shared_sources.get(i) if attention == SHARED else None
        return LayerShape(i, cls_name(layer), attention, config_attention, storage, window, capacity, reads_from)
