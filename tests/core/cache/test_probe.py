"""The probe against transformers itself: every number kvinspect shows must be what the cache holds.

Expectations are read straight from the transformers objects (``keys.shape``, the layer's own
counters and ``get_max_length``/``get_max_cache_shape``, non-zero rows of static buffers, storage
sizes) or derived from token arithmetic, never from kvinspect's probe. A session keeps one
cache across a 3-turn script; after each turn the test holds ``session.cache`` and compares.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, cache_utils

from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.observer import StepObserver
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.compat import cache_from_generate_output
from kvinspect.core.errors import ModelSpecError, UnsupportedCacheError
from kvinspect.core.model.catalog import builtin_names, find_builtin
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.policies import check_cache_available
from kvinspect.core.session.script import GenerationSettings
from tests.conftest import TINY, load_cached
from tests.helpers import loaded_model

#: Short user turns: after turn 2 every tiny model's sliding/chunked layers are past their window,
#: and each later prefill stays below the smallest window (48), which keeps the 4.56 hybrid static
#: cache failure deterministic (see test_static_cache_matches_transformers).
TURNS = ("Hi! What does a KV cache hold?", "Why so?", "And the memory?")
NEW = 16

#: 4.56/4.57 build static sliding layers as SlidingWindowLayer/ChunkedSlidingLayer; 5.x as StaticSlidingWindowLayer.
LEGACY_STATIC_SLIDING = not hasattr(cache_utils, "StaticSlidingWindowLayer")
HAS_FP8 = hasattr(cache_utils, "Fp8QuantizedLayer")



def _kinds(name: str) -> tuple[str, ...]:
    return find_builtin(name).layer_kinds


def _is_static(layer) -> bool:
    n = type(layer).__name__
    return "Static" in n or n in ("SlidingWindowLayer", "ChunkedSlidingLayer")


def tf_facts(layer) -> dict:
    """seen / stored / capacity as transformers' own objects state them."""
    keys = layer.keys
    rows = int(keys.shape[-2]) if keys is not None and keys.dim() == 4 else 0
    seen = getattr(layer, "cumulative_length_int", None)
    if seen is None:
        seen = layer.get_seq_length()  # int, or a 0-d tensor on static layers
    cap_fn = getattr(layer, "get_max_length", None) or layer.get_max_cache_shape
    cap = int(cap_fn())
    if _is_static(layer) and rows:
        # A static buffer is allocated whole; rows never written are exactly zero.
        stored = int((keys[0, 0] != 0).any(dim=-1).sum())
    else:
        stored = rows
    return {"seen": int(seen), "stored": stored, "capacity": None if cap < 0 else cap}


def _independent_prompt_len(tok, history: list[dict], user: str) -> int:
    text = tok.apply_chat_template(history + [{"role": "user", "content": user}], add_generation_prompt=True,
                                   tokenize=False)
    return len(tok(text, add_special_tokens=False)["input_ids"])


_sessions: dict = {}  # name -> (session, turns) of the default 3-turn run, reused by the per-step test


def _run(loaded, cache_impl="dynamic", turns=TURNS, max_cache_len=None, check=None):
    opts = SessionOptions(cache_impl=cache_impl, settings=GenerationSettings(max_new_tokens=NEW),
                          max_cache_len=max_cache_len)
    session = ChatSession(loaded, opts)
    out = []
    history: list[dict] = []
    try:
        for text in turns:
            expected_prompt = _independent_prompt_len(loaded.tokenizer, history, text)
            turn = session.run_turn(text)
            out.append(turn)
            if check is not None:
                check(session, turn, expected_prompt)
            if turn.status == "ok":
                history += [{"role": "user", "content": text}, {"role": "assistant", "content": turn.reply}]
    finally:
        session.close()
    return session, out


