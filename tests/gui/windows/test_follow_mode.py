"""Follow mode: the window reads a trace another writer appends to, with real sessions writing real traces.

The writer here is a core ``ChatSession`` on a tiny model, run on the test's thread between
waits (the follower polls on its own thread meanwhile); what the window shows is compared
with the writer's own record. The ``FollowSource`` tests drive the poll logic directly,
including what synced folders do (a longer copy renamed over the file) and a rerun that
rewrites the file.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from kvinspect.core.errors import TraceError
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings
from kvinspect.core.trace.follow import FollowSource, check_follow_target
from tests.conftest import load_cached
from tests.gui.helpers import show_panel

WAIT_MS = 30_000


def session(path, tokens: int = 12, model: str = "tiny-mistral") -> ChatSession:
    return ChatSession(load_cached(model), SessionOptions(settings=GenerationSettings(max_new_tokens=tokens)),
                       trace_path=path)


def test_follow_picks_up_turns_appended_after_it_opened(qtbot, window, tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    show_panel(qtbot, window, window.layers_dock)  # the layer table's tab in front: a hidden panel is not rendered
    window.follow_trace(str(folder))  # nothing there yet: it waits
    v = window.viewer
    assert v.mode == "follow" and v.record is None and "waiting for a trace" in v.source_text()
    assert window.plots.pages.currentIndex() == 0 and "Waiting for a trace" in window.plots.empty_text.text()
    assert not window.chat.send_button.isEnabled() and v.bar.stop_button.isVisible()

    s = session(folder / "trace.jsonl", tokens=70)  # window 64: turn 1 reaches it
    try:
        s.run_turn("A first message, written while the window follows the folder.")
        qtbot.waitUntil(lambda: v.record is not None and len(v.record.turns) == 1
                        and v.record.turns[0].status == "ok", timeout=WAIT_MS)
        qtbot.waitUntil(lambda: window.events.count() == len(s.record.events) > 0, timeout=WAIT_MS)
        assert window.windowTitle() == "kvinspect — following trace.jsonl"
        s.run_turn("A second one, appended after the window opened.")
        qtbot.waitUntil(lambda: len(v.record.turns) == 2 and v.record.turns[1].status == "ok", timeout=WAIT_MS)
        qtbot.waitUntil(lambda: v.bar.turn_box.count() == 2 and window.layers.model.rows
                        and window.layers.model.rows[0]["seen"] == int(s.record.seen[-1, 0]), timeout=WAIT_MS)
        rec = v.record
        assert rec.n_steps == s.record.n_steps and np.array_equal(rec.stored, s.record.stored)
        assert [t.reply for t in rec.turns] == [t.reply for t in s.record.turns]
        window.refresh(force=True)
        assert window.plots.series.n == rec.n_steps
        assert [r["stored"] for r in window.layers.model.rows] == s.record.stored[-1].tolist()
        text = v.source_text()
        assert text.startswith("following trace.jsonl · last update") and f"{rec.n_steps:,} steps" in text
        assert "2 turns" in text and s.record.turns[1].reply[:8] in window.chat.replay.toPlainText()
        assert window.step is None and v.bar.latest.isChecked()

        # Pinning a step while it grows: the replay stays there; Latest follows again.
        k = rec.turns[1].first_step
        v.bar.slider.setValue(k)
        assert window.step == k and not v.bar.latest.isChecked()
        s.run_turn("Third, while a step is pinned.")
        qtbot.waitUntil(lambda: len(v.record.turns) == 3 and v.record.turns[2].status == "ok", timeout=WAIT_MS)
        qtbot.waitUntil(lambda: v.bar.slider.maximum() == v.record.n_steps - 1, timeout=WAIT_MS)
        assert window.step == k and [r["seen"] for r in window.layers.model.rows] == rec.seen[k].tolist()
        v.bar.latest.setChecked(True)
        assert window.step is None
    finally:
        s.close()
    qtbot.waitUntil(lambda: v.status is not None and v.status.ended, timeout=WAIT_MS)
    assert "the writer closed the trace" in v.source_text()

    # A newer trace appearing in the folder is switched to, and said so.
    s2 = session(folder / "trace-second.jsonl", model="tiny-llama")
    try:
        s2.run_turn("Another program, another model.")
        qtbot.waitUntil(lambda: v.path is not None and v.path.name == "trace-second.jsonl"
                        and v.record is not None and len(v.record.turns) == 1, timeout=WAIT_MS)
    finally:
        s2.close()
    assert any("switched to trace-second.jsonl" in m for m in v.messages)
    assert window.record is v.record and window.record.n_layers == 4

    # Stop following: what was read stays, read-only.
    v.stop_follow()
    assert v.mode == "view" and v.follower is None and "stopped following" in v.source_text()
    # The bar takes the record's length at the window's next paint, not synchronously.
    qtbot.waitUntil(lambda: v.bar.slider.isEnabled(), timeout=WAIT_MS)
    assert not v.bar.stop_button.isVisible()


def test_follow_a_file_that_appears_later_from_a_crashed_writer(qtbot, window, tmp_path):
    # What a writer killed inside turn 2 leaves: turn 2 started, some of its steps, no closing line, no end.
    full = tmp_path / "full.jsonl"
    s = session(full, tokens=8, model="tiny-llama")
    try:
        s.run_turn("hello")
        s.run_turn("and again")
    finally:
        s.close()
    data = full.read_bytes()
    crashed = data[: data.rindex(b'{"type":"turn"')]
    path = tmp_path / "later" / "trace.jsonl"
    path.parent.mkdir()
    window.follow_trace(str(path))  # not there yet
    v = window.viewer
    assert v.mode == "follow" and v.record is None
    tmp = path.with_suffix(".part")
    tmp.write_bytes(crashed)
    os.replace(tmp, path)
    qtbot.waitUntil(lambda: v.record is not None and len(v.record.turns) == 2, timeout=WAIT_MS)
    rec = v.record
    assert [t.status for t in rec.turns] == ["ok", "running"]  # a growing file is not a damaged one
    assert rec.n_steps > rec.turns[1].first_step and not v.bar.banner.isVisible()
    assert "(generating…)" in window.chat.replay.toPlainText()
    window.back_to_live()
    assert v.follower is None and v.mode == ""


def test_follow_refuses_what_is_not_a_trace(qtbot, window, tmp_path):
    bad = tmp_path / "model.jsonl"
    bad.write_bytes(b"GGUF\x03\x00binary")
    with qtbot.waitSignal(window.errors.shown, timeout=WAIT_MS) as blocker:
        window.follow_trace(str(bad))
    assert "not a kvinspect trace" in blocker.args[1]
    qtbot.waitUntil(lambda: window.viewer.mode == "", timeout=WAIT_MS)  # nothing read: back to live
    window.errors.close_all()
    assert window.follow_trace(str(tmp_path / "no" / "such" / "place")) is None
    assert "cannot follow" in window.errors.messages[-1]
    window.errors.close_all()


# -- FollowSource, without a window -------------------------------------------------------------------
def test_source_tolerates_partial_lines_and_synced_copies(tmp_path):
    src = tmp_path / "writer" / "trace.jsonl"  # where the program writes
    dst = tmp_path / "synced" / "trace.jsonl"  # what a sync tool keeps up to date elsewhere
    dst.parent.mkdir()
    s = session(src, tokens=6, model="tiny-llama")

    def sync(cut: int = 0) -> None:
        data = src.read_bytes()
        tmp = dst.with_suffix(".tmp")
        tmp.write_bytes(data[: len(data) - cut] if cut else data)
        os.replace(tmp, dst)  # a new inode, as rsync/Syncthing do

    follow = FollowSource(dst.parent)
    assert follow.poll().path is None  # nothing yet
    try:
        s.run_turn("one")
        sync(cut=25)  # mid-line
        st = follow.poll()
        rec = st.record
        assert rec is not None and st.path == dst and len(rec.turns) == 1 and rec.turns[0].status == "running"
        sync()
        st = follow.poll()
        assert st.record is None and st.changed and rec.turns[0].status == "ok"  # same record, completed
        s.run_turn("two")
        sync()
        st = follow.poll()
        assert st.message is None and st.record is None and len(rec.turns) == 2
        assert rec.n_steps == s.record.n_steps and np.array_equal(rec.seen, s.record.seen)
        assert not follow.poll().changed  # nothing new: nothing read
    finally:
        s.close()
    # A rerun rewrites the file: another header, so reading starts over (and says so).
    shutil.rmtree(src.parent)
    s2 = session(src, tokens=4, model="tiny-llama")
    try:
        s2.run_turn("a new run")
    finally:
        s2.close()
    sync()
    st = follow.poll()
    assert st.record is not None and st.record is not rec and len(st.record.turns) == 1
    assert st.message and "rewritten" in st.message


def test_source_refusals(tmp_path):
    with pytest.raises(TraceError, match="cannot follow"):
        check_follow_target(tmp_path / "a" / "b" / "c")
    assert check_follow_target(tmp_path / "later.jsonl") == tmp_path / "later.jsonl"
    future = tmp_path / "future.jsonl"
    future.write_text('{"type":"header","format":"kvinspect-trace","version":3,"n_layers":2}\n')
    with pytest.raises(TraceError, match="version 3"):
        FollowSource(future).poll()


def test_follow_kvinspect_trace_of_a_user_program_in_another_process(qtbot, window, tmp_path):
    """The observed program's setup: `kvinspect trace --out DIR -- python program.py` in one process, the window following DIR."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "traced"  # created by `kvinspect trace` once it starts
    window.follow_trace(str(out))
    v = window.viewer
    assert v.mode == "follow" and "waiting" in v.source_text()
    env = dict(os.environ, KVINSPECT_DATA_DIR=str(tmp_path / "data"), KVINSPECT_CONFIG_DIR=str(tmp_path / "cfg"))
    proc = subprocess.Popen([sys.executable, "-m", "kvinspect", "trace", "--out", str(out), "--", sys.executable,
                             str(root / "resources" / "examples" / "mistake_cache_in_loop.py"), "--model",
                             "tiny-mistral"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        qtbot.waitUntil(lambda: v.record is not None and len(v.record.turns) == 3
                        and all(t.status == "ok" for t in v.record.turns), timeout=120_000)
        qtbot.waitUntil(lambda: sum(e.kind == "cache_recreated" for e in v.record.events) == 2, timeout=WAIT_MS)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-1500:]
    qtbot.waitUntil(lambda: v.status is not None and v.status.ended, timeout=WAIT_MS)
    window.refresh(force=True)
    assert window.events.count() == len(v.record.events) and v.path == out / "trace.jsonl"
    assert "cache_recreated" in {window.events.tree.topLevelItem(i).text(3) for i in range(window.events.count())}


def test_source_says_once_that_the_followed_file_was_deleted(tmp_path):
    path = tmp_path / "trace.jsonl"
    s = session(path, tokens=4, model="tiny-llama")
    try:
        s.run_turn("one")
    finally:
        s.close()
    kept = path.read_bytes()
    follow = FollowSource(path)
    rec = follow.poll().record
    assert rec is not None and len(rec.turns) == 1
    path.unlink()
    st = follow.poll()
    assert st.message == "trace.jsonl: the file was deleted; waiting for it" and st.path == path
    assert follow.poll().message is None  # said once, not every poll
    assert follow.record is rec and len(rec.turns) == 1  # what was read stays
    path.write_bytes(kept)  # put back as it was: the same trace, read on
    st = follow.poll()
    assert st.message and "is back" in st.message and follow.record is rec
