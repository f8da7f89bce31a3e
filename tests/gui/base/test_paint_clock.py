"""The paint clock: paints bounded by the rate a person sees, whatever the data rate; nothing runs when idle.

Time is a fake clock here (the clock's ``now``): a stream of steps is simulated in a few milliseconds,
and the timer's firing is played by calling ``flush`` once the fake time reaches the clock's ``due``.
"""

from __future__ import annotations

from kvinspect.gui.base.paint_clock import INTERACTIVE_MS, LIVE_MS, SETTLE_S, PaintClock


class FakeTime:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _stream(clock: PaintClock, time: FakeTime, steps: int, every_s: float, on_step=None) -> None:
    """``steps`` streamed lines ``every_s`` apart; the timer fires when its time has come."""
    start = time.t
    for i in range(steps):
        t = start + (i + 1) * every_s
        while clock.due is not None and clock.due <= t:  # the timer fires at its time, before the next line
            time.t = clock.due
            clock.flush()
        time.t = t
        if on_step is not None:
            on_step(i)
        clock.mark()
    time.t += 1.0
    clock.flush()


def test_streaming_paints_at_most_ten_times_a_second_whatever_the_token_rate(qapp):
    for rate in (20, 100, 500):  # tokens (stream lines) a second
        time = FakeTime()
        painted: list[float] = []
        clock = PaintClock(lambda: painted.append(time.t), now=time)
        clock.streaming = True
        seconds = 10
        _stream(clock, time, rate * seconds, 1 / rate)
        gaps = [b - a for a, b in zip(painted, painted[1:])]
        assert min(gaps) >= LIVE_MS / 1000 - 1e-9, rate
        # Live, not starved: about one paint per interval (one extra for the final flush).
        assert seconds * 1000 / LIVE_MS * 0.8 <= len(painted) <= seconds * 1000 / LIVE_MS + 2, (rate, len(painted))


def test_a_slow_stream_paints_each_step_once_with_its_token(qapp):
    time = FakeTime()
    painted: list[float] = []
    clock = PaintClock(lambda: painted.append(time.t), now=time)
    clock.streaming = True
    for _ in range(30):  # 2 tokens a second: a token's line, then its step's block one engine flush later
        time.t += 0.4
        clock.mark()
        time.t += 0.08
        clock.mark()
        assert clock.due is not None and clock.due > time.t  # not painted between the two
        time.t = clock.due
        clock.flush()
        time.t += 0.02
    assert len(painted) == 30


def test_interaction_paints_at_the_interactive_rate_then_back_to_live(qapp):
    time = FakeTime()
    painted: list[float] = []
    clock = PaintClock(lambda: painted.append(time.t), now=time)
    clock.streaming = True
    _stream(clock, time, 400, 0.005, on_step=lambda i: clock.interact())  # a 2 s drag over a 200 tok/s stream
    dragging = len(painted)
    assert dragging >= 2 / (INTERACTIVE_MS / 1000) * 0.8  # the view follows the hand (~60 Hz)
    painted.clear()
    t0 = time.t
    _stream(clock, time, 400, 0.005)  # the hand left: after SETTLE_S the live rate again
    late = [t for t in painted if t > t0 + SETTLE_S + 0.2]
    gaps = [b - a for a, b in zip(late, late[1:])]
    assert gaps and min(gaps) >= LIVE_MS / 1000 - 1e-9


def test_no_timer_runs_when_nothing_is_dirty(qtbot):
    painted = []
    clock = PaintClock(lambda: painted.append(1))
    assert not clock.running
    clock.streaming = True
    assert not clock.running  # streaming alone wakes nothing: only data that arrived does
    clock.mark()
    clock.mark()
    assert clock.running
    qtbot.waitUntil(lambda: bool(painted), timeout=2000)
    assert painted == [1] and not clock.running
    qtbot.wait(LIVE_MS * 3)
    assert painted == [1] and not clock.running


def test_a_paint_that_marks_again_is_painted_once_more(qapp):
    time = FakeTime()
    calls = []
    clock = PaintClock(lambda: (calls.append(time.t), len(calls) == 1 and clock.mark()), now=time)
    clock.mark()
    clock.flush()
    assert len(calls) == 1 and clock.due is not None and clock.running
    time.t = clock.due
    clock.flush()
    assert len(calls) == 2 and clock.due is None and not clock.running