@pytest.mark.parametrize("name", TINY + ("smollm2",))
def test_probe_matches_transformers_after_each_turn(request, name):
    loaded = loaded_model(request, name)
    kinds = _kinds(name)
    window = find_builtin(name).window
    seen_before = [0]
    cache_ref = []

    def check(session, turn, expected_prompt):
        assert turn.status == "ok", turn.error
        cache = session.cache
        cache_ref.append(cache)
        assert turn.prompt_tokens == expected_prompt
        conversation = expected_prompt + turn.new_tokens - 1  # the last sampled token is never fed back
        assert turn.cropped_from is None  # the tokenizers round-trip: nothing to crop in a correct run
        snap = {lay["index"]: lay for lay in turn.layers}
        assert len(snap) == len(cache.layers) == len(kinds)
        for i, layer in enumerate(cache.layers):
            tf = tf_facts(layer)
            got = snap[i]
            assert (got["seen"], got["stored"], got["capacity"]) == (tf["seen"], tf["stored"], tf["capacity"]), i
            assert tf["seen"] == conversation, (i, tf, conversation)
            assert got["kind"] == kinds[i], (i, got["kind"])
            assert got["device"] == str(layer.keys.device) and got["dtype"] == str(layer.keys.dtype).split(".")[-1]
            assert got["bytes"] == 2 * layer.keys.numel() * layer.keys.element_size()
            if kinds[i] == "full":
                assert tf["stored"] == tf["seen"] and got["window"] is None and got["capacity"] is None
            else:
                # Dynamic sliding/chunked layers keep window - 1 rows; seen keeps growing.
                assert tf["stored"] == min(tf["seen"], window - 1), (i, tf)
                assert got["window"] == window and got["capacity"] == window
        assert all(lay["seen"] > seen_before[0] for lay in turn.layers)
        seen_before[0] = conversation

    session, turns = _run(loaded, check=check)
    _sessions[name] = session, turns
    # One cache object across all turns, and the snapshots name it.
    assert all(c is cache_ref[0] for c in cache_ref)
    assert len({t.cache_id for t in turns}) == 1 and turns[0].cache_id > 0
    if window:
        sliding = [i for i, k in enumerate(kinds) if k != "full"]
        final = turns[-1].layers
        assert all(final[i]["seen"] > window for i in sliding), "the script must push every window"
        assert all(final[i]["stored"] == window - 1 for i in sliding)


@pytest.mark.parametrize("name", TINY + ("smollm2",))
def test_per_step_series_follow_the_query_lengths(request, name):
    """Every forward adds exactly its query length to seen; full layers store it all, sliding ones cap."""
    loaded = loaded_model(request, name)
    kinds = _kinds(name)
    window = find_builtin(name).window
    session, turns = _sessions.get(name) or _run(loaded)  # the same run as above when it already happened
    rec = session.record
    q, seen, stored, cid = rec.q_len, rec.seen, rec.stored, rec.cache_id
    assert rec.n_steps == sum(t.new_tokens for t in turns)  # one forward per generated token
    assert (cid == turns[0].cache_id).all()
    assert (seen[0] == q[0]).all() and q[0] == turns[0].prompt_tokens
    for k in range(1, rec.n_steps):
        assert (seen[k] - seen[k - 1] == q[k]).all(), k
    for i, kind in enumerate(kinds):
        if kind == "full":
            assert (stored[:, i] == seen[:, i]).all()
            assert (stored[1:, i] - stored[:-1, i] == q[1:]).all()
        else:
            assert (stored[:, i] == (seen[:, i]).clip(max=window - 1)).all(), i
    for t in turns:
        # The first forward of each turn is the prefill of the uncached suffix, then one token per step.
        assert q[t.first_step] == t.prefill_tokens == t.prompt_tokens - t.reused_tokens
        assert (q[t.first_step + 1 : t.end_step] == 1).all()
    # Per-step bytes equal the end-of-turn snapshot's logical bytes (dynamic layers: rows x bytes per row).
    for t in turns:
        assert list(rec.nbytes[t.end_step - 1]) == [lay["bytes"] for lay in t.layers]


