"""Viewer mode: a trace written by ``kvinspect run`` (core ``run_script``) opened read-only, replayed step by step.

The window reads the file off the GUI thread (``viewer.opened`` says when it is on screen),
and every panel then renders as it was at the replay step; the expected values come from
the record itself (``layer_table_at``, the step series), read separately with ``read_trace``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.trace.tracefile import read_trace
from tests.gui.helpers import headless_run, load, open_trace, run_cli, send, show_panel

TURNS = ["Hello! What does a KV cache store? Tell me everything.", "Why does a sliding window stop growing?",
         "And the full layer?"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 3-turn headless run on the hybrid tiny-gemma3 (window 96: turn 2 passes it)."""
    return headless_run(tmp_path_factory.mktemp("run"), "tiny-gemma3", TURNS, max_new_tokens=40)


def open_fails(qtbot, win, path) -> str:
    with qtbot.waitSignal(win.viewer.openFailed, timeout=60_000) as blocker:
        win.open_trace(str(path))
    return blocker.args[0]


def test_open_and_replay_every_panel_at_step_k(qtbot, window, run_dir):
    rec = read_trace(run_dir)
    show_panel(qtbot, window, window.layers_dock)  # the layer table's tab in front: a hidden panel is not rendered
    open_trace(qtbot, window, run_dir)  # a run's folder: its trace.jsonl
    v = window.viewer
    assert v.mode == "view" and v.path == run_dir / "trace.jsonl"
    assert v.bar.isVisible() and "viewing trace.jsonl (read-only)" in v.source_text()
    assert window.windowTitle() == "kvinspect — viewing trace.jsonl"
    assert "trace of" in window.model_label.text() and "tiny-gemma3" in window.model_label.text()
    # Read-only: nothing can be sent, no policy can be changed; the trace's conversation is shown.
    chat = window.chat
    assert chat.read_only and not chat.input.isEnabled() and not chat.send_button.isEnabled()
    assert not chat.policy.isEnabled() and not chat.new_button.isEnabled()
    text = chat.replay.toPlainText()
    assert all(t[:20] in text for t in TURNS) and rec.turns[0].reply[:10] in text
    assert len(rec.turns) == 3 and window.record.n_steps == rec.n_steps
    assert v.bar.slider.maximum() == rec.n_steps - 1 and v.bar.turn_box.count() == 3

    ev = next(e for e in rec.events if e.kind == "window_reached")
    for k in (max(ev.step - 3, 0), rec.turns[1].first_step + 5, rec.n_steps // 2):
        v.bar.slider.setValue(k)  # as a user drags it
        window.refresh(force=True)
        assert window.step == k and v.bar.spin.value() == k
        rows = window.layers.model.rows
        want = rec.layer_table_at(k)
        assert [r["seen"] for r in rows] == [w["seen"] for w in want] == rec.seen[k].tolist()
        assert [r["stored"] for r in rows] == [w["stored"] for w in want] == rec.stored[k].tolist()
        assert [r["bytes"] for r in rows] == rec.nbytes[k].tolist()
        # Plots: data up to k, the cursor on k, the whole trace in view.
        p = window.plots
        assert all(c.isVisible() and c.value() == k for c in p.cursor)
        lo, hi = p.heat.plot.getViewBox().viewRange()[0]
        assert lo <= 0 and hi >= rec.n_steps - 1
        img = p.heat.img.image
        assert img.shape[0] <= k + 1 and int(img.max()) == int(rec.stored[: k + 1].max())
        assert p.turn_lines.positions() == [t.first_step for t in rec.turns if t.first_step <= k]
        # Events that had happened; checklists of turns that had ended.
        assert window.events.count() == sum(1 for e in rec.events if e.step <= k)
        done = [t.index for t in rec.turns if t.end_step - 1 <= k]
        show_panel(qtbot, window, window.check_dock)  # the checklist shares the layer table's tab group
        assert window.checklist.turn_box.count() == len(done)
        show_panel(qtbot, window, window.layers_dock)
        cur = rec.turn_of_step(k)
        assert v.bar.turn_box.currentData() == cur

    # The turn selector jumps to the end of a turn.
    v.bar.turn_box.setCurrentIndex(1)
    v.bar.turn_box.activated.emit(1)
    assert window.step == rec.turns[1].end_step - 1
    assert [r["stored"] for r in window.layers.model.rows] == rec.stored[rec.turns[1].end_step - 1].tolist()
    # A turn link in the conversation does the same.
    window.show_turn(0)
    assert window.step == rec.turns[0].end_step - 1

    # Back to live: no model was loaded in this window, so the start page; chat usable again once one is.
    window.back_to_live()
    assert v.mode == "" and window.record is None and not v.bar.isVisible() and not chat.read_only
    assert window.windowTitle() == "kvinspect"
    assert window.plots.pages.currentIndex() == 0


def test_viewing_keeps_the_live_session_and_back_restores_it(qtbot, window, run_dir):
    load(qtbot, window, "tiny-llama")
    t1 = send(qtbot, window, "Live turn before viewing.", max_new_tokens=6)
    live = window.record
    open_trace(qtbot, window, run_dir / "trace.jsonl")
    assert window.record is not live and not window.chat.send_button.isEnabled()
    assert not window.commands["new_chat"].isEnabled() and window.commands["back"].isEnabled()
    assert window.send(window.chat.request("not allowed")) is False
    window.errors.close_all()
    window.back_to_live()
    assert window.record is live and window.step is None and window.chat.send_button.isEnabled()
    assert t1.reply in window.chat.plain_text()  # the live transcript survived
    t2 = send(qtbot, window, "And after.", max_new_tokens=6)
    assert t2.index == 1 and t2.reused_tokens > 0
    # Loading a model while viewing goes back to the live session.
    open_trace(qtbot, window, run_dir)
    load(qtbot, window, "tiny-llama")
    assert window.viewer.mode == "" and window.record is window.info.record


def _cut_mid_line(src: Path, dst: Path) -> None:
    data = src.read_bytes()
    last_turn = data.rindex(b'{"type":"turn"')
    dst.write_bytes(data[: last_turn + 80])  # inside turn 3's closing line


def test_damaged_future_and_random_files(qtbot, window, run_dir, tmp_path):
    # Cut mid-line: opens with what is intact, a banner says what was lost.
    cut = tmp_path / "cut.jsonl"
    _cut_mid_line(run_dir / "trace.jsonl", cut)
    open_trace(qtbot, window, cut)
    rec = window.record
    assert [t.status for t in rec.turns] == ["ok", "ok", "interrupted"]
    banner = window.viewer.bar.banner
    assert banner.isVisible() and "damaged" in banner.text()
    notes = window.viewer.bar.notes()
    assert notes == rec.notes and any("cut short" in n for n in notes) and any("interrupted" in n for n in notes)
    assert all(n in banner.toolTip() for n in notes)
    assert window.errors.messages == []  # damage is not an error: it opens

    # A newer format version: refused with a dialog naming the version; the window stays as it was.
    lines = (run_dir / "trace.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["version"] = 99
    future = tmp_path / "future.jsonl"
    future.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    msg = open_fails(qtbot, window, future)
    assert "version 99" in msg and "\n" not in msg
    assert window.errors.messages[-1] == msg and window.errors.boxes[-1].text() == msg
    assert not window.errors.boxes[-1].isModal()
    assert window.viewer.path == cut  # still showing the previous trace

    # Random bytes, a missing file, a folder without a trace: one line each.
    noise = tmp_path / "noise.jsonl"
    noise.write_bytes(b"\x89PNG" + np.random.default_rng(0).bytes(4000))
    assert "not a kvinspect trace" in open_fails(qtbot, window, noise)
    assert "no trace at" in open_fails(qtbot, window, tmp_path / "missing.jsonl")
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    assert "trace.jsonl" in open_fails(qtbot, window, empty)
    assert all("\n" not in m and "Traceback" not in m for m in window.errors.messages)
    window.errors.close_all()


def test_drop_a_trace_on_the_window(qtbot, window, run_dir, tmp_path):
    mime = QtCore.QMimeData()
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(run_dir / "trace.jsonl"))])
    drop = QtGui.QDropEvent(QtCore.QPointF(5, 5), QtCore.Qt.DropAction.CopyAction, mime,
                            QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.viewer.opened, timeout=60_000):
        window.dropEvent(drop)
    assert window.viewer.mode == "view" and window.picker is None
    # A .gguf still goes to the model picker.
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(gguf))])
    window.dropEvent(QtGui.QDropEvent(QtCore.QPointF(5, 5), QtCore.Qt.DropAction.CopyAction, mime,
                                      QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier))
    assert window.picker is not None and window.picker.request().spec == str(gguf)


