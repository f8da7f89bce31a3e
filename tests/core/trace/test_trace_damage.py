"""Damaged, foreign and future traces: a clear one-line TraceError, or what is intact plus notes.

The trace comes from a real 3-turn run on a tiny sliding/global model; each test damages a
copy the way disks, editors and crashes do, then reads it back through read_trace and
through ``kvinspect report`` (which must exit 2 with one line, or write a report that says
what was lost).
"""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest

from kvinspect.cli import main as cli_main
from kvinspect.core.errors import TraceError
from kvinspect.core.report.bundle import write_report
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.trace.tracefile import TRACE_NAME, VERSION, TraceReader, read_trace
from tests.conftest import load_cached
from tests.helpers import FUZZ_SEED


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    script = ChatScript(turns=["hello there", "and again", "one more time"],
                        settings=GenerationSettings(max_new_tokens=24))
    res = run_script(load_cached("tiny-gemma3"), script, out)
    assert [t.status for t in res.record.turns] == ["ok", "ok", "ok"]
    return res.trace


@pytest.fixture
def trace(good_trace, tmp_path):
    p = tmp_path / TRACE_NAME
    shutil.copyfile(good_trace, p)
    return p


def _lines(p) -> list[bytes]:
    return p.read_bytes().split(b"\n")


def _index(lines: list[bytes], kind: str, n: int = 0) -> int:
    hits = [i for i, ln in enumerate(lines) if ln.startswith(b'{"type":"%s"' % kind.encode())]
    return hits[n]


def _one_line_error(path, match: str) -> str:
    with pytest.raises(TraceError, match=match) as exc:
        read_trace(path)
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


def _report_rc(path, out, capsys) -> tuple[int, str]:
    rc = cli_main(["report", str(path), "--out", str(out), "--no-plots"])
    return rc, capsys.readouterr().err


def test_intact_trace_has_no_notes(good_trace):
    rec = read_trace(good_trace)
    assert rec.notes == [] and len(rec.turns) == 3 and rec.n_steps == 72


