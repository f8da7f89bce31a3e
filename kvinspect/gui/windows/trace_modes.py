"""Viewer and follow modes: the window shows a saved trace (read-only, with replay) or a growing one.

The window renders whatever ``(record, step)`` it is given (:meth:`MainWindow.set_record`);
this module only changes the source. *View* mode shows a record read from a file (off the
GUI thread: a 100k-step trace takes a second or two to decode) with a replay slider: every
panel then renders as it was at that step (plots up to the step with a cursor line, events
that had happened, the checklist of finished turns, ``record.layer_table_at(step)`` in the
layer table, the conversation up to that turn). *Follow* mode reads a file another process
is appending to (:mod:`kvinspect.gui.engine_link.trace_follower`) and shows its newest step, or a step the user pins with the
slider. The live session keeps running underneath; "Back to live session" shows it again.
"""

from __future__ import annotations

import html
import logging
import time
from pathlib import Path

from PySide6 import QtCore

from kvinspect.core.trace.follow import FollowSource, FollowStatus, check_follow_target
from kvinspect.core.trace.tracefile import read_trace, trace_path
from kvinspect.core.units import fmt_count
from kvinspect.gui.base.background_jobs import BackgroundTask
from kvinspect.gui.engine_link.trace_follower import TraceFollower
from kvinspect.gui.panels.viewer_bar import ViewerBar

log = logging.getLogger(__name__)


def _ago(t: float | None) -> str:
    if t is None:
        return "no data yet"
    s = max(0, int(time.time() - t))
    if s < 60:
        return f"last update {s} s ago"
    if s < 3600:
        return f"last update {s // 60} min {s % 60:02d} s ago"
    return f"last update {s // 3600} h {s // 60 % 60:02d} min ago"


