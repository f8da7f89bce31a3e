"""The UI thread never stalls while a model generates on the worker (issue: ≤ 50 ms).

A 10 ms timer on the GUI thread records the gaps between its ticks for the whole of a
generation (tokens streaming into the transcript, plots repainting at 30 Hz, the layer
table refreshing). No timing of the model itself is asserted, only the GUI's responsiveness.

The window's own work is ~3 ms of CPU a frame, so a gap over 50 ms means something blocks
the GUI thread (a paint, the GIL, a GC pass). Other processes can also take the CPU away on
a shared machine; that noise is random while a real stall repeats, so the bound must hold in
the best of up to three generations (each one's numbers are printed). On a machine so busy
that a plain Python loop on this thread runs k times slower than its CPU time (measured just
before, with the window idle), gaps are divided by that k first: a real 200 ms stall still
fails, other people's jobs do not.
"""

from __future__ import annotations

import os
import time

from PySide6 import QtCore

from .conftest import TURN_TIMEOUT_MS, load

MAX_GAP_MS = 50.0


def _one_generation(qtbot, window) -> tuple[list[float], int, object]:
    gaps: list[float] = []
    last = [None]

    def beat():
        now = time.perf_counter()
        if last[0] is not None:
            gaps.append((now - last[0]) * 1000)
        last[0] = now

    hb = QtCore.QTimer()
    hb.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
    hb.setInterval(10)
    hb.timeout.connect(beat)
    chat = window.chat
    chat.max_new.setValue(300)
    chat.input.setPlainText("Tell me everything about sliding windows and caches, at length.")
    ticks = []

    def on_tick():
        ticks.append(window.record.n_steps)

    window.renderedTick.connect(on_tick)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS) as blocker:
        hb.start()
        chat.send()
    hb.stop()
    window.renderedTick.disconnect(on_tick)
    return gaps, len(set(ticks)), blocker.args[0]


def cpu_slowdown() -> float:
    """Wall time over CPU time of a ~20 ms pure-Python loop on this thread (1.0 on an idle machine)."""
    ratios = []
    for _ in range(7):
        w, c = time.perf_counter(), time.thread_time()
        x = 0
        for i in range(300_000):
            x += i
        ratios.append((time.perf_counter() - w) / max(time.thread_time() - c, 1e-6))
    return max(1.0, sorted(ratios)[len(ratios) // 2])


def test_ui_heartbeat_stays_under_bound(qtbot, window, record_property):
    load(qtbot, window, "tiny-gemma3")
    window.chat.set_choice(window.chat.policy, "recreate")  # same work every turn: a fresh cache each time
    best = None
    for attempt in range(3):
        slow = cpu_slowdown()
        gaps, distinct_ticks, turn = _one_generation(qtbot, window)
        assert turn.status == "ok" and turn.new_tokens == 300
        # The heartbeat really ran through the generation, and the window really repainted meanwhile.
        assert len(gaps) > 20
        assert distinct_ticks > 5, "the paint timer did not see the record grow"
        slow = (slow + cpu_slowdown()) / 2  # before and after the generation
        worst = max(gaps)
        p99 = sorted(gaps)[int(len(gaps) * 0.99) - 1]
        print(f"\nheartbeat run {attempt + 1}: {len(gaps)} beats, max gap {worst:.1f} ms, p99 {p99:.1f} ms, "
              f"{turn.new_tokens} tokens in {turn.total_s:.2f} s; machine: load average {os.getloadavg()[0]:.1f}, "
              f"CPU slowdown {slow:.2f}× → max gap {worst / slow:.1f} ms at full speed")
        best = worst / slow if best is None else min(best, worst / slow)
        if best < MAX_GAP_MS:
            break
    record_property("heartbeat_max_gap_ms", round(best, 1))
    assert best < MAX_GAP_MS, f"UI thread stalled {best:.1f} ms in the best of 3 generations (bound {MAX_GAP_MS} ms)"
