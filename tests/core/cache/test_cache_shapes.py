"""The newer cache shapes against transformers itself: state, shared and indexed layers.

Like tests/core/cache/test_probe.py, expectations are read from the transformers objects (the layers'
``conv_states`` / ``recurrent_states`` / ``keys`` / ``values`` / ``indexer_keys`` and the config's
``kv_sharing_modes``), never from kvinspect's probe. One 2-turn reuse session per built-in.
"""

from __future__ import annotations

import pytest
import torch

from kvinspect.core.model.catalog import find_builtin
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings
from tests.conftest import load_cached

NEW_SHAPES = ("tiny-qwen3next", "tiny-lfm2", "tiny-falcon-h1", "tiny-gemma3n", "tiny-deepseek-v32")
#: transformers 5.x layer classes for these shapes; 4.56 (the compat run) has none of them.
LAYER_CLASS = {"tiny-qwen3next": "LinearAttentionLayer", "tiny-lfm2": "LinearAttentionLayer",
               "tiny-falcon-h1": "LinearAttentionAndFullAttentionLayer", "tiny-gemma3n": "DummyLayer",
               "tiny-deepseek-v32": "DynamicIndexedLayer"}
#: Models with state layers, or layers holding a state beside their K/V (Falcon-H1).
WITH_STATE = ("tiny-qwen3next", "tiny-lfm2", "tiny-falcon-h1")
#: Two turns: the second both reuses the first's cache and pushes tiny-gemma3n past its window (32).
#: Few new tokens: Qwen3-Next's gated delta rule runs its slow reference PyTorch code on CPU.
TURNS = ("Hi! What does a KV cache hold?", "Why so?")
NEW = 12


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if t is not None else 0


def _state_bytes(layer) -> int:
    return sum(_nbytes(t) for d in (layer.conv_states, layer.recurrent_states) for t in d.values())


def _held(layer) -> int:
    """Bytes of every tensor transformers keeps for ``layer``: state, K/V, indexer keys."""
    total = _state_bytes(layer) if hasattr(layer, "conv_states") else 0
    for name in ("keys", "values", "indexer_keys"):
        total += _nbytes(getattr(layer, name, None))
    return total


def _producers(config) -> dict[int, int]:
    """Which layer each KV-sharing layer reads, from the config alone (Gemma 3n's rule)."""
    modes = config.kv_sharing_modes
    types = config.layer_types
    first = modes.index("reuse")
    return {i: max(j for j in range(first) if types[j] == types[i]) for i in range(first, len(modes))}


_replies: dict[str, list] = {}  # name -> the default reuse run's turns, reused by the baseline test


def require_shape(name: str) -> None:
    """Skip where the installed transformers cannot build ``name``'s cache shape (4.56)."""
    import transformers
    from transformers import cache_utils

    spec = find_builtin(name).tiny
    if not hasattr(transformers, spec.config_class) or not hasattr(cache_utils, LAYER_CLASS[name]):
        pytest.skip(f"{name} needs {spec.config_class} and cache_utils.{LAYER_CLASS[name]} "
                    f"(transformers {transformers.__version__})")


def _session(name: str, policy: str = "reuse", turns=TURNS, edit=None):
    require_shape(name)
    loaded = load_cached(name)
    session = ChatSession(loaded, SessionOptions(policy=policy, settings=GenerationSettings(max_new_tokens=NEW)))
    out = []
    for i, text in enumerate(turns):
        if edit is not None and i:
            edit(session)
        out.append(session.run_turn(text))
        assert out[-1].status == "ok", out[-1].error
        yield session, out[-1]
    session.close()


