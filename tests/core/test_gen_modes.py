"""Every way generate() is run, observed: correct loops are silent and every figure is the cache's own.

The mode matrix: greedy, sampling, beam search (with and without ``num_return_sequences``), a
left-padded batch, assisted decoding, prompt lookup, a hand-written ``model()`` loop and
``generate()`` in a thread with a ``TextIteratorStreamer``; on a full, a sliding and a hybrid
built-in; with a dynamic and a static cache. Each case runs twice, unobserved and inside
``kvinspect.observe``, and must give the same tokens, no warning or error event, per-layer
seen/stored at each turn's end equal to the cache object's own attributes read right after the
call, and reuse counts equal to what the next call really skipped (the cache's length before it).
Where transformers refuses a pair, the case says so and skips.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading

import pytest
import torch
import transformers
from transformers import DynamicCache, StaticCache, TextIteratorStreamer

import kvinspect
from kvinspect.core import compat
from kvinspect.core.model.loading import load_model

from ..conftest import load_cached

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

MODELS = ("tiny-llama", "tiny-mistral", "tiny-gemma3")  # full, sliding, hybrid
MODES = ("greedy", "sample", "beam", "beam_return_2", "batch", "assisted", "prompt_lookup", "manual", "streamer")
NEW = 5
TURNS = ("Hi there, who are you?", "Tell me more.")
FIVE = int(transformers.__version__.split(".")[0]) >= 5


def _draft():
    # A second model with the same tokenizer (every built-in shares one); a new instance, not the cached one.
    global _draft_model
    if _draft_model is None:
        _draft_model = load_model("tiny-llama", device="cpu").model
    return _draft_model


_draft_model = None


def new_cache(model, kind: str):
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=512)
    return DynamicCache(config=model.config)


def cache_rows(cache) -> list[tuple[int, int] | None]:
    """Per layer (seen, stored) from the cache object's own attributes (None: no token axis)."""
    out: list[tuple[int, int] | None] = []
    for lay in cache.layers:
        keys = getattr(lay, "keys", None)
        if keys is None or not hasattr(keys, "dim") or keys.dim() != 4:
            out.append(None)
            continue
        # 5.x: Static*Layer; 4.56: StaticLayer, SlidingWindowLayer, ChunkedSlidingLayer (preallocated rows)
        static = "Dynamic" not in type(lay).__name__ and hasattr(lay, "max_cache_len")
        # The int counter first: 5.x static sliding layers stop advancing the tensor one once they are full.
        seen = next((v for a in ("cumulative_length_int", "cumulative_length")
                     if (v := getattr(lay, a, None)) is not None and not callable(v)), None)
        if seen is None:
            seen = lay.get_seq_length() if static else keys.shape[-2]
        seen = int(seen)
        out.append((seen, min(seen, int(keys.shape[-2])) if static else int(keys.shape[-2])))
    return out


def ids_of(tok, messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                   return_dict=True)["input_ids"]


