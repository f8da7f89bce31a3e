"""The paint clock: paints bounded by the rate a person sees, whatever the data rate; nothing runs when idle.

Time is a fake clock here (the clock's ``now``): a stream of steps is simulated in a few milliseconds,
and the timer's firing is played by calling ``flush`` once the fake time reaches the clock's ``due``.
"""

from __future__ import annotations

from kvinspect.gui.base.paint_clock import (
    CPU_BUDGET,
    INTERACTIVE_MS,
    LIVE_MS,
    MIN_WHOLE_SHARE,
    PREFILL_HOLD_S,
    SETTLE_S,
    SLOWEST_LIVE_MS,
    PaintClock,
)


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


class FakeCPU(FakeTime):
    """The GUI thread's CPU clock: a paint advances it by what the frame is made to cost, and by
    ``later`` once it has returned (Qt's paint of the view, the next read), before the clock reads it again."""

    def __init__(self):
        super().__init__()
        self.t = 3.0
        self.later = 0.0

    def __call__(self) -> float:
        self.t += self.later
        self.later = 0.0
        return self.t


def _costly_clock(time: FakeTime, paint_s: float, after_s: float = 0.0):
    """A clock whose frames cost ``paint_s`` of the GUI thread's CPU in its paint and ``after_s`` once
    it has returned (Qt paints the view then, and the stream's next batch is read)."""
    cpu = FakeCPU()
    painted: list[float] = []

    def paint():
        painted.append(time.t)
        cpu.t += paint_s
        cpu.later += after_s

    clock = PaintClock(paint, now=time, cpu=cpu)
    clock.streaming = True
    return clock, painted


def _live_gaps(painted: list[float], after: float) -> list[float]:
    """The gaps between paints after ``after``, less the stream's final flush (a second after its end)."""
    late = [t for t in painted[:-1] if t > after]
    return [b - a for a, b in zip(late, late[1:])]


def test_the_live_rate_spends_the_cpu_budget_within_its_bounds(qapp):
    # (CPU in the paint, CPU after it) -> the live interval it settles at.
    for paint_s, qt_s, want in ((0.0002, 0.0002, LIVE_MS / 1000),  # a fast machine: ten a second
                                (0.002, 0.0015, 0.0035 / CPU_BUDGET),  # 3.5 ms a frame: as many as the budget pays for
                                (0.012, 0.008, SLOWEST_LIVE_MS / 1000)):  # dear frames: still once a second
        time = FakeTime()
        clock, painted = _costly_clock(time, paint_s, qt_s)
        _stream(clock, time, 20 * 10, 1 / 20)  # 10 s at 20 tokens a second
        gaps = _live_gaps(painted, painted[0] + 3)  # the estimate settles over the first frames
        assert gaps, (paint_s, qt_s)
        assert min(gaps) >= want * 0.99, (paint_s, qt_s, min(gaps))  # (the estimate nears its cost from below)
        assert max(gaps) <= want + 1 / 20 + 1e-6, (paint_s, qt_s, max(gaps))  # the next line after the due time
        assert abs(clock.frame_cpu - (paint_s + qt_s)) < 1e-6


def test_what_the_gui_thread_spends_after_the_paint_counts_in_a_frame(qapp):
    time = FakeTime()
    clock, painted = _costly_clock(time, 0.0, 0.009)  # all of a frame's CPU after the paint: Qt's, the reads
    _stream(clock, time, 200, 1 / 20)
    assert clock.frame_cpu is not None and abs(clock.frame_cpu - 0.009) < 1e-6
    assert min(_live_gaps(painted, painted[0] + 3)) >= 0.009 / CPU_BUDGET * 0.99


def test_dear_frames_do_not_slow_an_interaction(qapp):
    time = FakeTime()
    clock, painted = _costly_clock(time, 0.02)
    _stream(clock, time, 100, 1 / 20)  # a streamed 5 s: the live rate is the slowest
    estimate = clock.frame_cpu
    painted.clear()
    _stream(clock, time, 400, 0.005, on_step=lambda i: clock.interact())  # a 2 s drag
    assert len(painted) >= 2 / (INTERACTIVE_MS / 1000) * 0.8  # the view still follows the hand
    assert clock.frame_cpu == estimate  # a drag's frames are not live ones