def test_truncated_mid_line_keeps_completed_turns(trace, tmp_path, capsys):
    lines = _lines(trace)
    i = _index(lines, "turn", 2)  # the closing line of turn 3
    cut = b"\n".join(lines[:i]) + b"\n" + lines[i][: len(lines[i]) // 2]
    trace.write_bytes(cut)
    rec = read_trace(trace)
    assert [t.status for t in rec.turns] == ["ok", "ok", "interrupted"]
    assert rec.turns[2].end_step == rec.n_steps == 72  # its steps were flushed before the cut
    assert rec.turns[2].new_tokens == 24 and rec.turns[2].prefill_tokens > 1
    assert any("cut short" in n for n in rec.notes)
    assert any("turn 3 was interrupted" in n and "never written" in n for n in rec.notes)
    rc, err = _report_rc(trace, tmp_path / "rep", capsys)
    assert rc == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "turn 3 was interrupted" in md and "The trace is damaged" in md


def test_future_version_is_refused_naming_both_versions(trace, tmp_path, capsys):
    lines = _lines(trace)
    head = json.loads(lines[0])
    head["version"] = VERSION + 41
    lines[0] = json.dumps(head).encode()
    trace.write_bytes(b"\n".join(lines))
    msg = _one_line_error(trace, "version")
    assert f"version {VERSION + 41}" in msg and f"up to version {VERSION}" in msg
    rc, err = _report_rc(trace, tmp_path / "rep", capsys)
    assert rc == 2 and err.startswith("kvinspect: error: ") and err.count("\n") == 1
    assert not (tmp_path / "rep" / "report.md").exists()


def test_older_unsupported_version_is_named(trace):
    lines = _lines(trace)
    head = json.loads(lines[0])
    head["version"] = 0
    lines[0] = json.dumps(head).encode()
    trace.write_bytes(b"\n".join(lines))
    assert "version 0" in _one_line_error(trace, "not supported")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes(tmp_path, seed, capsys):
    p = tmp_path / "noise.jsonl"
    p.write_bytes(random.Random(seed).randbytes(20_000))
    _one_line_error(p, "not a kvinspect trace")
    rc, err = _report_rc(p, tmp_path / "rep", capsys)
    assert rc == 2 and "not a kvinspect trace" in err and err.count("\n") == 1


def test_random_json_lines_are_not_a_trace(tmp_path):
    p = tmp_path / "data.jsonl"
    p.write_text('{"text": "a dataset row"}\n{"text": "another"}\n')
    _one_line_error(p, "no 'kvinspect-trace' header")


def test_summary_json_given_by_mistake_gets_a_hint(good_trace, tmp_path):
    p = tmp_path / "summary.json"
    shutil.copyfile(good_trace.parent / "summary.json", p)
    assert "pass trace.jsonl" in _one_line_error(p, "not a kvinspect trace")


def test_empty_file(tmp_path):
    p = tmp_path / TRACE_NAME
    p.write_bytes(b"")
    _one_line_error(p, "empty file")


def test_cut_inside_the_header(trace):
    trace.write_bytes(_lines(trace)[0][:300])
    _one_line_error(trace, "ends inside its header line")


def test_header_only_opens_empty(trace):
    trace.write_bytes(_lines(trace)[0] + b"\n")
    rec = read_trace(trace)
    assert rec.turns == [] and rec.n_steps == 0
    assert any("no end line" in n for n in rec.notes)


def test_folder_without_trace(tmp_path, capsys):
    _one_line_error(tmp_path, "has no trace.jsonl")
    (tmp_path / "20260101-120000-tiny.jsonl").write_text("{}\n")
    assert "20260101-120000-tiny.jsonl" in _one_line_error(tmp_path, "pass one of those files")
    rc, err = _report_rc(tmp_path, tmp_path / "rep", capsys)
    assert rc == 2 and "has no trace.jsonl" in err


def test_missing_path(tmp_path):
    _one_line_error(tmp_path / "nope" / TRACE_NAME, "no trace at")


def test_damaged_steps_line_in_the_middle(good_trace, trace, tmp_path, capsys):
    intact = read_trace(good_trace)
    lines = _lines(trace)
    i = _index(lines, "steps", 1)  # the chunk that holds turn 1's forwards
    chunk = json.loads(lines[i])
    first, n = chunk["first"], chunk["n"]
    lines[i] = lines[i][:40] + b"#garbage#" + lines[i][60:]
    trace.write_bytes(b"\n".join(lines))
    rec = read_trace(trace)
    assert [t.status for t in rec.turns] == ["ok", "ok", "ok"]  # turn lines are intact
    assert rec.n_steps == intact.n_steps  # the gap is padded: later step numbers stay true
    gap = slice(first, first + n)
    assert (rec.seen[gap] == -1).all() and np.isnan(rec.t[gap]).all()
    after = slice(first + n, None)
    assert np.array_equal(rec.stored[after], intact.stored[after])
    assert any(f"line {i + 1} (steps) is damaged" in note for note in rec.notes)
    assert any(f"steps {first}–{first + n - 1} are missing" in note for note in rec.notes)
    assert rec.layer_table_at(first)[0]["seen"] is None  # the replay table says "unknown", not 0
    rc, err = _report_rc(trace, tmp_path / "rep", capsys)
    assert rc == 0, err
    assert "are missing" in (tmp_path / "rep" / "report.md").read_text()


def test_damaged_turn_line_in_the_middle(trace):
    lines = _lines(trace)
    i = _index(lines, "turn", 0)
    lines[i] = lines[i][:-20] + b"\x00\xff"
    trace.write_bytes(b"\n".join(lines))
    rec = read_trace(trace)
    assert [t.status for t in rec.turns] == ["incomplete", "ok", "ok"]
    t0 = rec.turns[0]
    assert t0.end_step == rec.turns[1].first_step and t0.new_tokens == t0.end_step - t0.first_step
    assert any("turn 1 is incomplete" in n for n in rec.notes)


def test_both_lines_of_a_turn_lost(trace):
    lines = _lines(trace)
    drop = {_index(lines, "turn_start", 1), _index(lines, "turn", 1)}
    trace.write_bytes(b"\n".join(ln for k, ln in enumerate(lines) if k not in drop))
    rec = read_trace(trace)
    assert [t.index for t in rec.turns] == [0, 1, 2]
    assert [t.status for t in rec.turns] == ["ok", "incomplete", "ok"]
    assert any("turn 2 is lost" in n for n in rec.notes)


def test_follow_mode_keeps_a_running_turn_running(trace):
    lines = _lines(trace)
    i = _index(lines, "turn", 2)
    trace.write_bytes(b"\n".join(lines[:i]) + b"\n")
    reader = TraceReader(trace)
    reader.poll()
    assert reader.record.turns[2].status == "running"  # a live viewer: the turn may still finish
    with trace.open("ab") as f:
        f.write(b"\n".join(lines[i:]))
    reader.poll()
    assert reader.record.turns[2].status == "ok"


# -- hostile numbers and types: the validating reader, tests/fuzz for the property suite --------

SEED = FUZZ_SEED


def _mutated(tmp_path, i, path, value):
    from tests.fuzz.mutations import lines_of, set_field

    p = tmp_path / "m.jsonl"
    p.write_bytes(set_field(lines_of(SEED.read_bytes()), i, path, value))
    return p


def _line_of(kind):
    from tests.fuzz.mutations import lines_of

    return next(i for i, o in enumerate(lines_of(SEED.read_bytes())) if o["type"] == kind)


@pytest.mark.parametrize("kind, path, value", [
    ("steps", ("first",), 10**9),  # padded a billion rows: 23 GB
    ("steps", ("n",), 10**9),
    ("steps", ("cols",), {}),  # shrunk by the corpus: StopIteration in append_columns
    ("turn", ("index",), 10**8),  # a hundred million placeholder turns
    ("turn_start", ("index",), 10**8),
    ("turn", ("layers", 0, "seen"), ""),  # shrunk by the corpus: report compared int < str
    ("turn", ("checklist",), 3),
    ("turn", ("new_tokens",), "12"),
    ("event", ("layers",), ["a", "b"]),
    ("steps", ("cols", "seen", "dtype"), "|O"),
    ("steps", ("cols", "seen", "shape"), [10**9, 10**9]),
    ("turn", ("ids", "prompt"), ["x"]),
    ("turn", ("ids", "base_turn"), 5),
])
def test_a_lying_line_is_skipped_with_a_note(tmp_path, kind, path, value):
    p = _mutated(tmp_path, _line_of(kind), path, value)
    rec = read_trace(p)
    assert any("is damaged" in n for n in rec.notes), rec.notes
    assert rec.n_steps <= 80 and len(rec.turns) <= 2
    write_report(rec, tmp_path / "rep", plots_enabled=False, trace_file=p)


@pytest.mark.parametrize("path, value, match", [
    (("n_layers",), 10**9, "n_layers"), (("n_layers",), -1, "n_layers"), (("n_layers",), "six", "n_layers"),
    (("session",), "x", "session"), (("model",), [1, 2], "model"),
    (("model", "config"), -(10**9), "config"),  # shrunk by the corpus: report called .items() on an int
])
def test_a_lying_header_is_one_line(tmp_path, path, value, match):
    _one_line_error(_mutated(tmp_path, 0, path, value), match)


def test_a_zlib_bomb_costs_what_it_claims(tmp_path):
    from tests.fuzz.mutations import zlib_bomb_line

    lines = SEED.read_bytes().splitlines()
    i = _line_of("steps")
    bomb = zlib_bomb_line(0, 80, 6, 256)  # 256 MB of zeros for a column of 80 x 6 int32
    p = tmp_path / "bomb.jsonl"
    p.write_bytes(b"\n".join(lines[:i] + [bomb] + lines[i + 1:]) + b"\n")
    rec = read_trace(p)
    assert rec.n_steps == 0 and any("does not decompress" in n for n in rec.notes), rec.notes


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    _one_line_error(fifo, "not a regular file")


def test_deep_nesting_is_a_damaged_line(tmp_path):
    lines = SEED.read_bytes().splitlines()
    p = tmp_path / "deep.jsonl"
    p.write_bytes(lines[0] + b'\n{"type":"note","key":"k","value":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    rec = read_trace(p)
    assert any("line 2" in n and "damaged" in n for n in rec.notes)


def test_twenty_thousand_open_turns_are_one_note_not_twenty_thousand(tmp_path):
    from tests.fuzz.mutations import join, lines_of

    objs = lines_of(SEED.read_bytes())
    start = objs[_line_of("turn_start")]
    p = tmp_path / "many.jsonl"
    p.write_bytes(join(objs[:1] + [{**start, "index": k} for k in range(20_000)]))
    rec = read_trace(p)
    assert len(rec.turns) == 20_000 and len(rec.notes) < 20


def test_a_lost_turn_run_is_one_note(tmp_path):
    from tests.fuzz.mutations import join, lines_of

    objs = lines_of(SEED.read_bytes())
    start = objs[_line_of("turn_start")]
    p = tmp_path / "gap.jsonl"
    p.write_bytes(join(objs[:1] + [start] + [{"type": "note", "key": f"k{k}", "value": 0} for k in range(50)]
                       + [{**start, "index": 40}]))
    rec = read_trace(p)
    assert len(rec.turns) == 41 and [n for n in rec.notes if "are lost:" in n] == [
        "turns 2–40 are lost: both their start and closing lines are damaged"]
