"""The window's paint clock: one single-shot timer that runs only while something waits to be painted.

Whatever marks the window dirty (a streamed line, a token, a followed trace that grew, a zoom) asks
for one paint; the clock runs it no sooner than one interval after the previous paint, so the data
rate never drives the paint rate. While a model streams the interval is the live one, and a
paint waits :data:`LIVE_MS` after the first mark too: a token's line and its step's block arrive up to
one engine flush apart, and one paint shows both (a model slower than the paint rate would otherwise
be painted twice a token); during an interaction (hover, zoom, drag, resize) and for :data:`SETTLE_S`
after it, :data:`INTERACTIVE_MS`, so the view follows the hand. When nothing is dirty no timer runs:
an idle window wakes for nothing.

The live interval is what the GUI thread spends per live frame over :data:`CPU_BUDGET`, between
:data:`LIVE_MS` (a plot that updates ten times a second reads as live) and :data:`SLOWEST_LIVE_MS`.
The window's CPU is CPU the model does not get (on a laptop every percent is a percent of its
speed): where a frame is cheap the view moves ten times a second; where it costs 8 ms beside a busy
engine, twice; where 16 ms (a 2-core VM in a slow hour), once. A frame's cost is all the GUI
thread's CPU from one live paint to the next: the paint, Qt's paint of what it changed (after the
paint returns), composing the window, and the stream's reads between (the engine sends one batch a
paint), so the budget bounds the window's whole CPU while a model streams, not the part a counter
could see. Only consecutive live frames feed the estimate: a zoom's or a turn end's full repaint
says nothing of a streamed one.
After each live frame ``paced`` is told the live interval: the window passes it to its engine, whose
stream then comes at that pace (one read and one step block a paint).

While the engine prefills a prompt the clock is held (:meth:`hold`): the turn's start is painted
with its first step or token (:meth:`release`), or after :data:`PREFILL_HOLD_S`, not in the middle of
the prefill, which wants every core and whose length is the turn's time to first token. That first
output is painted one :data:`LIVE_MS` after it came, not one live interval after the last turn's
end was painted: a person is waiting for it.

A paint may come in parts: when ``paint`` is a generator, each ``yield`` ends a part, and the clock
gives the event loop a turn (:data:`PART_GAP_MS`) before the next. Qt paints what the part changed,
a key press or the next stream line is handled, and no frame holds the GUI thread for all of its
work at once: the transcript's tokens and their repaint, then the plots and theirs, are two short
holds rather than one long one. The parts are one frame: it is measured, counted and told once.

Where even one frame a second costs more than the budget (a slow machine, a model of many layers),
the rate stays at one a second and only a share of the frames run past their first part: the rest
(the window's plots and panels) is painted on as many frames as the budget pays for after the first
parts (at least one in :data:`MIN_WHOLE_SHARE`). The transcript still moves every second, the window's
CPU holds its budget, and a short frame leaves the window dirty: what it did not paint is painted by
the next whole frame, a turn's end or an interaction (never short). The share is the budget over the
two estimates, a whole frame's and a short one's, each fed by the live frames of its kind.

``now`` and ``cpu`` are injectable so a test can stream a thousand steps in a few milliseconds, give
each frame the cost it wants, and count paints.
"""

from __future__ import annotations

import math
import time
import types
from collections.abc import Callable

from PySide6 import QtCore

from kvinspect.gui.base import gui_thread_gc

LIVE_MS = 100  # while a generation streams and frames are cheap: ~10 paints a second
SLOWEST_LIVE_MS = 1000  # however dear a frame, a live view still moves once a second
# The cores the GUI thread may take while a model streams: its CPU per live frame over this is the
# live interval. (The goal for the window's process is 0.02; its Qt threads and the odd timer take
# the rest.)
CPU_BUDGET = 0.016
MEASURED_GAP_S = 2 * SLOWEST_LIVE_MS / 1000  # live frames further apart than this: the stream paused
FRAME_SMOOTHING = 0.3  # the weight of the newest frame's cost in the running estimate
INTERACTIVE_MS = 16  # hover, zoom, drag, and anything asked for while nothing streams
SETTLE_S = 0.5  # the interactive rate holds this long after the last interaction
PREFILL_HOLD_S = 1.0  # a prompt's prefill holds the paints this long at most (a long one shows its turn then)
# A dear frame's rest (past its first part) runs on this share of the live frames at least, however dear: the
# window's plots move once in three seconds in the worst case.
MIN_WHOLE_SHARE = 1 / 3
# Between two parts of a frame: long enough for the event loop to run Qt's paint of the last part (posted
# events come before timers), short enough that the frame's parts land together to the eye.
PART_GAP_MS = 1


