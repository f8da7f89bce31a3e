"""One-off background jobs (read a trace, write a report bundle) off the GUI thread.

A job is a plain callable run on its own ``QThread``; its result or its one-line error comes
back as a signal emitted on the GUI thread (the thread's ``finished`` is relayed through a
bound slot of a GUI-thread object, so listeners, and pytest-qt's blockers, never see a signal
emitted from another thread). A user's mistake (:class:`KvInspectError`) becomes its message;
anything else is a bug: logged with its traceback and reported as one line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6 import QtCore

from kvinspect.core.errors import KvInspectError, exc_line

log = logging.getLogger(__name__)


class _JobThread(QtCore.QThread):
    def __init__(self, fn: Callable[[], object], name: str):
        super().__init__()
        self.setObjectName(f"kvinspect-{name}")
        self.fn = fn
        self.result: object = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except KvInspectError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug: logged, shown as one line, the window keeps running
            log.exception("background job %s failed", self.objectName())
            self.error = f"internal error: {exc_line(exc)} (details in the log)"


class BackgroundTask(QtCore.QObject):
    """Run ``fn`` on a worker thread; ``done(result)`` or ``failed(message)`` follow on the GUI thread.

    Parameters
    ----------
    fn
        The job: plain Python, no widgets (it runs on another thread).
    name
        A short name for logs and the thread.
    parent
        A GUI-thread object that keeps the task alive until it has finished.
    """

    done = QtCore.Signal(object)
    failed = QtCore.Signal(str)

    def __init__(self, fn: Callable[[], object], name: str = "task", parent: QtCore.QObject | None = None):
        super().__init__(parent)
        self.name = name
        self._thread = _JobThread(fn, name)
        self._thread.finished.connect(self._on_finished)  # a bound slot of this GUI-thread object: queued
        self.running = False

    def start(self) -> BackgroundTask:
        self.running = True
        self._thread.start()
        return self

    def wait(self, ms: int = 60_000) -> bool:
        """Join the thread (shutdown only: results of a joined job are dropped)."""
        return self._thread.wait(ms)

    @QtCore.Slot()
    def _on_finished(self) -> None:
        self.running = False
        t = self._thread
        t.wait()  # run() has returned; this only reaps the thread
        result, error = t.result, t.error
        t.result = t.fn = None  # a read trace can be 100 MB: the task must not keep it alive
        if error is not None:
            self.failed.emit(error)
        else:
            self.done.emit(result)