def _clock_costing(time: FakeTime, cost: list[float]):
    """A clock whose paint costs ``cost[0]`` of CPU (changed by the test as it goes)."""
    cpu = FakeCPU()

    def paint():
        cpu.t += cost[0]

    clock = PaintClock(paint, now=time, cpu=cpu)
    return clock, cpu


def test_a_rest_frame_does_not_feed_the_live_estimate(qapp):
    time, cost = FakeTime(), [0.05]
    clock, _ = _clock_costing(time, cost)
    clock.mark()  # a finished chat: a resize or a picked layer paints a full frame
    time.t = clock.due
    clock.flush()
    assert clock.paints == 1 and clock.frame_cpu is None
    clock.streaming = True
    assert clock.live_interval() == LIVE_MS / 1000  # the next turn starts at ten a second
    cost[0] = 0.001
    _stream(clock, time, 60, 1 / 20)
    estimate = clock.frame_cpu
    assert estimate is not None and abs(estimate - 0.001) < 1e-9
    clock.streaming, cost[0] = False, 0.05  # the turn ends: its full repaint
    clock.mark()
    time.t = clock.due
    clock.flush()
    clock.streaming, cost[0] = True, 0.001  # the next turn: its first frames measure from scratch
    _stream(clock, time, 60, 1 / 20)
    assert abs(clock.frame_cpu - estimate) < 1e-9


def test_what_the_gui_thread_does_in_a_pause_is_not_a_frame(qapp):
    time, cost = FakeTime(), [0.001]
    clock, cpu = _clock_costing(time, cost)
    clock.streaming = True
    _stream(clock, time, 60, 1 / 20)
    estimate = clock.frame_cpu
    time.t += 5.0  # the stream stalls (a slow prompt); the user scrolls the transcript meanwhile
    cpu.t += 0.2
    clock.mark()
    time.t = clock.due
    clock.flush()
    assert clock.frame_cpu == estimate and clock.live_interval() == LIVE_MS / 1000


def test_after_a_pause_the_next_token_waits_only_for_its_step_block(qapp):
    time = FakeTime()
    clock, painted = _costly_clock(time, 0.02)
    _stream(clock, time, 100, 1 / 20)  # dear frames: the slowest live rate
    assert clock.live_interval() == SLOWEST_LIVE_MS / 1000
    time.t += 5.0  # the user reads, then sends the next message: its first token
    clock.mark()
    assert abs(clock.due - time.t - LIVE_MS / 1000) < 1e-9


def test_each_live_frame_tells_the_live_interval_and_an_interactions_do_not(qapp):
    time, cpu, told = FakeTime(), FakeCPU(), []

    def paint():
        cpu.t += 0.0025

    clock = PaintClock(paint, now=time, cpu=cpu, paced=told.append)
    clock.streaming = True
    _stream(clock, time, 100, 1 / 20)
    live = clock.paints
    # (the first live frame has nothing measured yet: the fastest rate)
    assert len(told) == live and told[0] == LIVE_MS / 1000
    assert all(abs(x - 0.0025 / CPU_BUDGET) < 1e-9 for x in told[1:])
    _stream(clock, time, 100, 0.005, on_step=lambda i: clock.interact())  # a drag: its frames are not live
    assert clock.paints > live + 20 and len(told) == live + 1  # (the drag's last flush, a second later, is)


def _held_clock(time: FakeTime):
    """A streaming clock as a turn starts: held for its prompt's prefill, its turn_start line marked."""
    painted: list[float] = []
    clock = PaintClock(lambda: painted.append(time.t), now=time)
    clock.streaming = True
    clock.hold()
    clock.mark()
    return clock, painted


def test_a_prefill_holds_the_turn_starts_paint_until_its_first_output(qapp):
    time = FakeTime()
    t0 = time.t
    clock, painted = _held_clock(time)
    assert abs(clock.due - (t0 + PREFILL_HOLD_S)) < 1e-9
    time.t = t0 + 0.3
    clock.release()  # its first step block: painted as soon as a live paint may be
    clock.mark()
    assert abs(clock.due - (t0 + 0.3 + LIVE_MS / 1000)) < 1e-9
    time.t = clock.due
    clock.flush()
    assert painted == [time.t]