@pytest.mark.parametrize("name", TINY + ("smollm2",))
def test_per_step_read_takes_one_layer_per_group_and_the_layers_agree(request, name):
    """The series above came from one layer per same-kind group; the snapshot found every layer agreeing."""
    loaded = loaded_model(request, name)
    session, turns = _sessions.get(name) or _run(loaded)
    groups = session.probe._state(session.cache).groups
    kinds = _kinds(name)
    assert groups is not None and len(groups.reps) == len(set(kinds)) < len(kinds)
    assert sorted(i for m in groups.members for i in m) == list(range(len(kinds)))
    assert all(len({kinds[i] for i in m}) == 1 for m in groups.members)
    assert not [e for e in session.record.events if e.kind == "layers_disagree"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma2"])
def test_static_cache_matches_transformers(name):
    loaded = load_cached(name)
    kinds = _kinds(name)
    window = find_builtin(name).window
    max_len = 256
    legacy_hybrid = LEGACY_STATIC_SLIDING and window is not None

    def check(session, turn, expected_prompt):
        if legacy_hybrid and turn.index == 1:
            # transformers 4.56/4.57: SlidingWindowLayer.update assumes one token per call once it is full,
            # so the second turn's multi-token prefill breaks inside transformers (documented in docs/compat.md).
            assert turn.status == "failed" and "RuntimeError" in turn.error, turn.error
            return
        assert turn.status == "ok", turn.error
        cache = session.cache
        assert type(cache).__name__ == "StaticCache"
        conversation = expected_prompt + turn.new_tokens - 1
        for i, layer in enumerate(cache.layers):
            tf = tf_facts(layer)
            got = turn.layers[i]
            assert (got["seen"], got["stored"], got["capacity"]) == (tf["seen"], tf["stored"], tf["capacity"]), i
            assert tf["seen"] == conversation
            # The buffer is allocated whole on the first update: bytes = capacity rows.
            assert got["bytes"] == 2 * layer.keys.numel() * layer.keys.element_size()
            assert layer.keys.shape[-2] == tf["capacity"]
            if kinds[i] == "full":
                assert got["kind"] == "static-full" and tf["capacity"] == max_len and tf["stored"] == conversation
            else:
                # Static sliding layers hold exactly `window` rows (dynamic ones window - 1).
                assert got["kind"] == f"static-{kinds[i]}" and tf["capacity"] == window
                assert tf["stored"] == min(conversation, window)

    session, turns = _run(loaded, cache_impl="static", max_cache_len=max_len, check=check)
    if legacy_hybrid:
        # The session dropped the broken cache; the next turn starts a fresh one and works.
        assert [t.status for t in turns] == ["ok", "failed", "ok"]
        assert turns[2].cache_id != turns[0].cache_id
    else:
        assert [t.status for t in turns] == ["ok"] * 3
        assert len({t.cache_id for t in turns}) == 1
        assert turns[1].reused_tokens > 0


def test_sliding_layer_after_long_prefill_holds_much_more_than_it_shows():
    """transformers-cache.md §7: the window is a view into the whole prefill's buffer until the next step."""
    loaded = load_cached("tiny-mistral")
    model = loaded.model
    from kvinspect.core.compat import cache_kwarg

    kw = cache_kwarg(model)
    cache = DynamicCache(config=model.config)
    n = 2000
    with torch.inference_mode():
        model(input_ids=torch.randint(10, 90, (1, n)), use_cache=True, **{kw: cache})
    probe = CacheProbe(model.config)
    snap = probe.snapshot(cache)
    layer = cache.layers[0]
    k, v = layer.keys, layer.values
    window = model.config.sliding_window
    row = k.shape[0] * k.shape[1] * k.shape[3] * k.element_size()
    assert k.shape[-2] == window - 1
    assert snap.layers[0].bytes == 2 * (window - 1) * row
    held = k.untyped_storage().nbytes() + v.untyped_storage().nbytes()
    assert snap.layers[0].held_bytes == held == 2 * n * row  # the whole prefill stays pinned
    assert snap.layers[0].held_bytes > 20 * snap.layers[0].bytes
    assert snap.held_bytes > snap.bytes
    with torch.inference_mode():
        model(input_ids=torch.randint(10, 90, (1, 1)), use_cache=True, **{kw: cache})
    snap = probe.snapshot(cache)
    k, v = cache.layers[0].keys, cache.layers[0].values
    assert snap.layers[0].held_bytes == k.untyped_storage().nbytes() + v.untyped_storage().nbytes()
    assert snap.layers[0].held_bytes <= 2 * window * row  # released after the next decode step


def test_cropped_full_layer_keeps_its_old_storage():
    loaded = load_cached("tiny-llama")
    model = loaded.model
    from kvinspect.core.compat import cache_kwarg, crop

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.randint(10, 90, (1, 1000)), use_cache=True, **{cache_kwarg(model): cache})
    crop(cache, 100)
    snap = CacheProbe(model.config).snapshot(cache)
    k = cache.layers[0].keys
    assert k.shape[-2] == 100 and snap.layers[0].stored == 100 and snap.layers[0].seen == 100
    assert snap.layers[0].bytes == 2 * k.numel() * k.element_size()
    assert snap.layers[0].held_bytes == 2 * k.untyped_storage().nbytes() > 5 * snap.layers[0].bytes


