"""Follow a trace that another process is writing: File → Follow… and ``kvinspect view --follow``.

:class:`TraceFollower` polls a :class:`~kvinspect.core.trace.follow.FollowSource` on its own thread (a read
on a network mount can stall for seconds; the window must not) and reports on the GUI
thread. The reader appends to its record under ``record.lock``, exactly as a live session's
live trace does; a poll that read something marks the window dirty, like a streamed line. Only
appended bytes are read at each poll (every :data:`POLL_MS`).
"""

from __future__ import annotations

import logging
import threading

from PySide6 import QtCore

from kvinspect.core.errors import TraceError
from kvinspect.core.trace.follow import FollowSource, FollowStatus

log = logging.getLogger(__name__)

POLL_MS = 400


class _Poller(QtCore.QObject):
    """Lives on the follower's thread: a timer there polls the source."""

    polled = QtCore.Signal(object)  # FollowStatus
    failed = QtCore.Signal(str)

    def __init__(self, source: FollowSource, interval_ms: int):
        super().__init__()
        self.source = source
        self.interval_ms = interval_ms
        self.paused = threading.Event()
        self.timer: QtCore.QTimer | None = None
        self._io_error: str | None = None

    @QtCore.Slot()
    def start(self) -> None:
        self.timer = QtCore.QTimer(self)
        self.timer.setInterval(self.interval_ms)
        self.timer.timeout.connect(self.poll)
        self.timer.start()
        self.poll()

    @QtCore.Slot()
    def poll(self) -> None:
        if self.paused.is_set():
            return
        try:
            st = self.source.poll()
        except TraceError as exc:
            self.timer.stop()
            self.failed.emit(str(exc))
            return
        except MemoryError:
            self.timer.stop()
            self.failed.emit(f"{self.source.path or self.source.target}: not enough memory to read it; "
                             f"following stopped")
            return
        except OSError as exc:
            # A mount that went away for a moment: say so once, keep trying.
            msg = f"cannot read {self.source.path or self.source.target}: {exc.strerror or exc}; retrying"
            if msg != self._io_error:
                self._io_error = msg
                self.polled.emit(FollowStatus(path=self.source.path, target=self.source.target, message=msg,
                                              last_change=self.source.last_change))
            return
        except Exception as exc:  # noqa: BLE001 - a bug: logged; polling stops, the window stays usable
            log.exception("following %s failed", self.source.target)
            self.timer.stop()
            self.failed.emit(f"following stopped: internal error reading {self.source.path or self.source.target}: "
                             f"{type(exc).__name__}: {exc}"[:300])
            return
        self._io_error = None
        self.polled.emit(st)

    @QtCore.Slot()
    def stop(self) -> None:
        if self.timer is not None:
            self.timer.stop()
        QtCore.QThread.currentThread().quit()


class TraceFollower(QtCore.QObject):
    """Polls a :class:`FollowSource` every ``interval_ms`` on a thread of its own.

    Signals are emitted on the GUI thread: ``recordChanged(record, path)`` when a record starts
    (its header was read, or the source switched files), ``polled(FollowStatus)`` after every
    poll, ``failed(message)`` when the file is not a trace (polling then stops).
    """

    recordChanged = QtCore.Signal(object, str)
    polled = QtCore.Signal(object)
    failed = QtCore.Signal(str)

    _start = QtCore.Signal()
    _stop = QtCore.Signal()

    def __init__(self, source: FollowSource, interval_ms: int = POLL_MS, parent=None):
        super().__init__(parent)
        self.source = source
        self.thread = QtCore.QThread()
        self.thread.setObjectName("kvinspect-follow")
        self.poller = _Poller(source, interval_ms)
        self.poller.moveToThread(self.thread)
        self.thread.finished.connect(self.poller.deleteLater)
        self._start.connect(self.poller.start)
        self._stop.connect(self.poller.stop)
        self.poller.polled.connect(self._on_polled)
        self.poller.failed.connect(self._on_failed)
        self.running = False
        self.last: FollowStatus | None = None

    def start(self) -> None:
        self.running = True
        self.thread.start()
        self._start.emit()

    def stop(self) -> None:
        """Stop polling and join the thread (the poller quits its own loop: no deadlock)."""
        if not self.running:
            return
        self.running = False
        self._stop.emit()
        if not self.thread.wait(30_000):
            log.error("the follow thread did not stop")

    def pause(self, on: bool) -> None:
        """Hold polling (while a report reads the record on another thread)."""
        (self.poller.paused.set if on else self.poller.paused.clear)()

    @QtCore.Slot(object)
    def _on_polled(self, st: FollowStatus) -> None:
        if not self.running:
            return
        self.last = st
        if st.record is not None:
            self.recordChanged.emit(st.record, str(st.path))
        self.polled.emit(st)

    @QtCore.Slot(str)
    def _on_failed(self, message: str) -> None:
        if self.running:
            self.failed.emit(message)