def test_a_long_prefill_shows_its_turn_after_the_hold_and_a_drag_is_never_held(qapp):
    time = FakeTime()
    t0 = time.t
    clock, painted = _held_clock(time)
    time.t = clock.due  # nothing more comes: the timer fires at the hold's end
    clock.flush()
    assert painted == [t0 + PREFILL_HOLD_S]
    clock.hold()
    clock.interact()  # the user drags the view meanwhile: at once, at the interactive rate
    assert clock.due is not None and clock.due <= time.t + INTERACTIVE_MS / 1000
    clock.release()  # (nothing held: a no-op)
    assert clock.due is not None and clock.due <= time.t + INTERACTIVE_MS / 1000


def test_a_paint_already_due_waits_for_the_prefill_too(qapp):
    time = FakeTime()
    painted: list[float] = []
    clock = PaintClock(lambda: painted.append(time.t), now=time)
    clock.mark()  # the last turn's end, due at the interactive rate
    assert clock.due is not None and clock.due < time.t + PREFILL_HOLD_S
    clock.streaming = True
    clock.hold()  # the next turn starts at once
    assert abs(clock.due - (time.t + PREFILL_HOLD_S)) < 1e-9 and clock.running
    time.t += 0.2
    clock.release()
    assert clock.due is not None and clock.due <= time.t + LIVE_MS / 1000


def test_a_turn_s_first_output_waits_for_its_companions_not_for_the_last_turn_s_end(qapp):
    """Dear frames (the slowest live rate), the last turn's end just painted, the next prompt sent at once:
    its first output is painted one companion wait after it came, not one live interval after that end."""
    time = FakeTime()
    clock, painted = _costly_clock(time, 0.02)
    _stream(clock, time, 100, 1 / 20)
    assert clock.live_interval() == SLOWEST_LIVE_MS / 1000
    clock.mark()  # the turn's end
    time.t = clock.due
    clock.flush()
    ended = time.t
    clock.hold()  # the next prompt, sent once the end is drawn
    clock.mark()  # its turn_start line
    time.t = ended + 0.1  # a short prefill: its first step block and token
    clock.release()
    clock.mark()
    assert abs(clock.due - (time.t + LIVE_MS / 1000)) < 1e-9
    time.t = clock.due
    clock.flush()
    clock.mark()  # the next batch: the live rate again
    assert abs(clock.due - (time.t + SLOWEST_LIVE_MS / 1000)) < 1e-9


def test_a_paint_in_parts_gives_the_event_loop_a_turn_between_them(qtbot):
    """A generator paints in parts: what its first part posts (Qt's paint of it, a key press) is handled
    before the second runs, and the parts are one frame: counted, measured and told once."""
    from PySide6 import QtCore

    log, told = [], []

    def paint():
        log.append("part 1")
        QtCore.QTimer.singleShot(0, lambda: log.append("event loop"))
        yield
        log.append("part 2")

    clock = PaintClock(paint, paced=told.append)
    clock.streaming = True
    clock.mark()
    qtbot.waitUntil(lambda: "part 2" in log, timeout=2000)
    assert log == ["part 1", "event loop", "part 2"]
    assert clock.paints == 1 and len(told) == 1
    qtbot.waitUntil(lambda: not clock.running, timeout=2000)


def test_a_frame_in_parts_is_running_until_its_last_part_and_finishes_before_the_next(qapp):
    log = []

    def paint():
        log.append("a")
        yield
        log.append("b")

    clock = PaintClock(paint)
    clock.mark()
    clock.flush()
    assert log == ["a"] and clock.running  # (a script waits for the whole frame before its screenshot)
    clock.mark()
    clock.flush()  # the next frame: the last one's parts run first, in order
    assert log == ["a", "b", "a"]
    clock.finish()
    assert log == ["a", "b", "a", "b"] and not clock.running
    clock.mark()
    clock.flush()
    clock.stop()  # (closing the window): the rest of the frame is dropped, nothing runs later
    assert log == ["a", "b", "a", "b", "a"] and not clock.running