def test_cache_without_config_is_full_where_the_config_slides():
    loaded = load_cached("tiny-mistral")
    model = loaded.model
    from kvinspect.core.compat import cache_kwarg

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.randint(10, 90, (1, 100)), use_cache=True, **{cache_kwarg(model): cache})
    snap = CacheProbe(model.config).snapshot(cache)
    for lay, layer in zip(snap.layers, cache.layers):
        assert layer.keys.shape[-2] == 100
        assert (lay.kind, lay.attention, lay.config_attention) == ("full", "full", "sliding")
        assert lay.stored == lay.seen == 100


def test_lazy_cache_reads_as_empty():
    loaded = load_cached("tiny-gemma3")
    cache = DynamicCache(config=loaded.model.config)
    probe = CacheProbe(loaded.model.config)
    seen, stored, dev, nbytes = probe.lengths(cache)
    assert (seen == 0).all() and (stored == 0).all() and (dev == -1).all() and (nbytes == 0).all()
    snap = probe.snapshot(cache)
    assert [lay.kind for lay in snap.layers] == list(_kinds("tiny-gemma3"))
    assert snap.bytes == 0 and snap.held_bytes == 0


def test_cache_ids_are_stable_per_object():
    loaded = load_cached("tiny-llama")
    probe = CacheProbe(loaded.model.config)
    a, b = DynamicCache(), DynamicCache()
    ia, first = probe.identify(a)
    assert first and ia > 0
    assert probe.identify(a) == (ia, False)
    ib, first_b = probe.identify(b)
    assert first_b and ib != ia
    assert probe.identify(None) == (0, False)


def test_encoder_decoder_cache_is_refused_in_one_line():
    from transformers import EncoderDecoderCache

    loaded = load_cached("tiny-llama")
    probe = CacheProbe(loaded.model.config)
    with pytest.raises(UnsupportedCacheError) as info:
        probe.identify(EncoderDecoderCache(DynamicCache(), DynamicCache()))
    msg = str(info.value)
    assert "encoder-decoder" in msg and "\n" not in msg


@pytest.mark.skipif(not HAS_FP8, reason="fp8 quantized layers exist from transformers 5.x")
def test_quantized_fp8_cache_matches_transformers():
    loaded = load_cached("tiny-llama")
    checks = []

    def check(session, turn, expected_prompt):
        assert turn.status == "ok", turn.error
        cache = session.cache
        for i, layer in enumerate(cache.layers):
            assert type(layer).__name__ == "Fp8QuantizedLayer"
            qk, qv = layer._quantized_keys[0], layer._quantized_values[0]
            conversation = expected_prompt + turn.new_tokens - 1
            assert layer.cumulative_length == int(layer.get_seq_length()) == conversation
            rows = qk.shape[-2] + (layer.keys.shape[-2] if layer.keys.dim() == 4 else 0)
            got = turn.layers[i]
            assert got["kind"] == "quantized" and got["seen"] == got["stored"] == rows == conversation
            payload = sum(t.numel() * t.element_size() for t in (qk, qv, layer.keys, layer.values))
            scales = sum(t.numel() * t.element_size() for t in (layer._quantized_keys[1], layer._quantized_values[1]))
            assert got["bytes"] == payload + scales
            assert got["dtype"] == "float8_e4m3fn"
            # The per-step series counts the quantized payload too (not the empty residual).
            assert session.record.nbytes[turn.end_step - 1, i] == payload
        checks.append(turn.index)

    _, turns = _run(loaded, cache_impl="quantized", check=check)
    assert checks == [0, 1, 2] and turns[1].reused_tokens > 0


