"""The kinds of cache layers users see, beyond full / sliding / chunked attention."""

from __future__ import annotations

STATE, SHARED, INDEXED = "state", "shared", "indexed"

#: ``config.layer_types`` values → the kind users see (the rest: layer_shapes.ATTENTION_OF_LAYER_TYPE).
KIND_OF_LAYER_TYPE = {
    "linear_attention": STATE,
    "conv": STATE,
    "indexed_attention": INDEXED,
    "dummy": SHARED,
}
