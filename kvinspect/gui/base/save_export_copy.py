"""Evidence from the window: save the trace, export a report bundle, Markdown for the clipboard.

All of it is a thin layer over the core (:mod:`kvinspect.core.report.bundle`, :mod:`kvinspect.core.report.md_snippets`,
:mod:`kvinspect.core.trace.tracefile`), given what it acts on: a :class:`Source` (the live session, or the
trace the window is viewing or following; the window's ``current_source()``). Writing happens off the GUI thread
(:class:`~kvinspect.gui.base.background_jobs.BackgroundTask`: report plots take seconds in a child process), and while it
runs nothing may append to the record being written (:class:`EvidenceJobs`): a live session refuses new
turns (``MainWindow.send``), a followed file is not polled.

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
from typing import Protocol

from PySide6 import QtCore, QtGui

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


class EvidenceJobs(Protocol):
    """Who runs the jobs (the window): told when a job starts reading ``source`` and when it ended, so that
    no new turn (live) or poll (follow) changes the record meanwhile, and the job is joined at shutdown."""

    def job_started(self, task: BackgroundTask, source: Source) -> None: ...

    def job_ended(self, task: BackgroundTask, source: Source) -> None: ...


def slug(name: str) -> str:
    """A name fit for a file name: a model's name, a path's last part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(name)).name).strip("-.")[:60] or "trace"


def default_report_dir(name: str) -> Path:
    """``~/kvinspect-reports/<date-time>-<model>``: a new folder per export."""
    return Path.home() / "kvinspect-reports" / f"{datetime.now():%Y%m%d-%H%M%S}-{name}"


def _start(fn, name: str, source: Source, jobs: EvidenceJobs, parent) -> BackgroundTask:
    task = BackgroundTask(fn, name, parent=parent)
    jobs.job_started(task, source)
    ended = []

    def finished(*_):
        if not ended:  # once, whichever of done/failed came
            ended.append(True)
            jobs.job_ended(task, source)

    task.done.connect(finished)
    task.failed.connect(finished)
    return task.start()


def save_trace(source: Source, dest: str | Path, jobs: EvidenceJobs, parent=None) -> BackgroundTask:
    """Write ``source`` to ``dest`` off the GUI thread; ``done(Path)`` / ``failed(message)``."""
    from kvinspect.core.trace.tracefile import write_trace

    out = Path(dest).expanduser()
    if out.is_dir():
        out = out / "trace.jsonl"

    def job() -> Path:
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            if source.trace_file is not None and source.trace_file.is_file():
                if out.exists() and out.samefile(source.trace_file):
                    return out  # saving a file onto itself: nothing to do
                shutil.copyfile(source.trace_file, out)
            else:
                write_trace(out, source.record)
        except OSError as exc:
            raise KvInspectError(f"cannot write {out}: {exc.strerror or exc}") from None
        return out

    return _start(job, "save-trace", source, jobs, parent)


def export_report(source: Source, out_dir: str | Path, jobs: EvidenceJobs, parent=None, *, redact: bool = False,
                  screenshot: bytes | None = None, plots: bool = True) -> BackgroundTask:
    """The bug-report bundle of ``source`` (with the window's ``screenshot`` PNG, if given), off the GUI thread;
    ``done(ReportResult)`` / ``failed(message)``."""
    from kvinspect.child_render import render_in_child
    from kvinspect.core.report.bundle import write_report

    out = Path(out_dir).expanduser()

    def job():
        try:
            # Plots in a child process: this job runs off the GUI thread, where no widget may be drawn.
            return write_report(source.record, out, redact=redact, plots_enabled=plots, screenshot=screenshot,
                                trace_file=source.trace_file, renderer=render_in_child)
        except OSError as exc:
            raise KvInspectError(f"cannot write the report to {out}: {exc.strerror or exc}") from None

    return _start(job, "export-report", source, jobs, parent)


# -- Markdown for the clipboard: (text, what it is) -------------------------------------------------
def _recorded(record):
    if record is None:
        raise KvInspectError("nothing to copy yet: load a model and chat, or open a trace")
    return record


def turns_text(record) -> tuple[str, str]:
    """The per-turn table of ``record``."""
    from kvinspect.core.report.md_snippets import turns_markdown

    return turns_markdown(_recorded(record)), "the per-turn table"


def layers_text(record, step: int | None) -> tuple[str, str]:
    """The per-layer table at ``step`` (None: the latest)."""
    from kvinspect.core.report.md_snippets import layer_table_markdown

    rec = _recorded(record)
    if rec.n_steps == 0:
        raise KvInspectError("no step recorded yet: nothing to copy")
    step = rec.n_steps - 1 if step is None else min(step, rec.n_steps - 1)
    return layer_table_markdown(rec, step), f"the layers at step {step:,}"


def event_text(record, index: int | None) -> tuple[str, str]:
    """Event ``index``'s explanation."""
    from kvinspect.core.report.md_snippets import event_markdown

    rec = _recorded(record)
    if index is None or not 0 <= index < len(rec.events):
        raise KvInspectError("select an event first (Events panel)")
    return event_markdown(rec.events[index], rec), f"event {rec.events[index].kind}"


def open_folder(path: str | Path) -> bool:
    return QtGui.QDesktopServices.openUrl(QtCore.QUrl.fromLocalFile(str(path)))