def run_mode(lm, mode: str, kind: str, seed: int = 0):
    """Two turns of ``mode``; returns per turn (tokens, cache rows after the call, cache length before it)."""
    model, tok = lm.model, lm.tokenizer
    torch.manual_seed(seed)
    out = []
    if mode == "batch":
        tok.padding_side = "left"
        for first in (("Hi.", "A much longer opening message here."), ("And then?", "What comes next, then?")):
            texts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                             tokenize=False) for t in first]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False, return_token_type_ids=False)
            cache = new_cache(model, kind)  # a new batch: its own cache (the padding differs)
            seqs = model.generate(**enc, past_key_values=cache, do_sample=False, max_new_tokens=NEW)
            out.append((seqs.tolist(), cache_rows(cache), 0))
        return out
    if mode == "manual":
        cache, messages, fed = new_cache(model, kind), [], []
        with torch.no_grad():
            for text in TURNS:
                messages.append({"role": "user", "content": text})
                ids = ids_of(tok, messages)
                before = int(cache.get_seq_length())
                nxt, new = ids[:, len(fed):], []
                for _ in range(NEW):
                    logits = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
                    nxt = logits[:, -1:].argmax(-1)
                    new.append(int(nxt))
                fed = ids[0].tolist() + new[:-1]
                out.append((new, cache_rows(cache), before))
                messages.append({"role": "assistant", "content": tok.decode(new)})
        # The next turn's prompt must extend what the cache holds: the loop feeds only the new part.
        return out
    cache, messages = new_cache(model, kind), []
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        ids = ids_of(tok, messages)
        kw: dict = {"do_sample": mode == "sample", "max_new_tokens": NEW}
        if mode.startswith("beam"):
            kw["num_beams"] = 3
            if mode == "beam_return_2":
                kw["num_return_sequences"] = 2
        if mode == "assisted":
            kw["assistant_model"] = _draft()
        if mode == "prompt_lookup":
            kw["prompt_lookup_num_tokens"] = 3
        if mode in ("assisted", "prompt_lookup") and compat.assisted_refeeds_prefix():
            cache = new_cache(model, kind)  # this transformers re-feeds a filled cache's prefix: the workaround
        before = int(cache.get_seq_length())
        if mode == "streamer":
            streamer = TextIteratorStreamer(tok, skip_prompt=True)
            box = {}

            def call(ids=ids, cache=cache, streamer=streamer, box=box):
                try:
                    box["seqs"] = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                                 past_key_values=cache, streamer=streamer, **kw)
                except Exception as exc:  # noqa: BLE001 - raised again on the test's thread
                    box["error"] = exc
                    streamer.end()  # the reading loop would wait for ever

            th = threading.Thread(target=call)
            th.start()
            "".join(streamer)
            th.join()
            if "error" in box:
                raise box["error"]
            seqs = box["seqs"]
        else:
            seqs = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, **kw)
        out.append((seqs.tolist(), cache_rows(cache), before))
        messages.append({"role": "assistant", "content": tok.decode(seqs[0, ids.shape[1]:])})
    return out


