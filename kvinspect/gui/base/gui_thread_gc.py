"""Garbage collection only on the GUI thread, and never over the model.

Python's cyclic GC runs in whichever thread happens to allocate when a threshold is crossed.
With a worker thread generating, that is usually the worker, and a collection there can
destroy Qt objects that belong to the GUI thread ("Timers cannot be stopped from another
thread", or a crash). So, as pyqtgraph's ``GarbageCollector`` does, automatic collection is
off and a GUI-thread timer collects by the usual thresholds instead.

A loaded model leaves 10^5-10^6 long-lived objects; a full collection over them takes
100+ ms and holds the GIL. :func:`settle` (called on the GUI thread after a load) collects
once, then freezes everything alive, so later passes only walk what was made since.
"""

from __future__ import annotations

import gc

from PySide6 import QtCore

_collector: GuiThreadCollector | None = None
_users = 0


class GuiThreadCollector(QtCore.QObject):
    def __init__(self, interval_ms: int = 500, parent=None):
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        self.timer = QtCore.QTimer(self)
        self.timer.timeout.connect(self.check)
        self.timer.start(interval_ms)
        gc.disable()

    @QtCore.Slot()
    def check(self) -> None:
        l0, l1, l2 = gc.get_count()
        if l0 > self.threshold[0]:
            gc.collect(0)
            if l1 > self.threshold[1]:
                gc.collect(1)
                if l2 > self.threshold[2]:
                    gc.collect(2)

    def stop(self) -> None:
        self.timer.stop()
        gc.enable()


def acquire(app) -> GuiThreadCollector:
    """A window opens: GC moves to the GUI thread (once, however many windows)."""
    global _collector, _users
    if _collector is None:
        _collector = GuiThreadCollector(parent=app)
    _users += 1
    return _collector


def release() -> None:
    """A window closed; with none left, automatic GC and the frozen objects come back."""
    global _collector, _users
    _users = max(_users - 1, 0)
    if _users == 0 and _collector is not None:
        _collector.stop()
        _collector.deleteLater()
        _collector = None
        gc.unfreeze()


def settle() -> None:
    """Collect now (on the GUI thread: a previous model's cycles go), then freeze what is left."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
