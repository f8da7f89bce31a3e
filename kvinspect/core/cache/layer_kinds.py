"""Cache layers without a plain growing K/V pair: recurrent/conv state, KV-shared and indexed layers.

transformers 5.x builds them from ``config.layer_types`` (``cache_utils.DYNAMIC_LAYER_TYPE_MAPPING``):

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

Names only, no isinstance: the classes are absent on 4.56, and most are not exported.
"""

from __future__ import annotations

STATE, SHARED, INDEXED = "state", "shared", "indexed"

#: ``config.layer_types`` values → the kind users see (the rest: probe.ATTENTION_OF_LAYER_TYPE).
KIND_OF_LAYER_TYPE = {
    "linear_attention": STATE,
    "conv": STATE,
    "indexed_attention": INDEXED,
    "dummy": SHARED,
}


def _name(layer) -> str:
    return type(layer).__name__


def is_state_layer(layer) -> bool:
    """Only a state (no K/V): ``LinearAttentionLayer``, not the ``LinearAttentionAnd…`` hybrids."""
    n = _name(layer)
    return n.startswith("LinearAttention") and "And" not in n


def is_hybrid_class(name: str) -> bool:
    """``LinearAttentionAnd…Layer`` (``hybrid`` layer types: Falcon-H1): K/V rows *and* a fixed-size state."""
    return name.startswith("LinearAttentionAnd")


def is_shared_layer(layer) -> bool:
    return _name(layer) == "DummyLayer"


def is_indexed_layer(layer) -> bool:
    return "Indexed" in _name(layer) or hasattr(layer, "indexer_keys")


def state_tensors(layer) -> list:
    """The conv and recurrent state tensors a (hybrid) linear-attention layer holds now."""
    out: list = []
    for attr in ("conv_states", "recurrent_states"):
        states = getattr(layer, attr, None)
        if isinstance(states, dict):
            out.extend(t for t in states.values() if t is not None and hasattr(t, "numel"))
    return out


def state_read(layer) -> tuple[object | None, int]:
    """``(device, bytes)`` of a state layer, from shapes only (no sync); device None before any state."""
    device = None
    total = 0
    for t in state_tensors(layer):
        if device is None:
            device = t.device
        total += t.numel() * t.element_size()
    return device, total


def row_bytes(layer, keys) -> int:
    """Bytes one stored token costs: its key and value rows, plus its indexer-key row on indexed layers.

    Values are measured on their own: MLA layers (DeepSeek V3.2) keep values narrower than keys.
    """
    def per_row(t, token_dim: int) -> int:
        if t is None or not hasattr(t, "shape") or t.dim() <= token_dim or t.shape[token_dim] == 0:
            return 0
        return t.numel() // t.shape[token_dim] * t.element_size()

    total = per_row(keys, 2)
    values = getattr(layer, "values", None)
    total += per_row(values, 2) if values is not None else per_row(keys, 2)
    total += per_row(getattr(layer, "indexer_keys", None), 1)
    return total


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
