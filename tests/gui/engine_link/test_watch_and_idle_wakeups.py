"""What wakes an idle window: nothing. The engine's watchdog runs only while a request is unanswered,
and the GC check backs off.

An idle window should wake for nothing (each wake-up costs it from one to tens of milliseconds of cold
caches): an idle engine is silent and its silence is not watched, the watchdog waits for the next deadline
instead of polling every second, the paints collect their own garbage, and the GUI thread's collector
checks less and less often while it finds nothing to collect.
"""

from __future__ import annotations

import gc
import sys

from kvinspect.engine import protocol as P
from kvinspect.gui.base import gui_thread_gc
from kvinspect.gui.base.gui_thread_gc import SLOWEST_MS, GuiThreadCollector
from kvinspect.gui.base.paint_clock import PaintClock
from kvinspect.gui.engine_link.engine_process import EngineClient

# Greets, then answers a check with its terminal reply, a ping with a heartbeat, and anything else with
# nothing at all (a request it hangs on): it speaks only when the test says so, as an idle engine does.
_ENGINE = (f"import json, sys\n"
           f"print(json.dumps({{'type': 'hello', 'protocol': {P.PROTOCOL_VERSION}, 'kvinspect': '9.9.9', 'pid': 0}}),"
           f" flush=True)\n"
           f"for line in sys.stdin:\n"
           f"    req = json.loads(line)\n"
           f"    if req['type'] == 'check':\n"
           f"        print(json.dumps({{'type': 'done', 'id': req['id']}}), flush=True)\n"
           f"    elif req['type'] == 'ping':\n"
           f"        print(json.dumps({{'type': 'heartbeat', 'busy': 'hang', 't': 0}}), flush=True)\n")


def test_silence_is_watched_only_while_a_request_is_unanswered(qtbot):
    client = EngineClient([sys.executable, "-c", _ENGINE], local=True, hung_after_s=0.5)
    states: list[str] = []
    client.unresponsive.connect(lambda _s: states.append("unresponsive"))
    client.responsive.connect(lambda: states.append("responsive"))
    client.start()
    try:
        qtbot.waitUntil(lambda: client.hello is not None, timeout=30_000)
        qtbot.wait(1500)  # three times hung_after_s of an idle engine's silence: its rest, not a hang
        assert states == [] and not client._watch.isActive()
        client.request("check")  # answered: nothing is owed, nothing is watched
        qtbot.waitUntil(lambda: not client._pending, timeout=30_000)
        assert not client._watch.isActive()
        client.request("hang")  # never answered
        qtbot.waitUntil(lambda: states == ["unresponsive"], timeout=30_000)
        client.send({"type": "ping"})  # its heartbeat: responsive, and watched again from then
        qtbot.waitUntil(lambda: states == ["unresponsive", "responsive", "unresponsive"], timeout=30_000)
    finally:
        client.kill()


def test_the_gc_check_backs_off_while_nothing_is_collected_and_comes_back_when_something_is(qapp):
    collector = GuiThreadCollector(interval_ms=500)
    try:
        gc.collect()
        waits = []
        for _ in range(8):
            gc.collect()  # (what the test itself allocates never reaches the threshold between checks)
            collector.check()
            waits.append(collector.timer.interval())
        assert waits == [1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000], waits
        for _ in range(3):
            collector.check()
        assert collector.timer.interval() == SLOWEST_MS == 300_000
        assert collector.timer.isActive() and collector.timer.isSingleShot()
        junk = [[] for _ in range(3 * collector.threshold[0])]  # container objects: the gen-0 count climbs
        collector.check()
        assert collector.timer.interval() == 500 and gc.get_count()[0] < collector.threshold[0]
        del junk
    finally:
        collector.stop()
    assert gc.isenabled()


def test_a_paint_collects_its_garbage_and_pushes_the_gc_check_out(qapp):
    painted = []
    collector = gui_thread_gc.acquire(qapp)
    try:
        clock = PaintClock(lambda: painted.append([[] for _ in range(3 * collector.threshold[0])]))
        collector.timer.start(collector.interval_ms)  # (as after a check that collected)
        clock.mark()
        clock.flush()  # the paint leaves container objects behind; the collection runs before the clock returns
        assert painted and gc.get_count()[0] < collector.threshold[0]
        assert collector.timer.isActive() and collector.timer.interval() == SLOWEST_MS
    finally:
        gui_thread_gc.release()
