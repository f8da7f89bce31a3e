"""The window's live trace (gui/engine_link/live_trace.py): a session's lines decoded once into the record
the window draws and written once, verbatim, to the autosave; what the window adds goes the same way.

The lines are those of a real headless run, fed as the engine would stream them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvinspect.core.trace.tracefile import read_trace
from kvinspect.gui.engine_link.live_trace import LiveTrace
from tests.gui.helpers import headless_run


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    run = headless_run(tmp_path_factory.mktemp("run"), "tiny-gemma3",
                       ["Hello! What does a KV cache store? Tell me more.", "And a sliding layer?"], max_new_tokens=40)
    raw = (run / "trace.jsonl").read_bytes().splitlines()
    return run, [(json.loads(r)["type"], json.loads(r), r) for r in raw]


@pytest.fixture(autouse=True)
def _data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVINSPECT_DATA_DIR", str(tmp_path / "data"))


def _same_record(a, b) -> None:
    assert a.n_steps == b.n_steps and a.n_layers == b.n_layers
    assert [(t.index, t.status, t.reply, t.first_step, t.end_step) for t in a.turns] == \
           [(t.index, t.status, t.reply, t.first_step, t.end_step) for t in b.turns]
    assert [(e.kind, e.turn, e.step) for e in a.events] == [(e.kind, e.turn, e.step) for e in b.events]
    assert np.array_equal(a.stored, b.stored) and np.array_equal(a.seen, b.seen)


def test_a_whole_session_is_the_record_the_reader_reads_and_a_byte_exact_autosave(lines):
    run, feed = lines
    live = LiveTrace()
    kinds = [k for k, obj, raw in feed if live.feed_line(k, obj, raw) is not None]
    assert kinds == [k for k, _, _ in feed]  # every line applied, none dropped
    assert live.ended and not live.problems and live.paused is None
    _same_record(live.record, read_trace(run))
    assert open(live.path, "rb").read() == (run / "trace.jsonl").read_bytes()


def test_a_session_the_engine_never_ended_gets_a_note_and_an_end_from_this_side(lines):
    _, feed = lines
    live = LiveTrace()
    for k, obj, raw in feed[:-1]:  # no end line: the engine died
        live.feed_line(k, obj, raw)
    assert not live.ended
    live.close(note=("engine_exit", {"reason": "killed by signal 9 (SIGKILL)"}))
    assert live.ended
    back = read_trace(live.path)
    assert back.header["notes"]["engine_exit"]["reason"] == "killed by signal 9 (SIGKILL)"
    assert live.record.header["notes"]["engine_exit"] == back.header["notes"]["engine_exit"]
    _same_record(live.record, back)
    ends = [json.loads(x)["type"] for x in open(live.path, "rb").read().splitlines()[-2:]]
    assert ends == ["note", "end"]


def test_a_new_header_closes_the_old_session_and_starts_a_new_file(lines):
    _, feed = lines
    live = LiveTrace()
    for k, obj, raw in feed[:-1]:
        live.feed_line(k, obj, raw)
    first = live.path
    k, obj, raw = feed[0]
    live.feed_line(k, obj, raw)
    assert live.path != first and live.record.n_steps == 0
    assert [json.loads(x)["type"] for x in open(first, "rb").read().splitlines()][-1] == "end"


def test_a_full_disk_pauses_the_autosave_and_the_record_goes_on(lines, tmp_path, monkeypatch):
    run, feed = lines
    paused = []
    blocker = tmp_path / "data"
    blocker.write_text("a file where the autosave folder should be")  # mkdir fails as on a full disk
    live = LiveTrace(on_paused=paused.append)
    for k, obj, raw in feed:
        live.feed_line(k, obj, raw)
    assert live.path is None and len(paused) == 1 and paused[0].startswith("autosave paused: cannot write")
    assert live.paused == paused[0]
    _same_record(live.record, read_trace(run))


def test_a_damaged_line_is_a_problem_not_a_crash(lines):
    _, feed = lines
    live = LiveTrace(autosave=False)
    for k, obj, raw in feed:
        if k == "steps" and obj["first"] > 0:
            cols = {name: dict(c) for name, c in obj["cols"].items()}
            cols["stored"]["data"] = "bm90IHpsaWI="  # base64 of bytes that are not zlib
            obj = dict(obj, cols=cols)
        live.feed_line(k, obj, raw)
    assert live.path is None
    assert live.problems and all(p.startswith("a steps line from the engine is damaged") for p in live.problems)
    assert live.record.n_steps == [obj for k, obj, _ in feed if k == "steps"][1]["first"]
