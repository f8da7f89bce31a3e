"""Property-based tests of hostile input: mutated traces, scripts and model configs (docs/errors.md).

In-process, many examples: every reader consumer either refuses a mutated trace with one
TraceError line or reads it, and the summary and report that follow never raise. In child
processes, fewer examples: ``kvinspect report``, ``run`` and ``view``'s checks exit 0 or 2 with
one ``kvinspect:`` line and no traceback, under a memory cap (``resource.setrlimit``) and a
timeout (a timeout is a hang, not a speed limit). Seeded (``derandomize``); ``make fuzz`` draws
20x more. A failure hypothesis shrinks becomes a regular test in tests/core/trace/test_trace_damage.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvinspect.core.errors import KvInspectError
from kvinspect.core.report.bundle import write_report
from kvinspect.core.trace.summary import write_summary
from kvinspect.core.trace.tracefile import read_trace
from tests.fuzz.conftest import SCALE
from tests.fuzz.harness import run_cli
from tests.fuzz.mutations import HOSTILE, field_paths, lines_of, set_field

pytestmark = pytest.mark.timeout(240 * SCALE)

VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(min_value=-5, max_value=10**12), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)


#: A real 2-turn run of tiny-gemma3 (sliding and global layers, a window_reached event), rewritten
#: by write_trace into one step chunk; an old trace must stay readable, so it is kept as written.
GOOD = Path(__file__).with_name("data") / "tiny-gemma3.jsonl"


@pytest.fixture(scope="module")
def good():
    data = GOOD.read_bytes()
    objs = lines_of(data)
    return data, objs, [(i, p) for i, o in enumerate(objs) for p in field_paths(o)]


def test_the_seed_trace_reads_clean():
    rec = read_trace(GOOD)
    assert rec.notes == [] and len(rec.turns) == 2 and rec.n_steps == 80 and rec.events


def _consume(path, out) -> None:
    """What report and view do with a record: read, summarise, write the bundle (no plots)."""
    try:
        rec = read_trace(path)
    except KvInspectError as exc:
        msg = str(exc)
        assert "\n" not in msg and len(msg) < 400, msg
        return
    write_summary(out / "summary.json", rec)
    write_report(rec, out / "bundle", plots_enabled=False, trace_file=path)
    rec.layer_table_at(rec.n_steps - 1)


@settings(max_examples=400 * SCALE)
@given(data=st.data())
def test_mutated_field_never_breaks_a_reader(good, tmp_path_factory, data):
    raw, objs, paths = good
    i, path = data.draw(st.sampled_from(paths), label="field")
    value = data.draw(VALUES, label="value")
    d = tmp_path_factory.mktemp("m")
    (d / "trace.jsonl").write_bytes(set_field(objs, i, path, value))
    _consume(d / "trace.jsonl", d)


@settings(max_examples=150 * SCALE)
@given(data=st.data())
def test_cut_spliced_and_flipped_bytes_never_break_a_reader(good, tmp_path_factory, data):
    raw = good[0]
    cut = data.draw(st.integers(min_value=0, max_value=len(raw)), label="cut")
    flip = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=4))
    buf = bytearray(raw[:cut] if data.draw(st.booleans(), label="truncate") else raw)
    for pos, b in flip:
        if pos < len(buf):
            buf[pos] = b
    d = tmp_path_factory.mktemp("b")
    (d / "trace.jsonl").write_bytes(bytes(buf))
    _consume(d / "trace.jsonl", d)


@pytest.mark.e2e
@settings(max_examples=6 * SCALE)
@given(data=st.data())
def test_report_child_keeps_the_contract(good, tmp_path_factory, data):
    raw, objs, paths = good
    i, path = data.draw(st.sampled_from(paths), label="field")
    value = data.draw(VALUES, label="value")
    d = tmp_path_factory.mktemp("c")
    (d / "trace.jsonl").write_bytes(set_field(objs, i, path, value))
    res = run_cli(["report", str(d), "--out", str(d / "rep"), "--no-plots"], timeout=120)
    assert res.check() == [], (res.why, res.err[-2000:])


SCRIPT_VALUES = st.one_of(VALUES, st.text(min_size=1, max_size=30), st.just("\udc80 lone"),
                          st.recursive(st.integers(), lambda c: st.lists(c, max_size=2), max_leaves=4))


@pytest.mark.e2e
@settings(max_examples=6 * SCALE)
@given(key=st.sampled_from(["turns", "system", "max_new_tokens", "temperature", "top_p", "top_k", "seed",
                            "do_sample", "bogus"]), value=SCRIPT_VALUES)
def test_run_refuses_a_bad_script_before_the_model_loads(tmp_path_factory, key, value):
    d = tmp_path_factory.mktemp("s")
    body = {"turns": ["hi"], "max_new_tokens": 2, key: value}
    if key == "turns" and isinstance(value, list) and value and all(isinstance(t, str) and t.strip() for t in value):
        body["turns"] = [1]  # a valid script would load the model: keep this one about refusals
    if key in ("temperature", "top_p", "top_k", "seed", "max_new_tokens", "do_sample") and not isinstance(value, list):
        body[key] = [value]  # always of the wrong type
    (d / "s.json").write_text(json.dumps(body, ensure_ascii=True), encoding="utf-8")
    res = run_cli(["run", "--model", "tiny-llama", "--script", str(d / "s.json"), "--out", str(d / "o")],
                  timeout=120)
    assert res.check() == [] and res.rc == 2, (res.why, res.err[-2000:])
    assert "torch" not in res.err
    assert not (d / "o").exists()  # refused before anything was written
