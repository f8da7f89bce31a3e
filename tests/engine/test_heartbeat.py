"""The engine's heartbeat: every ``heartbeat_s`` while it works on a request, nothing while it waits for one.

Each line wakes the window; an idle window should wake for nothing, and it watches for silence only while
a request of its own is unanswered.
"""

from __future__ import annotations

import threading
import time

from kvinspect.engine.server import Engine


class _Out:
    def __init__(self):
        self.sent: list[dict] = []

    def send(self, item) -> None:
        self.sent.append(item)


def _wait(cond, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_an_idle_engine_is_silent_a_busy_one_beats_and_the_beat_ends_with_the_engine():
    out = _Out()
    engine = Engine(iter(()), out, heartbeat_s=0.02)
    beat = threading.Thread(target=engine._heartbeat_loop, daemon=True)
    beat.start()
    # Longer than protocol 1's idle beat (5 s), which this engine must not send: nothing at all.
    time.sleep(5.5)
    assert out.sent == []
    engine.busy = "turn"
    assert _wait(lambda: len(out.sent) >= 3)
    assert {(x["type"], x["busy"]) for x in out.sent} == {("heartbeat", "turn")}
    engine.busy = ""
    time.sleep(0.1)  # (a beat already on its way may still come)
    quiet = len(out.sent)
    time.sleep(0.3)
    assert len(out.sent) == quiet, "an idle engine went on beating"
    engine.busy = "load"  # the next request wakes it again
    assert _wait(lambda: out.sent[-1]["busy"] == "load")
    engine.busy = ""
    engine._done.set()
    engine._working.set()  # (what the request loop does as it ends)
    beat.join(30)
    assert not beat.is_alive()