def _refused(lm, mode: str, kind: str):
    """Run unobserved; a pair transformers refuses skips with its own words."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return run_mode(lm, mode, kind)
    except (ValueError, RuntimeError, TypeError, NotImplementedError, IndexError, AttributeError) as exc:
        pytest.skip(f"transformers {transformers.__version__} refuses {mode} with a {kind} cache: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")


def _load(spec: str):
    try:
        return load_cached(spec)
    except Exception as exc:  # noqa: BLE001 - a built-in this transformers cannot build
        pytest.skip(f"{spec} cannot be built on transformers {transformers.__version__}: {exc}")


def check_case(lm, mode: str, kind: str):
    plain = _refused(lm, mode, kind)
    with kvinspect.observe(lm.model, lm.tokenizer) as rec:
        observed = run_mode(lm, mode, kind)
    # The user's output is the same with and without observation.
    assert [o[0] for o in observed] == [p[0] for p in plain]
    assert rec.errors == []
    assert rec.problems == [], [(e.kind, e.message) for e in rec.events if e.is_problem]
    turns = rec.turns
    assert len(turns) == len(observed), [t.user for t in turns]
    for t, (_tokens, rows, before) in zip(turns, observed):
        assert t.status == "ok"
        got = [(lay["seen"], lay["stored"]) if lay["seen"] is not None else None for lay in t.layers]
        assert got == rows, (t.index, t.user)
        assert t.reused_tokens == before, (t.index, t.user)  # what the call really skipped
        assert all(c["status"] == "pass" for c in t.checklist if c["key"] in ("cache_object", "length")), t.checklist
    return rec


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("spec", MODELS)
def test_mode_matrix(spec, mode, kind):
    lm = _load(spec)
    rec = check_case(lm, mode, kind)
    if mode.startswith("beam"):
        assert all(t.settings.get("rows_reordered") and t.settings.get("cache_rows") == 3 for t in rec.turns)
        assert all(t.settings.get("returned_rows") == (2 if mode == "beam_return_2" else 1) for t in rec.turns)
    if mode == "batch":
        assert all(t.settings.get("batch") == 2 and t.settings.get("pad_tokens") for t in rec.turns)
    if mode in ("assisted", "prompt_lookup"):
        for t in rec.turns:
            d = t.settings["draft"]
            assert d["accepted"] + d["rejected"] == d["proposed"] and d["label"] == "draft rejected"
            assert sum(n for _step, n in d["crops"]) == d["rejected"]


@pytest.mark.smollm2
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["greedy", "sample", "beam_return_2", "batch", "prompt_lookup", "manual", "streamer"])
def test_main_modes_on_smollm2(smollm2, mode):
    check_case(smollm2, mode, "dynamic")


# -- what the matrix cannot show on its own --------------------------------------------------------

def test_a_cache_reset_right_after_generate_keeps_the_turn_as_the_call_left_it():
    lm = load_cached("tiny-mistral")
    model, tok = lm.model, lm.tokenizer
    cache = StaticCache(config=model.config, max_cache_len=128)
    rows = []
    with kvinspect.observe(model, tok) as rec:
        for text in TURNS:  # two conversations, one static cache reset between them
            ids = ids_of(tok, [{"role": "user", "content": text}])
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                           do_sample=False, max_new_tokens=NEW)
            rows.append(cache_rows(cache))
            cache.reset()
    assert [[(lay["seen"], lay["stored"]) for lay in t.layers] for t in rec.turns] == rows
    # Closed at the call's return, before reset(): not patched up afterwards from the last forward.
    assert not any(t.settings.get("edited_after_return") for t in rec.turns)
    assert rec.problems == []


def test_a_call_ended_by_a_stop_string_then_cropped_reads_what_the_call_left():
    lm = load_cached("tiny-llama")
    model, tok = lm.model, lm.tokenizer
    cache = DynamicCache(config=model.config)
    ids = ids_of(tok, [{"role": "user", "content": TURNS[0]}])
    with kvinspect.observe(model, tok) as rec:
        seqs = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                              do_sample=False, max_new_tokens=40, stop_strings=[" "], tokenizer=tok)
        rows = cache_rows(cache)
        cache.crop(-(cache.get_seq_length() - 3))
    assert seqs.shape[1] - ids.shape[1] < 40  # the stop string ended it early: its return was not watched
    t = rec.turns[0]
    assert [(lay["seen"], lay["stored"]) for lay in t.layers] == rows
    assert t.settings.get("edited_after_return") is True


@pytest.mark.skipif(not FIVE, reason="transformers 4.x slices the cached prefix off an assisted call")
def test_the_prompt_lookup_re_feed_is_named_as_transformers_own():
    lm = load_cached("tiny-mistral")
    model, tok = lm.model, lm.tokenizer
    cache, messages = DynamicCache(config=model.config), []
    with kvinspect.observe(model, tok) as rec:
        for text in TURNS:
            messages.append({"role": "user", "content": text})
            ids = ids_of(tok, messages)
            seqs = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                  do_sample=False, max_new_tokens=NEW, prompt_lookup_num_tokens=3)
            messages.append({"role": "assistant", "content": tok.decode(seqs[0, ids.shape[1]:])})
    # The cache really holds the first conversation twice: transformers fed it again.
    assert cache.get_seq_length() > seqs.shape[1] - 1
    ev = next(e for e in rec.events if e.kind == "duplicate_context")
    assert ev.data["origin"] == "library" and transformers.__version__ in ev.message
    assert "new cache" in ev.advice and ev.turn == 1
    assert rec.turns[1].reused_tokens == 0
    assert all(e.data["origin"] == "user_code" for e in rec.events if e.kind == "window_reached")


def test_the_turn_s_own_cache_kept_from_the_output_is_not_memory_retained():
    lm = load_cached("tiny-llama")
    model, tok = lm.model, lm.tokenizer
    cache, messages = None, []
    with kvinspect.observe(model, tok) as rec:
        for text in TURNS:
            messages.append({"role": "user", "content": text})
            ids = ids_of(tok, messages)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                 do_sample=False, max_new_tokens=NEW, return_dict_in_generate=True)
            cache = out.past_key_values  # kept to continue the conversation
            messages.append({"role": "assistant", "content": tok.decode(out.sequences[0, ids.shape[1]:])})
    assert rec.problems == [] and not [e for e in rec.events if e.kind == "memory_retained"]
    assert rec.turns[1].reused_tokens == rec.turns[0].prompt_tokens + NEW - 1


@pytest.mark.parametrize("mode", ["greedy", "prompt_lookup"])
def test_no_forward_runs_traced_and_tracing_ends_with_the_call(mode):
    """The exit watch switches tracing on only between a forward and the next, and off when the call returns."""
    lm = load_cached("tiny-llama")
    model, tok = lm.model, lm.tokenizer
    during = []
    handle = model.model.layers[0].register_forward_pre_hook(lambda *_: during.append(sys.gettrace()))
    try:
        with kvinspect.observe(model, tok) as rec:
            run_mode(lm, mode, "dynamic")
            after_calls = sys.gettrace()
    finally:
        handle.remove()
    assert during and set(during) == {None}
    assert after_calls is None and sys.gettrace() is None
    assert len(rec.turns) == 2