def test_quantized_needs_a_backend_and_full_attention():
    with pytest.raises(UnsupportedCacheError) as info:
        check_cache_available(load_cached("tiny-gemma2"), "quantized")
    assert "full-attention" in str(info.value) and "\n" not in str(info.value)
    if not HAS_FP8:
        import importlib.util

        if importlib.util.find_spec("optimum") is None and importlib.util.find_spec("hqq") is None:
            with pytest.raises(UnsupportedCacheError, match="backend"):
                check_cache_available(load_cached("tiny-llama"), "quantized")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_offloaded_without_cuda_says_so_in_one_line(tmp_path, capsys):
    with pytest.raises(UnsupportedCacheError) as info:
        check_cache_available(load_cached("tiny-llama"), "offloaded")
    msg = str(info.value)
    assert "CUDA" in msg and "cpu" in msg and "\n" not in msg
    from kvinspect.cli import main

    script = tmp_path / "s.json"
    script.write_text('{"turns": ["hi"], "max_new_tokens": 2}')
    rc = main(["run", "--model", "tiny-llama", "--script", str(script), "--out", str(tmp_path / "o"),
               "--cache", "offloaded", "--device", "cpu", "-q"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("kvinspect:")]
    assert rc == 2 and len(err) == 1 and "CUDA" in err[0], err


# -- observer ---------------------------------------------------------------------------------------

def test_observer_sees_every_forward_of_a_cache_generate_built_itself():
    loaded = load_cached("tiny-gemma3")
    model, tok = loaded.model, loaded.tokenizer
    probe = CacheProbe(model.config)
    samples = []
    ids = torch.tensor([tok("hello there, general kenobi")["input_ids"]])
    with StepObserver(model, probe, samples.append, MemorySampler("cpu")) as obs:
        with torch.inference_mode():
            out1 = model.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
            out2 = model.generate(ids, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    assert not obs.attached
    assert len(samples) == 10 and obs.calls == 10
    first, second = samples[:6], samples[6:]
    assert first[0].new_cache and not any(s.new_cache for s in first[1:])
    assert second[0].new_cache and second[0].cache_id != first[0].cache_id  # a different object: noticed
    assert len({s.cache_id for s in first}) == 1 and len({s.cache_id for s in second}) == 1
    assert [s.q_len for s in first] == [ids.shape[1]] + [1] * 5
    # The cache generate() returned is the one the hook saw; its lengths match the last sample.
    from kvinspect.core.compat import cache_from_generate_output

    cache = cache_from_generate_output(out1)
    assert probe.known_id(cache) == first[0].cache_id
    last = first[-1]
    for i, layer in enumerate(cache.layers):
        assert last.seen[i] == tf_facts(layer)["seen"] and last.stored[i] == tf_facts(layer)["stored"]
    assert all(s.rss > 0 for s in samples) and all(s.accel_allocated == 0 for s in samples)
    assert cache_from_generate_output(out2) is not cache
    # Detached: further forwards are not seen.
    with torch.inference_mode():
        model(input_ids=ids)
    assert len(samples) == 10


def test_memory_sampler_on_cpu_never_raises():
    m = MemorySampler("cpu")
    s = m.sample()
    assert s.rss > 0 and s.accel_allocated == 0 and s.accel_reserved == 0
    m.reset_peak()
    assert m.peak() == 0 and m.rss_now() > 0
    assert m.describe()["kind"] == "cpu"


@pytest.mark.parametrize("name,impl", [(n, None) for n in builtin_names() if n.startswith("tiny-")] + [("tiny-gemma3", "static")])
def test_shapes_worked_out_once_per_kind_of_layer_are_each_layers_own(name, impl):
    try:
        lm = load_cached(name)
    except ModelSpecError as exc:  # a built-in this transformers cannot build (4.56: the 5.x-only shapes)
        pytest.skip(str(exc))
    ids = torch.tensor([list(range(5, 25))])
    extra = {"cache_implementation": impl} if impl else {}
    with torch.inference_mode():
        out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                                pad_token_id=0, return_dict_in_generate=True, **extra)
    cache = cache_from_generate_output(out)
    probe = CacheProbe(lm.model.config)
    assert probe.shapes(cache) == [probe._shape_of(i, lay) for i, lay in enumerate(probe._layers(cache))]
