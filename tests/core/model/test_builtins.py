"""Built-in models: deterministic, and their caches have the layer kinds they claim.

The claim (catalog.layer_kinds) is checked against the cache transformers itself builds from
the model config, and against what each layer actually stores after a long prefill.
"""


import pytest
import torch

from kvinspect.core.model.catalog import BUILTINS, find_builtin
from kvinspect.core.model.loading import load_model
from tests.conftest import TINY, load_cached
from tests.core.cache.test_cache_shapes import NEW_SHAPES, require_shape
from tests.helpers import RESOURCES

CLASS_FOR_KIND = {"full": "DynamicLayer", "sliding": "DynamicSlidingWindowLayer", "chunked": "DynamicSlidingWindowLayer",
                  "state": "LinearAttentionLayer", "shared": "DummyLayer", "indexed": "DynamicIndexedLayer"}


@pytest.mark.parametrize("name", TINY + NEW_SHAPES)
def test_builtin_cache_has_claimed_layer_kinds(name):
    from transformers import DynamicCache

    if name in NEW_SHAPES:
        require_shape(name)
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
        hybrid = cls.startswith("LinearAttentionAnd")  # Falcon-H1: attention and a state in one layer
        assert cls.startswith(CLASS_FOR_KIND[kind]) or hybrid, (i, cls, kind)
        if kind == "state":
            assert not hasattr(layer, "keys") and any(t is not None for t in layer.conv_states.values())
            continue
        if kind == "shared":
            assert layer.keys is None  # reads another layer's K/V, stores none
            continue
        rows = layer.keys.shape[-2]
        if kind in ("full", "indexed"):
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


@pytest.mark.parametrize("name", TINY + NEW_SHAPES)
def test_builtin_loads_deterministically(name):
    if name in NEW_SHAPES:
        require_shape(name)
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
    assert {"full", "sliding", "chunked", "state", "shared", "indexed"} <= kinds
    shapes = {b.kinds_short for b in BUILTINS}
    assert "S,F,S,F" in shapes  # alternating
    assert any(s.count("S") == 5 for s in shapes)  # hybrid 5:1


def test_gemma3_270m_is_listed_with_its_kinds_and_window():
    b = find_builtin("gemma3-270m")
    assert b.kinds_short == "S×15,F×3" and b.window == 512 and b.fetch == "gemma3-270m"
    assert b.continues_text and "continues text rather than chats" in b.behaviour
    assert find_builtin("smollm2").kinds_short == "F×30"


def test_transcript_template_file_is_the_builtin_one():

    from kvinspect.core.model.templates import TRANSCRIPT_TEMPLATE

    path = RESOURCES / "templates" / "transcript.jinja"
    assert path.read_text(encoding="utf-8").rstrip("\n") == TRANSCRIPT_TEMPLATE
    assert find_builtin("gemma3-270m").chat_template == TRANSCRIPT_TEMPLATE


def test_transcript_renders_history_as_generated():
    from jinja2 import Environment

    from kvinspect.core.model.templates import TRANSCRIPT_TEMPLATE

    # transformers renders with trim_blocks/lstrip_blocks: newlines must survive them.
    t = Environment(trim_blocks=True, lstrip_blocks=True).from_string(TRANSCRIPT_TEMPLATE)
    first = t.render(bos_token="<bos>", messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert first.startswith("<bos>") and first.endswith("\n\nUser: Hi\n\nAssistant:")
    again = t.render(bos_token="<bos>", add_generation_prompt=True, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello."}, {"role": "user", "content": "Why?"}])
    assert again.startswith(first + " Hello.\n\nUser: Why?")  # the cached prefix plus the reply, unchanged
