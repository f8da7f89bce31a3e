"""Each reuse policy reproduces its mistake and the detectors name exactly that mistake.

Run on the real SmolLM2 and on the built-in windowed models. For every policy the test states
the complete set of events it must produce per turn (informational window/chunk events aside,
which depend only on the model's windows and are checked separately), and recomputes the
numbers behind each event from token counts: prompt lengths, tokens generated, windows.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kvinspect.core.detect.events import (
    CACHE_DISABLED,
    CACHE_FED_WITHOUT_USE_CACHE,
    CACHE_RECREATED,
    CHUNK_REACHED,
    CONFIG_OVERRIDE,
    DUPLICATE_CONTEXT,
    INFO_KINDS,
    PREFIX_DIVERGENCE,
    TURN_FAILED,
    UNBOUNDED_WINDOW,
    WINDOW_REACHED,
)
from kvinspect.core.model.catalog import find_builtin
from kvinspect.core.model.loading import load_model
from tests.conftest import TINY, WINDOWED, load_cached
from tests.core.session.test_session import CAPITALS, baseline_without_cache, run_session
from tests.helpers import RESOURCES, loaded_model

TINY_TURNS = ("Tell me something about the sea, please.", "More about waves?", "And the tides?")
NEW = 16
MODELS = ("smollm2",) + WINDOWED
QWEN3_TEMPLATE = (RESOURCES / "templates" / "qwen3-think.jinja").read_text()

_memo: dict = {}



def _new(name, policy="reuse"):
    # SmolLM2 costs ~50 ms a token on 2 CPU cores, and with use_cache=False every token re-reads the
    # whole sequence (a ~100-token prefill each step): keep those runs shortest.
    if name != "smollm2":
        return NEW
    return 6 if policy in ("nocache", "cache-and-use-cache-false") else 12


def _turns_for(name):
    return CAPITALS if name == "smollm2" else TINY_TURNS


def run(request, name, policy, **opts):
    """One 3-turn session per (model, policy, options), shared by the tests of this module."""
    key = (name, policy, repr(sorted(opts.items())))
    if key not in _memo:
        session, turns, cached = run_session(loaded_model(request, name), _turns_for(name), _new(name, policy),
                                             policy=policy, **opts)
        by_turn = [[e for e in session.record.events if e.turn == t.index] for t in turns]
        _memo[key] = session, turns, cached, by_turn
    return _memo[key]


def baseline(request, name, chat_template=None, policy="reuse"):
    n = _new(name, policy)
    key = (name, "baseline", chat_template, n)
    if key not in _memo:
        _memo[key] = baseline_without_cache(loaded_model(request, name), _turns_for(name), n, chat_template=chat_template)
    return _memo[key]


def problems(events) -> Counter:
    return Counter(e.kind for e in events if e.kind not in INFO_KINDS)


def checklist(turn) -> dict:
    return {item["key"]: item["status"] for item in turn.checklist}


def sliding_layers(name) -> list[int]:
    return [i for i, k in enumerate(find_builtin(name).layer_kinds) if k != "full"]


# -- reuse: the correct way -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ("smollm2",) + TINY)
def test_reuse_fires_no_warning_only_window_information(request, name):
    session, turns, _, by_turn = run(request, name, "reuse")
    b = find_builtin(name)
    for t, events in zip(turns, by_turn):
        assert t.status == "ok", t.error
        assert problems(events) == Counter(), [e.message for e in events]
        assert set(checklist(t).values()) == {"pass"}, t.checklist
    info = [e for e in session.record.events]
    if b.window is None:
        assert info == []
        return
    kind = CHUNK_REACHED if "chunked" in b.layer_kinds else WINDOW_REACHED
    assert [e.kind for e in info] == [kind]  # once per cache object, when the window is first passed
    ev = info[0]
    assert ev.severity == "info" and ev.layers == sliding_layers(name) and ev.layer == ev.layers[0]
    assert ev.data["window"] == b.window and ev.data["stored"] == b.window - 1
    # The step: the first forward after which the layers have seen more than window - 1 tokens.
    seen_total = session.record.q_len.cumsum()
    first = int((seen_total > b.window - 1).argmax())
    assert ev.step == first and ev.data["seen"] == seen_total[first]


# -- recreate: a new cache object inside the chat loop ------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_recreate_flags_every_later_turn_and_prefills_everything(request, name):
    session, turns, _, by_turn = run(request, name, "recreate")
    ids = [t.cache_id for t in turns]
    assert len(set(ids)) == 3 and 0 not in ids
    for k, (t, events) in enumerate(zip(turns, by_turn)):
        assert t.status == "ok", t.error
        assert t.reused_tokens == 0 and t.prefill_tokens == t.prompt_tokens
        if k == 0:
            assert problems(events) == Counter()
            assert checklist(t)["cache_object"] == "pass"
            continue
        assert problems(events) == Counter({CACHE_RECREATED: 1})
        ev = next(e for e in events if e.kind == CACHE_RECREATED)
        prev = turns[k - 1]
        assert ev.data["cache_id"] == t.cache_id and ev.data["previous_cache_id"] == prev.cache_id
        assert ev.data["prefill_tokens"] == ev.data["prompt_tokens"] == t.prompt_tokens
        # Reusable: what the previous cache held (the history renders identically).
        assert ev.data["reusable_tokens"] == prev.prompt_tokens + prev.new_tokens - 1
        assert ev.step == t.first_step
        assert checklist(t)["cache_object"] == "fail"
        assert checklist(t)["length"] == "pass"  # the new cache is the right length: only reuse is lost


def test_recreate_replies_are_still_correct_on_smollm2(request):
    _, turns, _, _ = run(request, "smollm2", "recreate")
    assert [t.reply for t in turns] == [b["reply"] for b in baseline(request, "smollm2")]


# -- refeed: the whole history fed again onto the filled cache -------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_refeed_duplicates_context_by_exactly_what_was_cached(request, name):
    session, turns, _, by_turn = run(request, name, "refeed")
    seen_before = 0
    for k, (t, events) in enumerate(zip(turns, by_turn)):
        assert t.status == "ok", t.error
        conversation = t.prompt_tokens + t.new_tokens - 1
        seen_after = seen_before + conversation  # everything fed again on top of what was there
        assert turns[k].layers[0]["seen"] == seen_after
        if k == 0:
            assert problems(events) == Counter()
        else:
            assert problems(events) == Counter({DUPLICATE_CONTEXT: 1})
            ev = next(e for e in events if e.kind == DUPLICATE_CONTEXT)
            assert {k: v for k, v in ev.data.items() if k != "origin"} == {"seen": seen_after, "expected": conversation, "duplicated": seen_before}
            assert checklist(t)["length"] == "fail"
            assert t.prefill_tokens == t.prompt_tokens and t.reused_tokens == 0
        seen_before = seen_after
    assert len({t.cache_id for t in turns}) == 1


def test_refeed_replies_diverge_from_the_baseline_on_smollm2(request):
    _, turns, _, _ = run(request, "smollm2", "refeed")
    base = baseline(request, "smollm2")
    assert turns[0].reply == base[0]["reply"]  # nothing duplicated yet
    assert [t.reply for t in turns[1:]] != [b["reply"] for b in base[1:]], [t.reply for t in turns]


# -- nocache: use_cache=False -------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_nocache_is_flagged_with_the_positions_it_recomputed(request, name):
    session, turns, _, by_turn = run(request, name, "nocache")
    for t, events in zip(turns, by_turn):
        assert t.status == "ok", t.error
        assert [e.kind for e in events] == [CACHE_DISABLED]  # no cache: no window events either
        ev = events[0]
        n, p = t.new_tokens, t.prompt_tokens
        # Every forward re-reads the whole sequence: p, p+1, ..., p+n-1 positions.
        assert {k: v for k, v in ev.data.items() if k != "origin"} == {"forwards": n, "q_len_first": p, "q_len_last": p + n - 1,
                           "positions": n * p + n * (n - 1) // 2}
        assert t.cache_id == 0 and t.layers == [] and t.kv_bytes == 0
        st = checklist(t)
        assert st["cache_object"] == "fail" and st["length"] == "warn" and st["device"] == "warn"
        # A windowed model without a cache: the window could not apply (not "not reached yet").
        assert st["window"] == ("warn" if find_builtin(name).window else "pass")


def test_nocache_replies_equal_the_baseline_on_smollm2(request):
    _, turns, _, _ = run(request, "smollm2", "nocache")
    assert [t.reply for t in turns] == [b["reply"] for b in baseline(request, "smollm2", policy="nocache")]


# -- cache-without-config: DynamicCache() on a windowed model ------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_cache_without_config_is_flagged_unbounded_on_windowed_models(request, name):
    session, turns, _, by_turn = run(request, name, "cache-without-config")
    b = find_builtin(name)
    if b.window is None:  # SmolLM2: no window, nothing to apply, nothing to say
        assert session.record.events == []
        assert all(set(checklist(t).values()) == {"pass"} for t in turns)
        return
    fired = [k for k, events in enumerate(by_turn) if UNBOUNDED_WINDOW in problems(events)]
    assert len(fired) == 1  # once per cache object
    for events in by_turn:
        assert set(problems(events)) <= {UNBOUNDED_WINDOW}
        assert not [e for e in events if e.kind in (WINDOW_REACHED, CHUNK_REACHED)]  # nothing slides
    ev = next(e for e in by_turn[fired[0]] if e.kind == UNBOUNDED_WINDOW)
    assert ev.layers == sliding_layers(name) and ev.data["window"] == b.window
    seen_total = session.record.q_len.cumsum()
    first = int((seen_total >= b.window).argmax())  # the first step a window-bounded layer could not hold
    assert ev.step == first and ev.data["stored"] == seen_total[first]
    for k, t in enumerate(turns):
        assert t.status == "ok"
        assert all(lay["stored"] == lay["seen"] for lay in t.layers)  # everything kept
        assert checklist(t)["window"] == ("warn" if k >= fired[0] else "pass")
        assert checklist(t)["length"] == "pass"


@pytest.mark.parametrize("name", WINDOWED)
def test_cache_without_config_gives_the_same_replies_with_more_memory(request, name):
    _, bad, _, _ = run(request, name, "cache-without-config")
    _, good, _, _ = run(request, name, "reuse")
    assert [t.reply for t in bad] == [t.reply for t in good]
    assert bad[-1].kv_bytes > good[-1].kv_bytes


# -- cache-and-use-cache-false ------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_cache_with_use_cache_false_swallows_every_step(request, name):
    """The cache takes each forward's whole input; what follows is decided by token counts.

    After turn 1 the cache has seen p + (p+1) + ... + (p+n-1) tokens. generate() slices that many
    off the next prompt: when it is not shorter than the prompt nothing is left to feed and the
    turn fails inside transformers; kvinspect drops the broken cache, so the turn after starts a
    fresh one (not reported as cache_recreated: kvinspect, not the user, replaced it).
    """
    session, turns, _, by_turn = run(request, name, "cache-and-use-cache-false")
    t1 = turns[0]
    n, p = t1.new_tokens, t1.prompt_tokens
    swallowed = n * p + n * (n - 1) // 2
    assert t1.status == "ok" and problems(by_turn[0]) == Counter({CACHE_FED_WITHOUT_USE_CACHE: 1})
    ev = next(e for e in by_turn[0] if e.kind == CACHE_FED_WITHOUT_USE_CACHE)
    assert ev.severity == "error" and {k: v for k, v in ev.data.items() if k != "origin"} == {"growth": swallowed, "forwards": n}
    assert t1.layers[0]["seen"] == swallowed
    st = checklist(t1)
    assert st["cache_object"] == "fail" and st["length"] == "fail"
    t2 = turns[1]
    assert swallowed >= t2.prompt_tokens  # true for these scripts; the branch below is what follows
    assert t2.status == "failed" and problems(by_turn[1]) == Counter({TURN_FAILED: 1})
    assert f"already held {swallowed} tokens" in t2.error and f"{t2.prompt_tokens}-token prompt" in t2.error
    t3 = turns[2]
    assert t3.status == "ok" and t3.cache_id not in (0, t1.cache_id)
    assert problems(by_turn[2]) == Counter({CACHE_FED_WITHOUT_USE_CACHE: 1})
    assert session.record.turns[1].new_tokens == 0


# -- the divergent chat template ----------------------------------------------------------------------

def _lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("name", ["smollm2", "tiny-llama", "tiny-mistral", "tiny-gemma3"])
def test_divergent_template_is_cropped_and_replies_equal_the_baseline(request, name):
    session, turns, cached, by_turn = run(request, name, "reuse", chat_template=QWEN3_TEMPLATE)
    base = baseline(request, name, chat_template=QWEN3_TEMPLATE)
    b = find_builtin(name)
    for k, (t, events) in enumerate(zip(turns, by_turn)):
        assert t.status == "ok", t.error
        assert t.reply == base[k]["reply"], k  # the crop keeps the output right
        if k == 0:
            assert problems(events) == Counter()
            continue
        # Computed from the baseline's token ids: what the cache held vs the re-rendered prompt.
        held = base[k - 1]["prompt"] + base[k - 1]["new"][:-1]
        position = _lcp(held, base[k]["prompt"])
        assert position < len(held)  # the template really dropped something from history
        ev = next(e for e in events if e.kind == PREFIX_DIVERGENCE)
        assert ev.data["position"] == position == t.divergence_at and ev.data["cached"] == len(held)
        # A sliding layer that has seen its window cannot be cropped: a new cache re-prefills everything.
        recreated = b.window is not None and len(held) >= b.window
        if recreated:
            assert problems(events) == Counter({PREFIX_DIVERGENCE: 1, CACHE_RECREATED: 1})
            assert ev.data["recreated"] is True and ev.data["cropped_to"] is None
            assert t.reused_tokens == 0 and t.prefill_tokens == t.prompt_tokens
            assert t.cache_id != turns[k - 1].cache_id
            assert checklist(t)["cache_object"] == "warn"
        else:
            assert problems(events) == Counter({PREFIX_DIVERGENCE: 1})
            assert ev.data["recreated"] is False and ev.data["cropped_to"] == position
            assert t.cropped_from == len(held)
            assert t.reused_tokens == position and t.prefill_tokens == t.prompt_tokens - position
            assert t.cache_id == turns[0].cache_id
        assert checklist(t)["length"] == "pass"
    if name != "smollm2" and b.window:
        assert any(k > 0 and CACHE_RECREATED in problems(ev) for k, ev in enumerate(by_turn))


# -- generation_config collisions ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma2"])
def test_generation_config_override_is_cleared_and_reported(request, name):
    before = load_cached(name).model.generation_config.cache_implementation
    session, turns, _, by_turn = run(request, name, "reuse", generation_config={"cache_implementation": "static"})
    _, good, _, _ = run(request, name, "reuse")
    for t, events in zip(turns, by_turn):
        assert t.status == "ok", t.error
        assert problems(events) == Counter({CONFIG_OVERRIDE: 1})
        ev = next(e for e in events if e.kind == CONFIG_OVERRIDE)
        assert ev.severity == "warn" and {k: v for k, v in ev.data.items() if k != "origin"} == {"cache_implementation": "static", "cleared": True}
    assert turns[1].reused_tokens > 0 and len({t.cache_id for t in turns}) == 1
    assert [t.reply for t in turns] == [t.reply for t in good]
    assert session.record.header["model"]["generation_config"]["cache_implementation"] == "static"
    # The override lived only while the session's turns ran: the loaded model is untouched.
    assert load_cached(name).model.generation_config.cache_implementation == before


def test_respecting_a_colliding_generation_config_fails_like_generate_does(request):
    session, turns, _, by_turn = run(request, "tiny-llama", "reuse", generation_config={"cache_implementation": "static"},
                                     respect_generation_config=True)
    for t, events in zip(turns, by_turn):
        assert t.status == "failed" and "cache_implementation" in t.error and "\n" not in t.error
        assert problems(events) == Counter({CONFIG_OVERRIDE: 1, TURN_FAILED: 1})
        ev = next(e for e in events if e.kind == CONFIG_OVERRIDE)
        assert ev.severity == "error" and {k: v for k, v in ev.data.items() if k != "origin"} == {"cache_implementation": "static", "cleared": False}
        assert checklist(t)["cache_object"] == "fail"
    assert session.record.n_steps == 0
    assert load_cached("tiny-llama").model.generation_config.cache_implementation is None


def test_a_checkpoint_generation_config_collision_is_reported_too():
    """The same collision when it comes from the checkpoint (generation_config.json), not an override."""
    from kvinspect.core.session.chat import ChatSession
    from kvinspect.core.session.options import SessionOptions
    from kvinspect.core.session.script import GenerationSettings

    loaded = load_model("tiny-llama", device="cpu")  # a private copy: this test edits its config
    loaded.model.generation_config.cache_implementation = "static"
    with ChatSession(loaded, SessionOptions(settings=GenerationSettings(max_new_tokens=4))) as session:
        t = session.run_turn("hello")
    assert t.status == "ok"
    assert [e.kind for e in session.record.events] == [CONFIG_OVERRIDE]
    assert loaded.model.generation_config.cache_implementation == "static"  # restored after the call