class PaintClock(QtCore.QObject):
    """Calls ``paint()`` at most once per interval, and only after :meth:`mark` or :meth:`interact`."""

    def __init__(self, paint: Callable[[], object], now: Callable[[], float] = time.monotonic,
                 cpu: Callable[[], float] = time.thread_time, paced: Callable[[float], None] | None = None,
                 parent=None):
        super().__init__(parent)
        self._paint = paint
        self.now = now
        self.cpu = cpu
        self._paced = paced  # told the live interval after each live frame (the window tells its engine)
        self._live_mark: tuple[float, float] | None = None  # (now, cpu) as the last live paint began
        self.frame_cpu: float | None = None  # the running estimate of a live frame's CPU seconds
        self.short_cpu: float | None = None  # the same of a live frame cut after its first part
        self.short_frames = 0  # live frames that ran their first part only (their rest was dear)
        self._credit = 1.0  # whole frames owed: the share of each live frame adds to it, a whole one takes 1
        self._cut = False  # the frame in parts stops after its first part
        self._last_whole = True  # the last frame ran all of its parts
        self.streaming = False  # a generation (or a followed trace) is growing: the live rate
        self.paints = 0
        self.due: float | None = None  # when the pending paint runs (None: nothing pending)
        self._dirty = False
        self._last = -math.inf
        self._fast_until = -math.inf
        self._hold_until = -math.inf
        self._timer = QtCore.QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self.flush)
        self._frame: types.GeneratorType | None = None  # a paint in parts, between two of them
        self._frame_live = False
        self._part_timer = QtCore.QTimer(self)
        self._part_timer.setSingleShot(True)
        self._part_timer.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
        self._part_timer.timeout.connect(self._next_part)

    @property
    def running(self) -> bool:
        """A timer is waiting to paint, or a frame to finish (False: the window is idle)."""
        return self._timer.isActive() or self._frame is not None

    @property
    def live(self) -> bool:
        """A generation streams and nobody is moving the view: the live rate."""
        return self.streaming and self.now() >= self._fast_until

    def live_interval(self) -> float:
        """Seconds between two live paints: a frame's CPU over the budget, within the live bounds."""
        want = (self.frame_cpu or 0.0) / CPU_BUDGET
        return min(SLOWEST_LIVE_MS / 1000, max(LIVE_MS / 1000, want))

    def whole_share(self) -> float:
        """The share of live frames that run whole: 1 unless a whole frame a second costs more than the budget."""
        whole, floor = self.frame_cpu, SLOWEST_LIVE_MS / 1000
        if whole is None or whole <= CPU_BUDGET * floor:
            return 1.0
        short = self.short_cpu or 0.0  # (none measured yet: the share a frame of no first part would get)
        if whole <= short:
            return 1.0
        return min(1.0, max(MIN_WHOLE_SHARE, (CPU_BUDGET * floor - short) / (whole - short)))

    def mark(self) -> None:
        """Something changed: paint it at the current rate."""
        self._dirty = True
        self._schedule()

    def interact(self) -> None:
        """The user is moving the view: paint at the interactive rate for a while."""
        self._fast_until = self.now() + SETTLE_S
        self._hold_until = -math.inf  # (the hand is not kept waiting for a prefill)
        self.mark()

    def hold(self, seconds: float = PREFILL_HOLD_S) -> None:
        """Paint nothing for up to ``seconds`` (a prompt's prefill) unless :meth:`release` comes first.

        A paint already due waits too (the last turn's end, the loaded model): the prefill has the cores.
        """
        self._hold_until = self.now() + seconds
        if self.due is not None and self.due < self._hold_until:
            self._reschedule()

    def release(self) -> None:
        """End a :meth:`hold`: what waited (the turn's first output) is painted as soon as its companions
        are in, however recently the last turn's end was painted: the prefill was a pause of the stream."""
        if self._hold_until == -math.inf:
            return
        self._hold_until = -math.inf
        self._last = -math.inf
        self._credit = 1.0  # (the turn's start is shown whole)
        if self._dirty:
            self._reschedule()

    def flush(self) -> None:
        """Paint now what is pending (the timer's slot; tests call it to catch up). A paint in parts runs
        its first part here, the rest from the event loop; a frame still in parts is finished first."""
        self._timer.stop()
        self.due = None
        self.finish()
        if not self._dirty:
            return
        self._dirty = False
        self._last = self.now()
        self.paints += 1
        live = self.live
        if live:
            self._measure()
            share = self.whole_share()
            self._credit = min(self._credit + share, 1.0 + share)
            self._cut = self._credit < 1.0
        else:  # an interaction's or a rest's frame (a full repaint, a zoom) says nothing of a live one
            self._live_mark = None
            self._credit, self._cut = 1.0, False
        frame = self._paint()
        if isinstance(frame, types.GeneratorType):
            self._frame, self._frame_live = frame, live
            self._next_part()
        else:
            self._frame_done(live)

    def finish(self) -> None:
        """Run the parts of a frame that are still to come, now."""
        self._part_timer.stop()
        while self._frame is not None:
            self._next_part(wait=False)

    def _next_part(self, wait: bool = True) -> None:
        frame = self._frame
        if frame is None:
            return
        try:
            next(frame)
        except StopIteration:
            self._frame = None
            self._frame_done(self._frame_live)
        except BaseException:
            self._frame = None  # (a part that failed ends its frame)
            raise
        else:
            if self._cut:  # a dear frame's first part only: the rest waits for a whole frame
                self._frame = None
                frame.close()
                self.short_frames += 1
                self._frame_done(self._frame_live, whole=False)
                self._dirty = True
                self._schedule()
            elif wait:
                self._part_timer.start(PART_GAP_MS)

    def _frame_done(self, live: bool, whole: bool = True) -> None:
        self._last_whole = whole
        if whole and live:
            self._credit = max(self._credit - 1.0, -1.0)
        gui_thread_gc.checkpoint()  # (its garbage goes in this wake-up: the collector's timer need not wake)
        if live and self._paced is not None:
            self._paced(self.live_interval())

    def _measure(self) -> None:
        """A live frame begins: the last one's cost (all of it: its paint, Qt's, the reads since) joins
        the estimate of its kind (whole or short), when that frame was the one before this."""
        at, cpu = self._last, self.cpu()
        last, self._live_mark = self._live_mark, (at, cpu)
        if last is not None and at - last[0] <= MEASURED_GAP_S:
            cost = cpu - last[1]
            if self._last_whole:
                self.frame_cpu = _smoothed(self.frame_cpu, cost)
            else:
                self.short_cpu = _smoothed(self.short_cpu, cost)

    def stop(self) -> None:
        self._timer.stop()
        self._part_timer.stop()
        if self._frame is not None:
            self._frame.close()
            self._frame = None
        self.due = None
        self._dirty = False

    def _reschedule(self) -> None:
        """Schedule the pending paint again, later or sooner (a hold came or went)."""
        self._timer.stop()
        self.due = None
        self._schedule()

    def _schedule(self) -> None:
        now = self.now()
        live = self.live
        interval = self.live_interval() if live else INTERACTIVE_MS / 1000
        # A live paint waits for its companions (a token and its step's block, one engine flush apart),
        # not for a whole dear interval: the first token after a pause shows as soon as a cheap one would.
        due = max(now + LIVE_MS / 1000 if live else now, self._last + interval, self._hold_until)
        if self.due is not None and self.due <= due:
            return  # already due as soon or sooner
        self.due = due
        self._timer.start(max(0, int(math.ceil((due - now) * 1000))))


def _smoothed(estimate: float | None, cost: float) -> float:
    return cost if estimate is None else FRAME_SMOOTHING * cost + (1 - FRAME_SMOOTHING) * estimate


def on_screen(widget) -> bool:
    """``widget`` shows some pixels: a dock tabbed behind another stays ``isVisible()`` with nothing on screen."""
    return widget.isVisible() and not widget.visibleRegion().isEmpty()