def test_save_trace_live_and_viewed(qtbot, window, run_dir, tmp_path):
    load(qtbot, window, "tiny-mistral")
    send(qtbot, window, "One.", max_new_tokens=8)
    send(qtbot, window, "Two.", max_new_tokens=8)
    live = window.record
    with qtbot.waitSignal(window.save_trace(str(tmp_path / "saved.jsonl")).done, timeout=60_000) as blocker:
        pass
    saved = read_trace(blocker.args[0])
    assert saved.notes == []  # written whole, with its end line: reads clean
    assert saved.n_steps == live.n_steps and np.array_equal(saved.stored, live.stored)
    assert [t.reply for t in saved.turns] == [t.reply for t in live.turns]
    assert [e.kind for e in saved.events] == [e.kind for e in live.events]
    # A viewed file is copied byte for byte, damage included.
    cut = tmp_path / "cut.jsonl"
    _cut_mid_line(run_dir / "trace.jsonl", cut)
    open_trace(qtbot, window, cut)
    with qtbot.waitSignal(window.save_trace(str(tmp_path / "copy.jsonl")).done, timeout=60_000):
        pass
    assert (tmp_path / "copy.jsonl").read_bytes() == cut.read_bytes()


def test_copy_markdown_to_the_clipboard(qtbot, window, run_dir):
    from kvinspect.core.report.md_snippets import event_markdown, layer_table_markdown, turns_markdown

    open_trace(qtbot, window, run_dir)
    rec = window.record
    clip = QtWidgets.QApplication.clipboard()
    window.commands["copy_turns"].trigger()
    assert clip.text() == turns_markdown(rec) and clip.text().startswith("| Turn | Status |")
    assert clip.text().count("\n") == 1 + len(rec.turns)
    k = rec.turns[1].first_step + 3
    window.viewer.set_step(k)
    window.commands["copy_layers"].trigger()
    assert clip.text() == layer_table_markdown(rec, k) and f"**Layers at step {k}**" in clip.text()
    # An event: the button under its explanation, and the row's context menu, copy the same Markdown.
    window.viewer.set_step(rec.n_steps - 1)
    window.refresh(force=True)
    idx = next(i for i, e in enumerate(rec.events) if e.kind == "window_reached")
    assert not window.events.copy_button.isEnabled()
    window.events.select(idx)
    assert window.events.copy_button.isEnabled()
    clip.clear()
    qtbot.mouseClick(window.events.copy_button, QtCore.Qt.MouseButton.LeftButton)
    want = event_markdown(rec.events[idx], rec)
    assert clip.text() == want and "window_reached" in want and "transformers" in want
    clip.clear()
    window.commands["copy_event"].trigger()
    assert clip.text() == want


