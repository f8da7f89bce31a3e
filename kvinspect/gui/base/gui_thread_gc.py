"""Garbage collection only on the GUI thread, and never over the model.

Python's cyclic GC runs in whichever thread happens to allocate when a threshold is crossed.
With a worker thread generating, that is usually the worker, and a collection there can
destroy Qt objects that belong to the GUI thread ("Timers cannot be stopped from another
thread", or a crash). So, as pyqtgraph's ``GarbageCollector`` does, automatic collection is
off and a GUI-thread timer collects by the usual thresholds instead.

The timer backs off while nothing needs collecting (an idle window allocates next to nothing, and
each wake-up costs it one to a few milliseconds, most of it Qt's event loop), from every half second to every
:data:`SLOWEST_MS`, and comes back to the half second at the first check that collects.

A loaded model leaves 10^5-10^6 long-lived objects; a full collection over them takes
100+ ms and holds the GIL. :func:`settle` (called on the GUI thread after a load) collects
once, then freezes everything alive, so later passes only walk what was made since.
"""

from __future__ import annotations

import gc

from PySide6 import QtCore

SLOWEST_MS = 8000  # an idle window's checks back off to this (what piles up meanwhile is one small collection)

_collector: GuiThreadCollector | None = None
_users = 0


class GuiThreadCollector(QtCore.QObject):
    def __init__(self, interval_ms: int = 500, parent=None):
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        self.interval_ms = interval_ms
        self.timer = QtCore.QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.timeout.connect(self.check)
        self.timer.start(interval_ms)
        gc.disable()

    @QtCore.Slot()
    def check(self) -> None:
        l0, l1, l2 = gc.get_count()
        collected = l0 > self.threshold[0]
        if collected:
            gc.collect(0)
            if l1 > self.threshold[1]:
                gc.collect(1)
                if l2 > self.threshold[2]:
                    gc.collect(2)
        wait = self.timer.interval()
        self.timer.start(self.interval_ms if collected else min(2 * wait, max(SLOWEST_MS, self.interval_ms)))

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
