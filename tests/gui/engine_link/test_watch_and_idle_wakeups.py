"""What wakes an idle window: the engine's watchdog is armed for its deadline, the GC check backs off.

An idle window should wake for next to nothing (each wake-up costs it about a millisecond of Qt's event
loop): the watchdog waits for the next deadline instead of polling every second, and the GUI thread's
collector checks less and less often while it finds nothing to collect.
"""

from __future__ import annotations

import gc
import sys

from kvinspect.engine import protocol as P
from kvinspect.gui.base.gui_thread_gc import SLOWEST_MS, GuiThreadCollector
from kvinspect.gui.engine_link.engine_process import EngineClient

# Greets, then answers each line it reads with a heartbeat: it speaks only when the test says so.
_ECHO = (f"import json, sys\n"
         f"print(json.dumps({{'type': 'hello', 'protocol': {P.PROTOCOL_VERSION}, 'kvinspect': '9.9.9', 'pid': 0}}),"
         f" flush=True)\n"
         f"for _ in sys.stdin:\n"
         f"    print(json.dumps({{'type': 'heartbeat', 'busy': '', 't': 0}}), flush=True)\n")


def test_a_silent_engine_is_called_unresponsive_and_again_after_it_spoke_once_more(qtbot):
    client = EngineClient([sys.executable, "-c", _ECHO], local=True, hung_after_s=0.5)
    states: list[str] = []
    client.unresponsive.connect(lambda _s: states.append("unresponsive"))
    client.responsive.connect(lambda: states.append("responsive"))
    client.start()
    try:
        qtbot.waitUntil(lambda: states == ["unresponsive"], timeout=30_000)
        assert client.hello is not None
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
        assert waits == [1000, 2000, 4000, 8000, 8000, 8000, 8000, 8000] and SLOWEST_MS == 8000, waits
        assert collector.timer.isActive() and collector.timer.isSingleShot()
        junk = [[] for _ in range(3 * collector.threshold[0])]  # container objects: the gen-0 count climbs
        collector.check()
        assert collector.timer.interval() == 500 and gc.get_count()[0] < collector.threshold[0]
        del junk
    finally:
        collector.stop()
    assert gc.isenabled()