def _cli(args, tmp_path, env_extra=None, timeout=120):
    return run_cli(["view", *args], tmp_path, timeout=timeout, **(env_extra or {}))


def test_view_cli_mistakes_exit_2_with_one_line(tmp_path, run_dir):
    noise = tmp_path / "noise.bin"
    noise.write_bytes(np.random.default_rng(1).bytes(2000).replace(b"{", b"x"))
    lines = (run_dir / "trace.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["version"] = 7
    future = tmp_path / "future.jsonl"
    future.write_text(json.dumps(head) + "\n")
    cases = [
        ([str(tmp_path / "missing.jsonl")], "no trace at"),
        ([str(noise)], "not a kvinspect trace"),
        ([str(future)], "version 7"),
        (["--follow", str(noise)], "not a kvinspect trace"),
        (["--follow", str(tmp_path / "no" / "such" / "dir")], "cannot follow"),
    ]
    for args, words in cases:
        r = _cli(args, tmp_path)
        assert r.returncode == 2, (args, r.stderr[-800:])
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("kvinspect: error: ") and words in err[0], (args, r.stderr)


def test_view_cli_opens_the_window(tmp_path, run_dir):
    r = _cli([str(run_dir)], tmp_path, {"KVINSPECT_QUIT_AFTER": "300"})
    assert r.returncode == 0, r.stderr[-1500:]
    assert "kvinspect: window shown" in r.stdout and "Traceback" not in r.stderr
    waiting = tmp_path / "later"
    waiting.mkdir()
    r = _cli(["--follow", str(waiting)], tmp_path, {"KVINSPECT_QUIT_AFTER": "300"})
    assert r.returncode == 0 and "kvinspect: window shown" in r.stdout, r.stderr[-1500:]


def test_open_viewer_entry_shows_the_record(qtbot, run_dir):
    from kvinspect.core.settings import Settings
    from kvinspect.gui.app import open_viewer

    rec = read_trace(run_dir)
    _, win = open_viewer(record=rec, path=str(run_dir / "trace.jsonl"), settings=Settings(), persist=False)
    qtbot.addWidget(win)
    qtbot.waitExposed(win)
    show_panel(qtbot, win, win.layers_dock)  # the layer table's tab in front: a hidden panel is not rendered
    assert win.viewer.mode == "view" and win.record is rec and win.step == rec.n_steps - 1
    assert win.layers.model.rows[0]["stored"] == int(rec.stored[-1, 0])


def test_autosaved_sessions_menu_opens_one(qtbot, window):
    from kvinspect.gui.windows.menus import fill_submenu

    load(qtbot, window, "tiny-llama")
    t = send(qtbot, window, "Autosaved as it runs.", max_new_tokens=5)
    actions = fill_submenu(window, "autosave")
    mine = [a for a in actions if "this session" in a.text()]
    assert len(mine) == 1 and window.info.trace_path.split("/")[-1] in mine[0].text()
    with qtbot.waitSignal(window.viewer.opened, timeout=60_000):
        mine[0].trigger()
    rec = window.record
    assert window.viewer.mode == "view" and rec.turns[0].reply == t.reply
    assert any("no end line" in n for n in rec.notes)  # the session is still open: said, not hidden
    assert window.viewer.bar.banner.isVisible()