class TraceViewer(QtCore.QObject):
    """The window's trace modes: ``mode`` is "" (live session), "view" or "follow"."""

    opened = QtCore.Signal(str)  # a trace file is on screen (view mode)
    openFailed = QtCore.Signal(str)  # one-line reason (also shown in a dialog)
    followPolled = QtCore.Signal(object)  # FollowStatus, after every poll (GUI thread)
    modeChanged = QtCore.Signal(str)  # "", "view" or "follow": the window's actions and status follow it

    def __init__(self, win):
        super().__init__(win)
        self.win = win
        self.mode = ""
        self.record = None
        self.path: Path | None = None  # the file shown or followed
        self.target: Path | None = None  # what Follow was given (a file or a folder)
        self.exact_file: Path | None = None  # a file opened as is: Save/Export copy its bytes
        self.step: int | None = None  # None: the newest step (follow mode's "Latest")
        self.stopped_following = False
        self.follower: TraceFollower | None = None
        self.status: FollowStatus | None = None
        self.messages: list[str] = []
        self._reading: BackgroundTask | None = None
        self.bar = ViewerBar()
        self.bar.setVisible(False)
        self.bar.stepRequested.connect(self.set_step)
        self.bar.turnRequested.connect(self.show_turn)
        self.bar.latestRequested.connect(lambda: self.set_step(None))
        self.bar.stopFollowRequested.connect(self.stop_follow)
        self.bar.backRequested.connect(self.back_to_live)
        self._clock = QtCore.QTimer(self)  # "last update N s ago" keeps counting between polls
        self._clock.setInterval(1000)
        self._clock.timeout.connect(self._update_source)

    # -- view mode ----------------------------------------------------------------------------
    def open(self, path) -> BackgroundTask | None:
        """Read ``path`` (a trace file or a folder holding trace.jsonl) off the GUI thread, then show it."""
        if self._reading is not None and self._reading.running:
            self.win.statusBar().showMessage("still reading the previous trace…", 4000)
            return None
        p = Path(path).expanduser()
        task = BackgroundTask(lambda: read_trace(p), "read-trace", parent=self)
        task.done.connect(lambda rec: self.show(rec, trace_path(p)))
        task.failed.connect(self._open_failed)
        self.win.statusBar().showMessage(f"reading {p}…")
        self._reading = task.start()
        return task

    def _open_failed(self, message: str) -> None:
        self.win.statusBar().clearMessage()
        self.win.errors.report("Could not open the trace", message)
        self.openFailed.emit(message)

    def show(self, record, path, exact: bool = True) -> None:
        """Show ``record`` (read from ``path``) read-only, at its last step."""
        self._stop_follower()
        self.record, self.path, self.target = record, Path(path), None
        self.exact_file = self.path if exact else None
        self.stopped_following = False
        self._enter("view")
        self.set_step(record.n_steps - 1 if record.n_steps else None)
        self.win.statusBar().showMessage(f"opened {self.path}", 5000)
        self.opened.emit(str(self.path))

    # -- follow mode --------------------------------------------------------------------------
    def follow(self, target, source: FollowSource | None = None) -> TraceFollower:
        """Follow a trace file, or the newest trace in a folder, as another process writes it.

        ``source``: one already polled (``kvinspect view --follow`` checks the file first).
        """
        p = check_follow_target(target)
        self._stop_follower()
        source = source or FollowSource(p)
        self.follower = TraceFollower(source, parent=self)
        self.follower.recordChanged.connect(self._on_follow_record)
        self.follower.polled.connect(self._on_polled)
        self.follower.failed.connect(self._on_follow_failed)
        self.record, self.path, self.target = source.record, source.path, p
        self.exact_file = None
        self.step = None
        self.stopped_following = False
        self.status = None
        self._enter("follow")
        self._clock.start()
        self.follower.start()
        return self.follower

    def _on_follow_record(self, record, path: str) -> None:
        first = self.record is None
        self.record, self.path = record, Path(path)
        if not first:
            self.step = None  # another file: start at its newest step
        self.win.plots.set_empty_message(None)
        self.win.set_record(record, self.step)
        self.win.plots.set_follow(True)
        self._title()
        self.update()

    def _on_polled(self, st: FollowStatus) -> None:
        self.status = st
        if st.message:
            self.messages.append(st.message)
            self.win.statusBar().showMessage(st.message, 10_000)
        if st.changed or st.message:
            self.update()
        self.followPolled.emit(st)

    def _on_follow_failed(self, message: str) -> None:
        self.win.errors.report("Cannot follow the trace", message)
        self.messages.append(message)
        self.stop_follow()

    def stop_follow(self) -> None:
        """Stop reading; what was read stays on screen as a read-only replay."""
        if self.mode != "follow":
            return
        self._stop_follower()
        if self.record is None:
            self.back_to_live()
            return
        self.stopped_following = True
        self.mode = "view"
        self.bar.set_mode("view")
        self.set_step(self.step if self.step is not None else self.record.n_steps - 1)
        self._title()
        self.modeChanged.emit(self.mode)

    def pause(self, on: bool) -> None:
        if self.follower is not None:
            self.follower.pause(on)

    # -- both -----------------------------------------------------------------------------------
    def set_step(self, step: int | None) -> None:
        """Show the trace as it was at ``step`` (None: the newest step, growing in follow mode)."""
        rec = self.record
        if not self.mode or rec is None:
            return
        n = rec.n_steps
        if step is not None:
            step = max(0, min(int(step), n - 1)) if n else None
        w = self.win
        self.step = step
        w.step = step
        p = w.plots
        if step is None:
            p.set_follow(True)
            p.show_step(None)
        else:
            if p.follow:
                # Replay: the whole trace stays in view, drawn up to the step, with a cursor line on it.
                p.set_follow(False)
                p.heat.plot.setXRange(0, max(64, n), padding=0)
            p.show_step(step)
        w.refresh()
        self.update()

    def show_turn(self, index: int) -> None:
        """Jump to the end of turn ``index`` (its last forward pass)."""
        rec = self.record
        if rec is None or not 0 <= index < len(rec.turns):
            return
        with rec.lock:
            t = rec.turns[index]
            nxt = rec.turns[index + 1].first_step if index + 1 < len(rec.turns) else rec.n_steps
            end = t.end_step if t.end_step > t.first_step else nxt
        self.set_step(max(end - 1, t.first_step))

    def back_to_live(self) -> None:
        """Leave the trace: the window's own session (or the empty start page) again."""
        self._stop_follower()
        self.mode = ""
        self.record = self.path = self.target = self.exact_file = None
        self.step = None
        self.bar.setVisible(False)
        self.bar.set_notes([])
        w = self.win
        w.chat.set_read_only(False)
        w.plots.set_empty_message(None)
        w.set_record(w.info.record if w.info is not None else None, None)
        w.plots.set_follow(True)
        self.modeChanged.emit("")  # the window updates its actions and status from it
        self._title()

    def update(self) -> None:
        """Bring the bar and the conversation up to date (the paint clock calls this 2 to 10 times a second)."""
        if not self.mode:
            return
        rec = self.record
        if rec is None:
            self.bar.set_steps(0, None)
            self.bar.set_turns([], None)
        else:
            with rec.lock:
                n, turns, notes = rec.n_steps, list(rec.turns), list(rec.notes)
            self.bar.set_steps(n, self.step)
            self.bar.set_turns(turns, self.step)
            self.bar.set_notes(notes)
            self.win.chat.show_record(rec, self.step, growing=self.mode == "follow")
        self._update_source()

    def shutdown(self) -> None:
        self._stop_follower()
        self._clock.stop()
        if self._reading is not None:
            self._reading.wait()

    # -- internals ------------------------------------------------------------------------------
    def _enter(self, mode: str) -> None:
        self.mode = mode
        w = self.win
        self.bar.set_mode(mode)
        self.bar.setVisible(True)
        name = self.path.name if self.path is not None else str(self.target)
        w.chat.set_read_only(True, f"{'following' if mode == 'follow' else 'viewing'} {name}")
        if self.record is None:
            w.plots.set_empty_message(
                "Waiting for a trace",
                f"Following <tt>{html.escape(str(self.target))}</tt>: the plots start with the first forward pass "
                f"the observed program writes there (<tt>kvinspect trace --out DIR -- python your_script.py</tt>, "
                f"or <tt>kvinspect.observe(model, trace=DIR)</tt>).")
        else:
            w.plots.set_empty_message(None)
        w.set_record(self.record, self.step)
        self.modeChanged.emit(mode)  # the window updates its actions and status from it
        self._title()
        self.update()

    def _stop_follower(self) -> None:
        if self.follower is not None:
            self.follower.stop()
            self.follower.deleteLater()
            self.follower = None
        self._clock.stop()

    def _title(self) -> None:
        from kvinspect.gui.panels.model_line import model_summary, trace_model_summary

        w = self.win
        if self.mode and self.record is not None:
            w.model_label.setText(trace_model_summary(self.record))
        elif w.info is not None:
            w.model_label.setText(model_summary(w.info))
        else:
            w.model_label.setText("no model loaded")
        if self.mode == "view":
            w.setWindowTitle(f"kvinspect — viewing {self.path.name if self.path else 'trace'}")
        elif self.mode == "follow":
            w.setWindowTitle(f"kvinspect — following {(self.path or self.target).name}")
        else:
            w.setWindowTitle(f"kvinspect — {w.info.name}" if w.info is not None else "kvinspect")

    def source_text(self) -> str:
        """The bar's first line, as plain text (tests, the status line)."""
        rec = self.record
        counts = ""
        if rec is not None:
            counts = f" · {fmt_count(rec.n_steps, 'step')} · {fmt_count(len(rec.turns), 'turn')}"
        if self.mode == "follow":
            if rec is None:
                where = self.path or self.target
                return f"following {where} · waiting for a trace to appear"
            ended = " · the writer closed the trace" if self.status is not None and self.status.ended else ""
            ago = _ago(self.status.last_change if self.status else None)
            return f"following {self.path.name} · {ago}{counts}{ended}"
        if self.mode == "view":
            how = "read-only, stopped following" if self.stopped_following else "read-only"
            return f"viewing {self.path.name} ({how}){counts}"
        return ""

    def _update_source(self) -> None:
        if not self.mode:
            return
        text = html.escape(self.source_text())
        name = (self.path or self.target).name if (self.path or self.target) else ""
        if name:
            text = text.replace(html.escape(name), f"<b>{html.escape(name)}</b>", 1)
        self.bar.set_source_text(text, str(self.path or self.target or ""))
