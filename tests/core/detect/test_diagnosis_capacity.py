"""Capacity: a static cache sized for the first turn, reused until it overflows.

The user's loop (resources/examples/mistake_static_cache_too_small.py) must give capacity_near after
turn 1 (the counts show turn 2 cannot fit) and a failed turn 2 with capacity_exceeded, under
``kvinspect.observe()`` and under ``kvinspect trace``; kvinspect's own loop the same with a small
``max_cache_len``. The user's program still sees its own exception.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys

import pytest
import torch
import transformers
from transformers import StaticCache

import kvinspect
from kvinspect.core.detect.events import CAPACITY_EXCEEDED, CAPACITY_NEAR, TURN_FAILED
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings
from kvinspect.core.trace.tracefile import read_trace
from tests.conftest import load_cached
from tests.helpers import RESOURCES, run_cli

# On transformers 4.x a static cache overflows differently: its sliding layers fail the second prefill
# with a shape mismatch before any row runs out (tests/core/examples_expected.py), so the capacity
# cases are checked on 5.x.
SKIP_4X = pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                             reason="static-cache overflow is checked on transformers 5.x")

pytestmark = [SKIP_4X, pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")]

EXAMPLE = RESOURCES / "examples" / "mistake_static_cache_too_small.py"


def _example():
    spec = importlib.util.spec_from_file_location(EXAMPLE.stem, EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _problems(events):
    return [(e.kind, e.turn + 1) for e in events if e.is_problem]


def _assert_overflow(events, turns, max_new: int):
    assert _problems(events) == [(CAPACITY_NEAR, 1), (CAPACITY_EXCEEDED, 2), (TURN_FAILED, 2)]
    near = next(e for e in events if e.kind == CAPACITY_NEAR)
    over = next(e for e in events if e.kind == CAPACITY_EXCEEDED)
    cap = near.data["capacity"]
    # The example sizes the cache for turn 1: its prompt plus max_new_tokens.
    assert cap == turns[0].prompt_tokens + max_new and near.data["held"] == cap - 1
    assert near.data["needed_next"] > cap and str(cap) in near.message and "max_cache_len" in near.advice
    assert over.data["capacity"] == cap and over.data["needed"] == turns[1].prompt_tokens + max_new - 1 > cap
    assert [t.status for t in turns] == ["ok", "failed"] and "IndexError" in turns[1].error


@pytest.mark.parametrize("spec", ["tiny-gemma3", "tiny-llama"])
def test_observed_loop_overflowing_a_static_cache(spec):
    lm = load_cached(spec)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        with kvinspect.observe(lm.model, lm.tokenizer) as rec:
            _example().run(lm.model, lm.tokenizer, max_new_tokens=6)
    assert "failed: IndexError" in out.getvalue()  # the program saw its own exception
    assert rec.errors == []
    _assert_overflow(rec.events, rec.turns, 6)


def test_the_users_exception_reaches_the_user_unchanged():
    lm = load_cached("tiny-llama")
    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": "a long enough question"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    cache = StaticCache(config=lm.model.config, max_cache_len=ids.shape[1] + 2)
    with pytest.raises(IndexError, match="index_copy_"):
        with kvinspect.observe(lm.model, lm.tokenizer) as rec:
            lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                              do_sample=False, max_new_tokens=6)
    turn = rec.turns[0]
    assert turn.status == "failed" and turn.new_tokens == 3  # the rows there were: prefill + 2 decode steps
    assert [e.kind for e in rec.events if e.is_problem] == [CAPACITY_EXCEEDED, TURN_FAILED]


def test_kvinspect_trace_names_the_overflow(tmp_path):
    out = tmp_path / "trace"
    r = run_cli(["trace", "--out", out, "--", sys.executable, EXAMPLE, "--model", "tiny-llama", "--max-new-tokens", "6"],
                cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]  # the example catches its own IndexError
    assert "failed: IndexError" in r.stdout
    rec = read_trace(out)
    _assert_overflow(rec.events, rec.turns, 6)
    assert "capacity_near" in r.stderr and "capacity_exceeded" in r.stderr


def test_kvinspect_run_with_a_small_static_cache():
    lm = load_cached("tiny-llama")
    opts = SessionOptions(cache_impl="static", max_cache_len=120, settings=GenerationSettings(max_new_tokens=8))
    session = ChatSession(lm, opts)
    try:
        turns = [session.run_turn(t) for t in ("the first question here", "a second one", "and a third")]
    finally:
        session.close()
    got = _problems(session.record.events)
    near = [t for k, t in got if k == CAPACITY_NEAR]
    failed = [t.index + 1 for t in turns if t.status == "failed"]
    assert failed and near and max(near) < failed[0]  # warned before the turn that did not fit
    assert (CAPACITY_EXCEEDED, failed[0]) in got and (TURN_FAILED, failed[0]) in got


def test_dynamic_and_roomy_static_caches_say_nothing():
    lm = load_cached("tiny-gemma3")
    opts = SessionOptions(cache_impl="static", max_cache_len=1024, settings=GenerationSettings(max_new_tokens=8))
    session = ChatSession(lm, opts)
    try:
        for t in ("the first question here", "a second one"):
            session.run_turn(t)
    finally:
        session.close()
    assert {e.kind for e in session.record.events} & {CAPACITY_NEAR, CAPACITY_EXCEEDED} == set()
