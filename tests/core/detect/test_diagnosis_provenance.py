"""Where cache_implementation / cache_config / use_cache came from, and memory kept alive elsewhere.

Provenance: a generate() kwarg, a GenerationConfig passed in, code that set
``model.generation_config``, the checkpoint's generation_config.json (with its path), kvinspect's
``--generation-config``; shown in config_override, the checklist and report.md. Retained memory: a
cache kept on the model or in a returned output, named with its bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig

import kvinspect
from kvinspect.core.detect.events import CONFIG_OVERRIDE, MEMORY_RETAINED
from kvinspect.core.detect.provenance import CODE, DEFAULT, FILE, KWARG, OPTION, PASSED, config_sources
from kvinspect.core.report.report_md import report_markdown
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings
from tests.conftest import load_cached

# On transformers 4.x these loops fail before their first forward or with a shape mismatch in a static
# cache's sliding layers (tests/core/examples_expected.py), and leave the shared built-ins changed for
# the tests after them: the diagnosis cases are checked on 5.x.
pytestmark = [pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                                 reason="the diagnosis cases are checked on transformers 5.x"),
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]


def _ids(lm):
    return lm.tokenizer.apply_chat_template([{"role": "user", "content": "hi there"}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]


def _sources(turn) -> dict:
    return {k: v["source"] for k, v in turn.settings["config_sources"].items()}


def test_each_observed_call_says_where_cache_implementation_came_from():
    lm = load_cached("tiny-llama")
    m, ids = lm.model, _ids(lm)
    with kvinspect.observe(m, lm.tokenizer) as rec:
        m.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
        m.generate(input_ids=ids, max_new_tokens=2, do_sample=False, cache_implementation="static")
        m.generate(input_ids=ids, generation_config=GenerationConfig(max_new_tokens=2, do_sample=False,
                                                                     cache_implementation="static"))
        m.generation_config.cache_implementation = "static"
        try:
            m.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
        finally:
            m.generation_config.cache_implementation = None
    got = [_sources(t)["cache_implementation"] for t in rec.turns]
    assert got == [DEFAULT, KWARG, PASSED, CODE]
    assert all(_sources(t)["use_cache"] == DEFAULT for t in rec.turns)
    item = next(i for i in rec.turns[1].checklist if i["key"] == "config")
    assert item["status"] == "pass" and "StaticCache" in item["evidence"] and "generate() kwarg" in item["evidence"]


def test_a_checkpoint_file_is_named_with_its_path(tmp_path):
    lm = load_cached("tiny-llama")
    folder = tmp_path / "ckpt"
    gc = lm.model.generation_config
    before = gc.cache_implementation
    gc.cache_implementation = "static"
    try:
        lm.model.save_pretrained(folder)
    finally:
        gc.cache_implementation = before
    model = AutoModelForCausalLM.from_pretrained(folder)
    src = config_sources(model)
    assert src["cache_implementation"] == {"value": "static", "source": FILE,
                                           "path": str(folder / "generation_config.json")}
    # The user's own cache collides with it: generate() refuses before any forward; kvinspect's loop says where from.
    session = ChatSession(dataclasses.replace(lm, model=model), SessionOptions(settings=GenerationSettings(max_new_tokens=2)))
    try:
        turn = session.run_turn("hello")
    finally:
        session.close()
    ev = next(e for e in session.record.events if e.kind == CONFIG_OVERRIDE)
    assert "from generation_config.json (" in ev.message and str(folder) in ev.message
    assert next(i for i in turn.checklist if i["key"] == "config")["status"] == "warn"
    md = report_markdown(session.record)
    assert "## Generation config provenance" in md and "generation_config.json" in md and str(folder) in md


def test_kvinspect_override_is_its_own_source():
    lm = load_cached("tiny-llama")
    session = ChatSession(lm, SessionOptions(generation_config={"cache_implementation": "static"},
                                             settings=GenerationSettings(max_new_tokens=2)))
    try:
        turn = session.run_turn("hello")
    finally:
        session.close()
    assert _sources(turn)["cache_implementation"] == OPTION
    ev = next(e for e in session.record.events if e.kind == CONFIG_OVERRIDE)
    assert "from kvinspect --generation-config" in ev.message


def test_a_cache_kept_elsewhere_is_named_with_its_bytes():
    lm = load_cached("tiny-llama")
    m, ids = lm.model, _ids(lm)
    cache = DynamicCache(config=m.config)
    with contextlib.redirect_stdout(io.StringIO()), kvinspect.observe(m, lm.tokenizer) as rec:
        m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=3,
                   do_sample=False)
        out = m.generate(input_ids=ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
        m.kept_cache = out.past_key_values  # a program that stores the output's cache on the model
        try:
            m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=3,
                       do_sample=False)
        finally:
            del m.kept_cache
    kept = [e for e in rec.events if e.kind == MEMORY_RETAINED]
    # Turn 1 is the user's own cache; turn 2 returned its cache in the output, which the program may keep
    # to go on (its own cache again). Once stored on the model, turn 3 finds it beside the cache in use.
    assert [e.turn for e in kept] == [2]
    ev = kept[0]
    assert ev.data["holder"] == "model.kept_cache" and ev.data["bytes"] == rec.turns[1].kv_held_bytes > 0
    assert ev.severity == "warn" and ev.is_problem and "model.kept_cache" in ev.message
