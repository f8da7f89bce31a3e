"""The window's paint clock: one single-shot timer that runs only while something waits to be painted.

Whatever marks the window dirty (a streamed line, a token, a followed trace that grew, a zoom) asks
for one paint; the clock runs it no sooner than one interval after the previous paint, so the data
rate never drives the paint rate. While a model streams the interval is :data:`LIVE_MS` (a plot
that updates ten times a second reads as live, and SmolLM2 makes about 20 tokens a second), and a
paint waits that long after the first mark too: a token's line and its step's block arrive up to one
engine flush apart, and one paint shows both (a model slower than 10 tokens a second would otherwise
be painted twice a token); during
an interaction (hover, zoom, drag, resize) and for :data:`SETTLE_S` after it, :data:`INTERACTIVE_MS`,
so the view follows the hand. When nothing is dirty no timer runs: an idle window wakes for nothing.

``now`` is injectable so a test can stream a thousand steps in a few milliseconds and count paints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from PySide6 import QtCore

LIVE_MS = 100  # while a generation streams: ~10 paints a second
INTERACTIVE_MS = 16  # hover, zoom, drag, and anything asked for while nothing streams
SETTLE_S = 0.5  # the interactive rate holds this long after the last interaction


class PaintClock(QtCore.QObject):
    """Calls ``paint()`` at most once per interval, and only after :meth:`mark` or :meth:`interact`."""

    def __init__(self, paint: Callable[[], None], now: Callable[[], float] = time.monotonic, parent=None):
        super().__init__(parent)
        self._paint = paint
        self.now = now
        self.streaming = False  # a generation (or a followed trace) is growing: the live rate
        self.paints = 0
        self.due: float | None = None  # when the pending paint runs (None: nothing pending)
        self._dirty = False
        self._last = -math.inf
        self._fast_until = -math.inf
        self._timer = QtCore.QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self.flush)

    @property
    def running(self) -> bool:
        """A timer is waiting to paint (False: the window is idle)."""
        return self._timer.isActive()

    def interval(self) -> float:
        """Seconds between two paints now."""
        if self.streaming and self.now() >= self._fast_until:
            return LIVE_MS / 1000
        return INTERACTIVE_MS / 1000

    def mark(self) -> None:
        """Something changed: paint it at the current rate."""
        self._dirty = True
        self._schedule()

    def interact(self) -> None:
        """The user is moving the view: paint at the interactive rate for a while."""
        self._fast_until = self.now() + SETTLE_S
        self.mark()

    def flush(self) -> None:
        """Paint now what is pending (the timer's slot; tests call it to catch up)."""
        self._timer.stop()
        self.due = None
        if not self._dirty:
            return
        self._dirty = False
        self._last = self.now()
        self.paints += 1
        self._paint()

    def stop(self) -> None:
        self._timer.stop()
        self.due = None
        self._dirty = False

    def _schedule(self) -> None:
        now = self.now()
        interval = self.interval()
        live = interval >= LIVE_MS / 1000
        due = max(now + interval if live else now, self._last + interval)
        if self.due is not None and self.due <= due:
            return  # already due as soon or sooner
        self.due = due
        self._timer.start(max(0, int(math.ceil((due - now) * 1000))))


def on_screen(widget) -> bool:
    """``widget`` shows some pixels: a dock tabbed behind another stays ``isVisible()`` with nothing on screen."""
    return widget.isVisible() and not widget.visibleRegion().isEmpty()