@pytest.mark.parametrize("name", NEW_SHAPES)
def test_probe_matches_transformers_on_new_shapes(name):
    kinds = find_builtin(name).layer_kinds
    window = find_builtin(name).window
    sources = {}
    done = []
    for session, turn in _session(name):
        done.append(turn)
        cache = session.cache
        cfg = session.model.config
        if not sources and "shared" in kinds:
            sources = _producers(cfg)
        snap = {lay["index"]: lay for lay in turn.layers}
        conversation = turn.prompt_tokens + turn.new_tokens - 1
        assert len(snap) == len(cache.layers) == len(kinds)
        for i, layer in enumerate(cache.layers):
            got = snap[i]
            assert got["kind"] == kinds[i], (i, got["kind"])
            if kinds[i] == "state":
                # No token axis: no invented counts, the state's own bytes.
                assert got["seen"] is None and got["stored"] is None
                assert got["bytes"] == _state_bytes(layer) > 0
            elif kinds[i] == "shared":
                assert layer.keys is None and got["bytes"] == 0 and got["seen"] is None
                assert got["reads_from"] == sources[i]
            else:
                rows = layer.keys.shape[-2]
                extra = _nbytes(getattr(layer, "indexer_keys", None))
                if hasattr(layer, "conv_states"):  # a hybrid layer: its state beside the K/V
                    extra += _state_bytes(layer)
                    assert _state_bytes(layer) > 0
                assert got["bytes"] == _nbytes(layer.keys) + _nbytes(layer.values) + extra
                assert got["stored"] == rows
                if kinds[i] == "indexed":
                    assert layer.indexer_keys.shape[1] == rows == conversation and extra > 0
                if kinds[i] == "sliding":
                    assert got["seen"] == layer.cumulative_length == conversation
                    assert rows == min(conversation, window - 1)
                else:
                    assert got["seen"] == rows == conversation
        # Per-step bytes (the fast read) equal the end-of-turn walk, state layers included.
        rec = session.record
        assert list(rec.nbytes[turn.end_step - 1]) == [lay["bytes"] for lay in turn.layers]
        assert turn.cropped_from is None
        assert not [e for e in rec.events if e.kind == "layers_disagree"]
    _replies[name] = done


def test_reuse_on_recurrent_layers_matches_the_no_reuse_baseline():
    reuse = _replies.get("tiny-qwen3next") or [t for _, t in _session("tiny-qwen3next", "reuse")]
    base = [t for _, t in _session("tiny-qwen3next", "recreate")]  # a fresh cache every turn: no reuse
    assert [t.reply for t in reuse] == [t.reply for t in base] and all(t.new_tokens == NEW for t in reuse)
    assert reuse[-1].reused_tokens > 0  # the state really was carried over


def test_divergence_before_a_recurrent_state_starts_a_new_cache():
    def rewrite_last_reply(session):
        # What a template that re-renders history differently does: the prompt no longer extends the cache.
        session.history[-1]["content"] = "something else entirely"

    got = list(_session("tiny-qwen3next", "reuse", edit=rewrite_last_reply))
    session, turn = got[-1]
    kinds = [e.kind for e in session.record.events if e.turn == 1]
    assert "state_not_croppable" in kinds and "cache_recreated" in kinds
    ev = next(e for e in session.record.events if e.kind == "state_not_croppable")
    assert ev.severity == "warn" and ev.layers == [0, 1, 2]
    assert turn.reused_tokens == 0 and turn.prefill_tokens == turn.prompt_tokens
    recreated = next(e for e in session.record.events if e.kind == "cache_recreated" and e.turn == 1)
    assert recreated.data["reason"].startswith("state_not_croppable")
    # The reply is the one a fresh cache gives for the same (rewritten) prompt.
    loaded = load_cached("tiny-qwen3next")
    with torch.inference_mode():
        ids = torch.tensor([turn.prompt_ids])
        fresh = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    assert loaded.tokenizer.decode(fresh[0, ids.shape[1]:], skip_special_tokens=True) == turn.reply


@pytest.mark.parametrize("name", WITH_STATE)
def test_per_step_bytes_are_what_transformers_holds_at_each_step(name):
    """The hook's bytes, every forward, against the tensors in the cache right then (state + K/V)."""
    from kvinspect.core.cache.observer import StepObserver
    from kvinspect.core.cache.probe import CacheProbe

    require_shape(name)
    loaded = load_cached(name)
    probe = CacheProbe(loaded.model.config)
    got, held, caches = [], [], []

    def sink(sample):
        got.append([int(b) for b in sample.nbytes])
        held.append([_held(layer) for layer in sample.cache.layers])
        caches.append(sample.cache)

    ids = loaded.tokenizer("What does a KV cache hold?", return_tensors="pt")
    with StepObserver(loaded.model, probe, sink), torch.inference_mode():
        loaded.model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert len(got) == 6 and probe._state(caches[-1]).groups is not None  # the grouped read, not every layer
    assert got == held and all(sum(row) > 0 for row in got)
    state_layers = [i for i, k in enumerate(find_builtin(name).layer_kinds) if k == "state"]
    assert len({got[s][i] for s in range(len(got)) for i in state_layers[:1]}) <= 1  # a state's size is fixed
