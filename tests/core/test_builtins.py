"""Built-in models: deterministic, and their caches have the layer kinds they claim.

The claim (catalog.layer_kinds) is checked against the cache transformers itself builds from
the model config, and against what each layer actually stores after a long prefill.
"""


import pytest
import torch

from kvinspect.core.model.catalog import BUILTINS, find_builtin
from kvinspect.core.model.loading import load_model

from ..conftest import TINY, load_cached

CLASS_FOR_KIND = {"full": "DynamicLayer", "sliding": "DynamicSlidingWindowLayer", "chunked": "DynamicSlidingWindowLayer"}


@pytest.mark.parametrize("name", TINY)
def test_builtin_cache_has_claimed_layer_kinds(name):
    from transformers import DynamicCache

    lm = load_cached(name)
    b = find_builtin(name)
    cache = DynamicCache(config=lm.model.config)
    n = (b.window or 64) + 40
    ids = torch.randint(10, 90, (1, n))
    with torch.inference_mode():
        lm.model(input_ids=ids, use_cache=True, **{_kw(lm.model): cache})
    assert len(cache.layers) == len(b.layer_kinds)
    types = list(getattr(lm.model.config, "layer_types", None) or [])
    for i, (kind, layer) in enumerate(zip(b.layer_kinds, cache.layers)):
        cls = type(layer).__name__
        assert cls.startswith(CLASS_FOR_KIND[kind]) or cls == CLASS_FOR_KIND[kind], (i, cls, kind)
        rows = layer.keys.shape[-2]
        if kind == "full":
            assert rows == n
        else:
            assert rows == b.window - 1, (i, rows)
            # chunked vs sliding differ only in the config's layer_types (or the global chunk setting)
            if types:
                assert types[i] == f"{kind}_attention"
            elif kind == "chunked":
                assert lm.model.config.attention_chunk_size == b.window


def _kw(model):
    from kvinspect.core.compat import cache_kwarg

    return cache_kwarg(model)


@pytest.mark.parametrize("name", TINY)
def test_builtin_loads_deterministically(name):
    # How fast a built-in loads is measured in benchmarks/engine_start.py, never asserted here.
    a = load_model(name, device="cpu")
    b = load_model(name, device="cpu")
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    tok = a.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi there!\nok"}], add_generation_prompt=True,
                                  tokenize=False)
    enc = tok(ids, add_special_tokens=False)["input_ids"]
    assert tok.decode(enc) == ids  # exact round trip: correct reuse never sees a spurious divergence


def test_catalog_lists_all_behaviours():
    kinds = {k for b in BUILTINS if b.tiny for k in b.layer_kinds}
    assert {"full", "sliding", "chunked"} <= kinds
    shapes = {b.kinds_short for b in BUILTINS}
    assert "S,F,S,F" in shapes  # alternating
    assert any(s.count("S") == 5 for s in shapes)  # hybrid 5:1
