"""Garbage collection only on the GUI thread, and never over the model.

Python's cyclic GC runs in whichever thread happens to allocate when a threshold is crossed.
With a worker thread generating, that is usually the worker, and a collection there can
destroy Qt objects that belong to the GUI thread ("Timers cannot be stopped from another
thread", or a crash). So, as pyqtgraph's ``GarbageCollector`` does, automatic collection is
off and a GUI-thread timer collects by the usual thresholds instead.

Most of the GUI thread's garbage is made by its paints, so the paint clock calls :func:`checkpoint`
after each one: what the paint left is collected in the same wake-up, and the timer is pushed out to
:data:`SLOWEST_MS`. The timer is the backstop for work that does not paint. It backs off while
nothing needs collecting (an idle window allocates nothing, and each wake-up costs it from one to
tens of milliseconds: a process that slept runs on cold caches), from every half second to every
:data:`SLOWEST_MS`, and comes back to the half second at the first check that collects.

A loaded model leaves 10^5-10^6 long-lived objects; a full collection over them takes
100+ ms and holds the GIL. :func:`settle` (called on the GUI thread after a load) collects
once, then freezes everything alive, so later passes only walk what was made since.
"""

from __future__ import annotations

import gc

from PySide6 import QtCore

# An idle window's checks back off to this: it allocates nothing, and what other work piles up meanwhile
# (a dialog's) is one small collection, or goes at the next paint.
SLOWEST_MS = 300_000

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
        collected = self._collect()
        wait = self.timer.interval()
        self.timer.start(self.interval_ms if collected else min(2 * wait, self._slowest))

    def checkpoint(self) -> None:
        """GUI work just ran (a paint): collect what it left now, and leave the checks to the next one."""
        self._collect()
        self.timer.start(self._slowest)

    @property
    def _slowest(self) -> int:
        return max(SLOWEST_MS, self.interval_ms)

    def _collect(self) -> bool:
        """Collect by the usual thresholds; True when generation 0 was over its own."""
        l0, l1, l2 = gc.get_count()
        if l0 <= self.threshold[0]:
            return False
        gc.collect(0)
        if l1 > self.threshold[1]:
            gc.collect(1)
            if l2 > self.threshold[2]:
                gc.collect(2)
        return True

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


def checkpoint() -> None:
    """The paint clock painted: collect its garbage in this wake-up (nothing when no window holds the collector)."""
    if _collector is not None:
        _collector.checkpoint()


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