def _clock_in_parts(time: FakeTime, first_s: float, rest_s: float):
    """A clock whose paint is in two parts: the first costs ``first_s`` of CPU (the transcript), the rest
    ``rest_s`` (the plots and panels). Logs which parts ran, at what time."""
    cpu, log = FakeCPU(), []

    def paint():
        log.append(("first", time.t))
        cpu.t += first_s
        yield
        log.append(("rest", time.t))
        cpu.t += rest_s

    clock = PaintClock(paint, now=time, cpu=cpu)
    clock.streaming = True
    return clock, cpu, log


def _whole_or_short(log) -> str:
    """Each frame of ``log`` as ``W`` (its rest ran) or ``s`` (cut after its first part)."""
    return "".join("W" if i + 1 < len(log) and log[i + 1][0] == "rest" else "s"
                   for i, (part, _) in enumerate(log) if part == "first")


def test_where_a_frame_a_second_is_dear_its_rest_runs_on_the_share_the_budget_pays_for(qapp):
    # Counted in frames, on fake clocks: which frames ran whole, not how long anything took. What this
    # costs a real window is `benchmarks/window_cpu.py --parts --dearer MS` (frames a second, cut short).
    # (first part, rest) -> the frames in a row that repeat once the estimates settle
    cases = {"cheap": (0.001, 0.004, "W"),  # every frame whole, at the budget's rate
             "half": (0.002, 0.028, "Ws"),  # the budget pays for every other rest
             "dearest": (0.012, 0.100, "Wss")}  # however dear: one in three whole
    frames = {}
    for name, (first_s, rest_s, unit) in cases.items():
        time = FakeTime()
        clock, cpu, log = _clock_in_parts(time, first_s, rest_s)
        _stream(clock, time, 20 * 60, 1 / 20)  # a minute at 20 tokens a second
        clock.finish()  # (the last frame's rest, if it has one, runs now rather than on the part timer)
        pattern = _whole_or_short(log)
        assert len(pattern) == clock.paints, name  # every frame ran its first part: the text moves each frame
        frames[name] = clock.paints
        settled = pattern[10:]  # the estimates settle in the first frames
        settled = settled[settled.index("W"):]
        assert settled == (unit * len(settled))[:len(settled)], (name, pattern)
        if unit == "W":
            assert clock.short_frames == 0
        else:
            assert clock.short_frames == pattern.count("s")
            # the two estimates are kept apart: a short frame's cost never counts as a whole one's
            assert clock.short_cpu is not None and clock.frame_cpu is not None and clock.short_cpu < clock.frame_cpu
    # Where whole frames are dear the view moves at the floor of one frame a second, however dear the rest.
    assert frames["half"] == frames["dearest"] < frames["cheap"]


def test_a_short_frame_leaves_its_rest_to_paint_and_a_turn_end_or_a_drag_paints_whole(qapp):
    time = FakeTime()
    clock, cpu, log = _clock_in_parts(time, 0.010, 0.050)
    _stream(clock, time, 20 * 10, 1 / 20)
    assert clock.whole_share() == MIN_WHOLE_SHARE
    log.clear()
    while not log or log[-1][0] != "first" or clock._frame is not None:  # stream until a frame is cut short
        time.t += 0.05
        clock.mark()
        if clock.due is not None and clock.due <= time.t:
            clock.flush()
    assert clock.running and clock._dirty  # what it did not paint is still to come, with no new line
    clock.streaming = False  # the turn ends: its last paint runs whole
    clock.mark()
    time.t = clock.due
    clock.flush()
    clock.finish()
    assert [part for part, _ in log[-2:]] == ["first", "rest"]
    clock.streaming = True
    for _ in range(3):  # a drag while a dear stream runs: every frame whole
        log.clear()
        clock.interact()
        time.t = clock.due
        clock.flush()
        clock.finish()
        assert [part for part, _ in log] == ["first", "rest"]
