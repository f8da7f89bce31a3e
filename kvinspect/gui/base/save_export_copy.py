"""Evidence from the window: save the trace, export a report bundle, copy Markdown to the clipboard.

All of it is a thin layer over the core (:mod:`kvinspect.core.report.bundle`, :mod:`kvinspect.core.report.md_snippets`,
:mod:`kvinspect.core.trace.tracefile`). What is exported is :func:`current_source`: the live session, or the
trace the window is viewing or following. Writing happens off the GUI thread
(:class:`~kvinspect.gui.base.background_jobs.BackgroundTask`: report plots take seconds in a child process), and while it
runs nothing may append to the record being written: a live session refuses new turns
(``MainWindow.send``), a followed file is not polled.

A live session is written fresh from its record (:func:`~kvinspect.core.trace.tracefile.write_trace`),
not copied from its autosave: the autosave has no ``end`` line while the session is open, so a
copy would read as "did not close cleanly". A trace opened from a file is copied byte for byte,
damage included (that is the evidence).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.errors import KvInspectError
from kvinspect.gui.base.background_jobs import BackgroundTask


@dataclass
class Source:
    """What File → Save / Export works on."""

    record: object  # TraceRecord
    trace_file: Path | None  # copied verbatim (a file opened for viewing); None: written from the record
    label: str  # for dialogs: "live session (tiny-gemma3)", "trace.jsonl"
    live: bool
    name: str  # short, for default file names


def current_source(win) -> Source:
    """The record on screen and where it came from; raises KvInspectError when there is nothing to save."""
    v = win.viewer
    if v.mode and v.record is not None:
        return Source(v.record, v.exact_file, v.path.name if v.path else "trace", False,
                      _slug(((v.record.header.get("model") or {}).get("name")) or "trace"))
    if win.info is None or win.info.record is None:
        raise KvInspectError("nothing to save yet: load a model and chat, or open a trace (File → Open trace…)")
    if win.controller.busy == "turn":
        raise KvInspectError("a turn is running: wait for it to finish (or stop it, Esc), then save or export")
    return Source(win.info.record, None, f"live session ({win.info.name})", True, _slug(win.info.name))


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(name)).name).strip("-.")[:60] or "trace"


def default_report_dir(name: str) -> Path:
    """``~/kvinspect-reports/<date-time>-<model>``: a new folder per export."""
    return Path.home() / "kvinspect-reports" / f"{datetime.now():%Y%m%d-%H%M%S}-{name}"


def window_png(win) -> bytes:
    """The window as PNG bytes, rendered up to date first (UI thread only)."""
    win.refresh(force=True)
    QtWidgets.QApplication.processEvents()
    win.refresh(force=True)
    buf = QtCore.QBuffer()
    buf.open(QtCore.QIODevice.OpenModeFlag.WriteOnly)
    win.grab().toImage().save(buf, "PNG")
    return bytes(buf.data())


class _Hold:
    """While a job reads ``source``: no new turn (live) / no poll (follow); released once."""

    def __init__(self, win, source: Source):
        self.win, self.source, self.held = win, source, True
        if source.live:
            win.evidence_jobs += 1
        else:
            win.viewer.pause(True)

    def release(self) -> None:
        if self.held:
            self.held = False
            if self.source.live:
                self.win.evidence_jobs -= 1
            else:
                self.win.viewer.pause(False)


def _start(win, fn, name: str, source: Source) -> BackgroundTask:
    hold = _Hold(win, source)
    task = BackgroundTask(fn, name, parent=win)
    task.hold = hold  # PySide keeps only a weak reference to a plain object's bound method: keep it here

    def finished(*_):
        hold.release()
        if task in win.tasks:
            win.tasks.remove(task)

    task.done.connect(finished)
    task.failed.connect(finished)
    win.tasks.append(task)
    return task.start()


def save_trace(win, dest: str | Path) -> BackgroundTask:
    """Write the trace on screen to ``dest``; ``done(Path)`` / ``failed(message)``."""
    from kvinspect.core.trace.tracefile import write_trace

    src = current_source(win)
    out = Path(dest).expanduser()
    if out.is_dir():
        out = out / "trace.jsonl"

    def job() -> Path:
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            if src.trace_file is not None and src.trace_file.is_file():
                if out.exists() and out.samefile(src.trace_file):
                    return out  # saving a file onto itself: nothing to do
                shutil.copyfile(src.trace_file, out)
            else:
                write_trace(out, src.record)
        except OSError as exc:
            raise KvInspectError(f"cannot write {out}: {exc.strerror or exc}") from None
        return out

    return _start(win, job, "save-trace", src)


def export_report(win, out_dir: str | Path, *, redact: bool = False, screenshot: bool = True,
                  plots: bool = True) -> BackgroundTask:
    """The bug-report bundle of what is on screen; ``done(ReportResult)`` / ``failed(message)``.

    The screenshot is grabbed here, on the GUI thread, before the job starts.
    """
    from kvinspect.child_render import render_in_child
    from kvinspect.core.report.bundle import write_report

    src = current_source(win)
    png = window_png(win) if screenshot else None
    out = Path(out_dir).expanduser()

    def job():
        try:
            # Plots in a child process: this job runs off the GUI thread, where no widget may be drawn.
            return write_report(src.record, out, redact=redact, plots_enabled=plots, screenshot=png,
                                trace_file=src.trace_file, renderer=render_in_child)
        except OSError as exc:
            raise KvInspectError(f"cannot write the report to {out}: {exc.strerror or exc}") from None

    return _start(win, job, "export-report", src)


# -- clipboard -----------------------------------------------------------------------------------
def _copy(win, text: str, what: str) -> str:
    QtWidgets.QApplication.clipboard().setText(text)
    win.statusBar().showMessage(f"copied {what} as Markdown", 4000)
    return text


def _shown_record(win):
    if win.record is None:
        raise KvInspectError("nothing to copy yet: load a model and chat, or open a trace")
    return win.record


def copy_turns(win) -> str:
    """The per-turn table of the record on screen."""
    from kvinspect.core.report.md_snippets import turns_markdown

    return _copy(win, turns_markdown(_shown_record(win)), "the per-turn table")


def copy_layers(win) -> str:
    """The per-layer table at the step shown (the replay step, or the latest)."""
    from kvinspect.core.report.md_snippets import layer_table_markdown

    rec = _shown_record(win)
    if rec.n_steps == 0:
        raise KvInspectError("no step recorded yet: nothing to copy")
    step = rec.n_steps - 1 if win.step is None else min(win.step, rec.n_steps - 1)
    return _copy(win, layer_table_markdown(rec, step), f"the layers at step {step:,}")


def copy_event(win, index: int | None = None) -> str:
    """One event's explanation (the selected one by default)."""
    from kvinspect.core.report.md_snippets import event_markdown

    rec = _shown_record(win)
    idx = win.events.selected_index() if index is None else index
    if idx is None or not 0 <= idx < len(rec.events):
        raise KvInspectError("select an event first (Events panel)")
    return _copy(win, event_markdown(rec.events[idx], rec), f"event {rec.events[idx].kind}")


def open_folder(path: str | Path) -> bool:
    return QtGui.QDesktopServices.openUrl(QtCore.QUrl.fromLocalFile(str(path)))
