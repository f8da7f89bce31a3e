"""The turn pipeline, shared by kvinspect's own chat loop and the user's observed loop.

One failure, two loops: a static cache sized for the first turn overflows in the second
(transformers #37269). Run by ``kvinspect run``'s ChatSession and by a user's loop under
``kvinspect.observe``, the second turn must be the same failed turn, with the exception's type and
first line, the same ``turn_failed`` event, and the trace must say so.
"""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

import kvinspect
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings
from kvinspect.core.trace.tracefile import read_trace
from tests.conftest import load_cached

CAPACITY = 64
NEW = 12
TURNS = ["Hello there, how are you?", "Tell me a much longer story about the sea and its waves."]


def _by_chat_session(lm, tmp_path):
    opts = SessionOptions(cache_impl="static", max_cache_len=CAPACITY, settings=GenerationSettings(max_new_tokens=NEW))
    with ChatSession(lm, opts, trace_path=tmp_path / "trace.jsonl") as sess:
        for text in TURNS:
            sess.run_turn(text)
    return read_trace(tmp_path / "trace.jsonl")


def _by_observed_loop(lm, tmp_path):
    model, tok = lm.model, lm.tokenizer
    cache = StaticCache(config=model.config, max_cache_len=CAPACITY)
    history: list[dict] = []
    raised = []
    with kvinspect.observe(model, tok, trace=tmp_path) as rec:
        for text in TURNS:
            history.append({"role": "user", "content": text})
            ids = tok.apply_chat_template(history, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            ids = ids["input_ids"]
            try:
                out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                     max_new_tokens=NEW, do_sample=False)
            except (IndexError, RuntimeError) as exc:  # the user's loop catches it and carries on
                raised.append(exc)
                break
            history.append({"role": "assistant", "content": tok.decode(out[0, ids.shape[1]:])})
    assert raised, "the second turn was expected to overflow the static cache"
    assert [t.status for t in rec.turns] == ["ok", "failed"]
    return read_trace(tmp_path / "trace.jsonl"), raised[0]


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_a_failing_generate_is_the_same_failed_turn_in_both_loops(tmp_path):
    lm = load_cached("tiny-llama")
    ran = _by_chat_session(lm, tmp_path / "run")
    observed, exc = _by_observed_loop(lm, tmp_path / "observed")
    for rec in (ran, observed):
        first, second = rec.turns
        assert first.status == "ok"
        assert second.status == "failed"
        need = second.prompt_tokens + NEW - 1
        assert need > CAPACITY
        prefix = f"static cache overflow: this turn needs up to {need} cache rows but max_cache_len is {CAPACITY} ("
        assert second.error.startswith(prefix), second.error
        assert second.error[len(prefix):].startswith(f"{type(exc).__name__}: "), second.error
        failed = [e for e in rec.events if e.kind == "turn_failed"]
        assert [(e.turn, e.message) for e in failed] == [(1, second.error)]
        assert second.cache_class == "StaticCache"
    # The exception's first line is the same words in both loops, whatever the prompt lengths.
    assert ran.turns[1].error.split("(", 1)[1].split(":")[0] == observed.turns[1].error.split("(", 1)[1].split(":")[0]
