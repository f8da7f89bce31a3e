"""memory_retained on the cache transformers itself keeps on ``model._cache``.

Some releases (4.56 among them) keep the static/hybrid cache ``generate()`` built on the model for the
next call; a correct program that later passes its own cache then has that memory alive beside it. It
is the library's doing: named once, as info with ``origin: library``, never a problem of the program.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from transformers import DynamicCache

import kvinspect
from kvinspect.core.detect.events import MEMORY_RETAINED

from ...conftest import load_cached

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def _ids(lm, text="Hello there, how are you?"):
    return lm.tokenizer(text, return_tensors="pt")["input_ids"]


def _correct_turns(m, ids, cache, n=2):
    out = None
    for _ in range(n):
        out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                         max_new_tokens=3, do_sample=False)
        ids = out
    return out


def test_the_library_s_kept_cache_is_named_once_as_its_own():
    lm = load_cached("tiny-gemma3")
    m, ids = lm.model, _ids(lm)
    # A static cache generate() builds itself; where the release keeps it, it lands on model._cache.
    m.generate(input_ids=ids, max_new_tokens=2, do_sample=False, cache_implementation="static")
    kept = getattr(m, "_cache", None)
    try:
        if kept is None:
            # This release keeps nothing: stand in for one that does, by the attribute it uses.
            m._cache = DynamicCache(config=m.config)
            m(input_ids=ids, past_key_values=m._cache, use_cache=True)
        with contextlib.redirect_stdout(io.StringIO()), kvinspect.observe(m, lm.tokenizer) as rec:
            _correct_turns(m, ids, DynamicCache(config=m.config), n=3)
    finally:
        if kept is None:
            del m._cache
    assert rec.problems == []
    named = [e for e in rec.events if e.kind == MEMORY_RETAINED]
    assert len(named) == 1, [e.message for e in named]
    ev = named[0]
    assert ev.severity == "info" and not ev.is_problem and ev.turn == 0
    assert ev.data["origin"] == "library" and ev.data["holder"] == "model._cache" and ev.data["bytes"] > 0
    assert "transformers" in ev.message and "del model._cache" in ev.advice


def test_a_cache_the_program_keeps_on_the_model_is_still_its_own():
    lm = load_cached("tiny-llama")
    m, ids = lm.model, _ids(lm)
    m.kept_by_me = DynamicCache(config=m.config)
    try:
        m(input_ids=ids, past_key_values=m.kept_by_me, use_cache=True)
        with contextlib.redirect_stdout(io.StringIO()), kvinspect.observe(m, lm.tokenizer) as rec:
            _correct_turns(m, ids, DynamicCache(config=m.config), n=2)
    finally:
        del m.kept_by_me
    named = [e for e in rec.events if e.kind == MEMORY_RETAINED]
    assert [e.turn for e in named] == [0, 1]  # a program's own holder is named after every turn it lives
    assert all(e.data["origin"] == "user_code" and e.data["holder"] == "model.kept_by_me" for e in named)
