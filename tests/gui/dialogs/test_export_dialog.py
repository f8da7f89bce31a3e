"""File → Export report… from the window: the bundle of core.report plus the window's screenshot.

The export runs off the GUI thread (plots render in a child process); the dialog is
non-modal and says when it is done (``finished_export``).
"""

from __future__ import annotations

import json

import pytest
from PySide6 import QtGui

from kvinspect.core.trace.tracefile import read_trace
from tests.gui.helpers import headless_run, load, open_trace, send

EXPORT_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    turns = ["First question about caches, long enough to pass the window.", "Second one?"]
    return headless_run(tmp_path_factory.mktemp("run"), "tiny-mistral", turns, max_new_tokens=30)


def export(qtbot, win, folder, redact=False, screenshot=True):
    dlg = win.export_report_dialog()
    assert dlg is not None and dlg.isVisible() and not dlg.isModal()
    dlg.folder.setText(str(folder))
    dlg.redact.setChecked(redact)
    dlg.screenshot.setChecked(screenshot)
    with qtbot.waitSignal(dlg.finished_export, timeout=EXPORT_TIMEOUT_MS) as blocker:
        assert dlg.start()
        assert dlg.progress.isVisible() and not dlg.export_button.isEnabled()
    return dlg, blocker.args[0]


def test_export_an_opened_trace_with_screenshot(qtbot, window, run_dir, tmp_path):
    open_trace(qtbot, window, run_dir)
    window.viewer.set_step(window.record.n_steps // 2)
    dlg, res = export(qtbot, window, tmp_path / "bundle")
    out = tmp_path / "bundle"
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "summary.json", "trace.jsonl", "script.json", "cache.png", "memory.png",
            "window.png"} <= names
    assert (out / "trace.jsonl").read_bytes() == (run_dir / "trace.jsonl").read_bytes()  # the exact bytes
    md = (out / "report.md").read_text()
    assert "kvinspect run" in md and "--script script.json" in md and "](window.png)" in md
    assert "](cache.png)" in md and "](memory.png)" in md
    for png in ("cache.png", "memory.png", "window.png"):
        img = QtGui.QImage(str(out / png))
        assert not img.isNull() and img.width() >= 800, png
    shot = QtGui.QImage(str(out / "window.png"))
    assert (shot.width(), shot.height()) == (window.width(), window.height())
    assert "Open folder" == dlg.open_button.text() and dlg.open_button.isVisible()
    assert window.evidence_jobs == 0 and not window.tasks
    assert str(out) in dlg.status.text() and "report.md" in dlg.status.text()


def test_export_the_live_session_redacted(qtbot, window, tmp_path):
    load(qtbot, window, "tiny-llama")
    secret = "my private customer data 4242"
    send(qtbot, window, secret, max_new_tokens=6)
    send(qtbot, window, "follow-up", max_new_tokens=6)
    dlg = window.export_report_dialog()
    assert "live session (tiny-llama)" in dlg.what.text()
    dlg.redact.setChecked(True)
    assert not dlg.screenshot.isChecked()  # a screenshot would show the conversation
    dlg.plots.setChecked(False)
    dlg.folder.setText(str(tmp_path / "public"))
    with qtbot.waitSignal(dlg.finished_export, timeout=EXPORT_TIMEOUT_MS) as blocker:
        dlg.start()
    res = blocker.args[0]
    out = tmp_path / "public"
    assert res.out_dir == out and not (out / "window.png").exists() and not (out / "script.json").exists()
    for name in ("report.md", "summary.json", "trace.jsonl"):
        assert secret not in (out / name).read_text(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["redacted"] is True and len(summary["turns"]) == 2
    # The trace of a live session is written whole: it reads back clean, with every step.
    rec = read_trace(out)
    assert rec.notes == [] and rec.n_steps == window.record.n_steps
    # The session goes on after the export; while a bundle is being written from it, no turn may start.
    assert window.evidence_jobs == 0 and not window.tasks
    assert send(qtbot, window, "after the export", max_new_tokens=4).status == "ok"
    window.evidence_jobs = 1
    window.chat.input.setPlainText("wait")
    assert window.send(window.chat.request("wait")) is False
    window.evidence_jobs = 0
    window.errors.close_all()


def test_export_refuses_what_cannot_be_written(qtbot, window, tmp_path):
    # Nothing on screen yet: one line in a dialog, no export dialog.
    assert window.export_report_dialog() is None
    assert "nothing to save yet" in window.errors.messages[-1]
    window.errors.close_all()
    load(qtbot, window, "tiny-llama")
    send(qtbot, window, "hi", max_new_tokens=4)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    dlg = window.export_report_dialog()
    dlg.folder.setText(str(busy))
    with qtbot.waitSignal(dlg.failed_export, timeout=EXPORT_TIMEOUT_MS) as blocker:
        dlg.start()
    assert "not empty" in blocker.args[0] and "\n" not in blocker.args[0]
    assert (busy / "notes.txt").read_text() == "keep me" and dlg.export_button.isEnabled()
