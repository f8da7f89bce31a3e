"""A compiled forward runs under observation exactly as without it, and is still observed from outside the graph.

transformers compiles ``Module.__call__`` itself (``generate()`` with a static cache and a ``CompileConfig``),
so every forward hook is traced into the graph: a hook Dynamo cannot compile breaks ``fullgraph=True``.
The hooks ask ``torch.compiler.is_compiling()`` first and step aside; the turn is then read at the call's
end from the cache itself (docs/observe.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from transformers import CompileConfig, StaticCache

import kvinspect
from kvinspect.core.trace.tracefile import read_trace
from tests.conftest import load_cached
from tests.helpers import ROOT, cli_env, run_cli

pytestmark = [
    pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                       reason="generate()'s compile path with CompileConfig on the CPU is checked on transformers 5.x"),
    pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning"),
]

# Attention, images and recurrent state; `make test-compiled` runs every built-in (about 35 s each here).
SPECS = os.environ.get("KVINSPECT_COMPILED_SPECS", "tiny-llama,tiny-gemma3-vl").split(",")


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_fullgraph_compiled_builtins_run_under_trace_as_they_do_plainly(tmp_path):
    argv = [sys.executable, "-m", "tests.core.observe.compiled_builtins", *SPECS]
    # Each run compiles afresh: from inductor's on-disk cache a graph is not lowered again, nor its warnings said.
    env = {**cli_env(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-plain")}
    plain = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1500)
    assert plain.returncode == 0, plain.stderr[-2000:]
    out = tmp_path / "traced"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-traced")
    traced = run_cli(["trace", "--out", out, "-q", "--", *argv], env=env, timeout=1500)
    assert traced.returncode == 0, traced.stderr[-2000:]
    want, got = _lines(plain.stdout), _lines(traced.stdout)
    assert [w["spec"] for w in want] == SPECS
    for w in want:  # the plain run compiles and generates: otherwise this test proves nothing
        assert isinstance(w["generate"], list) and isinstance(w["forward"], int) and w["graph_breaks"] == 0, w
    assert got == want  # the same ids, no error, no graph break, no new warning
    rec = read_trace(out / "trace.jsonl")
    assert rec.turns and all(t.status == "ok" for t in rec.turns)
    assert not [e.kind for e in rec.events if e.is_problem]


def _static_chat(model, tok, compile_config):
    """Three turns on one StaticCache, each prompt extending the last turn's output: a correct loop."""
    cache = StaticCache(config=model.config, max_cache_len=96)
    ids = tok("hello there", return_tensors="pt")["input_ids"]
    outs = []
    for _ in range(3):
        out = model.generate(ids, past_key_values=cache, max_new_tokens=6, do_sample=False,
                             compile_config=compile_config)
        outs.append(out[0].tolist())
        ids = torch.cat([out, tok(" and more", return_tensors="pt")["input_ids"]], dim=1)
    return outs, cache


def test_a_compiled_decode_is_read_from_outside_the_graph_per_call():
    lm = load_cached("tiny-llama")
    cfg = CompileConfig(fullgraph=True, dynamic=False)
    cfg._compile_all_devices = True
    torch._dynamo.reset()
    plain, _ = _static_chat(lm.model, lm.tokenizer, cfg)
    with contextlib.redirect_stdout(io.StringIO()), kvinspect.observe(lm.model, lm.tokenizer) as rec:
        observed, cache = _static_chat(lm.model, lm.tokenizer, cfg)
    assert observed == plain
    assert len(rec.turns) == 3 and not [e.kind for e in rec.events if e.is_problem]
    for t, out in zip(rec.turns, observed, strict=True):
        # Only the prefill ran eagerly; the decode forwards ran compiled, and the turn counts them.
        assert t.end_step - t.first_step == 1
        assert t.settings["compiled_forwards"] == 5
        assert max(lay["seen"] for lay in t.layers) == len(out) - 1 and t.new_tokens == 6  # the cache at the end
    assert max(lay["seen"] for lay in rec.turns[-1].layers) == cache.get_seq_length()


def test_no_capacity_prediction_for_a_cache_generate_built_for_itself():
    lm = load_cached("tiny-llama")
    ids = lm.tokenizer("hello there", return_tensors="pt")["input_ids"]
    with contextlib.redirect_stdout(io.StringIO()), kvinspect.observe(lm.model, lm.tokenizer) as rec:
        lm.model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
        # The same sizing with the cache passed in outlives the call: the next turn cannot fit, and it is said.
        cache = StaticCache(config=lm.model.config, max_cache_len=ids.shape[1] + 6)
        lm.model.generate(ids, past_key_values=cache, max_new_tokens=6, do_sample=False)
    assert [(e.kind, e.turn) for e in rec.events if e.is_problem] == [("capacity_near", 1)]
