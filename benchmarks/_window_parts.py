"""Run ``kvinspect gui ...`` with the CPU of the window's parts counted (``window_cpu.py --parts``).

Each part below is wrapped to add the GUI thread's CPU time (``time.thread_time``) it spent, from the
first ``turn_start`` line of the stream to the last ``turn`` line. cProfile inflates the many small
calls of a paint; these counters cost one clock read a call. At exit, the window's GUI thread and
process CPU over that span and each part's cores, calls a second and ms a call are printed to stderr
(parts nest: ``plots.render`` is inside ``clock paint``). Measurement only: nothing here ships.
"""

from __future__ import annotations

import atexit
import collections
import runpy
import sys
import time

ACC: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()
SPAN: dict[str, float] = {}


def _wrap(cls, name: str, key: str) -> None:
    orig = getattr(cls, name)

    def wrapped(self, *a, **k):
        t = time.thread_time()
        try:
            return orig(self, *a, **k)
        finally:
            if "t0" in SPAN:
                ACC[key] += time.thread_time() - t
                CALLS[key] += 1

    setattr(cls, name, wrapped)


def _install() -> None:
    import pyqtgraph as pg

    from kvinspect.core.trace.series import RecordSeries
    from kvinspect.gui.base.paint_clock import PaintClock
    from kvinspect.gui.engine_link.engine_process import EngineClient
    from kvinspect.gui.engine_link.live_trace import LiveTrace
    from kvinspect.gui.graphics.curve import Curve
    from kvinspect.gui.lanes.heatmap_lane import HeatmapLane
    from kvinspect.gui.lanes.lanes_widget import PlotsWidget
    from kvinspect.gui.lanes.memory_lane import MemoryLane
    from kvinspect.gui.lanes.tokens_lane import TokensLane
    from kvinspect.gui.panels.chat_panel import ChatPanel

    for cls, name, key in ((PaintClock, "flush", "clock paint"), (PlotsWidget, "render", "  plots.render"),
                           (RecordSeries, "update", "    series.update"), (HeatmapLane, "refresh", "    heatmap lane"),
                           (TokensLane, "refresh", "    tokens lane"), (MemoryLane, "refresh", "    memory lane"),
                           (PlotsWidget, "_update_overlays", "    overlays"), (Curve, "_rebuild", "      curve paths"),
                           (ChatPanel, "append_tokens", "  transcript append"),
                           (pg.GraphicsView, "paintEvent", "plots' Qt paint"),
                           (EngineClient, "_on_stdout", "stream reads"), (LiveTrace, "feed_line", "  trace lines")):
        _wrap(cls, name, key)
    feed = LiveTrace.feed_line

    def mark_span(self, kind, obj, raw):
        if kind == "turn_start" and "t0" not in SPAN:
            SPAN.update(t0=time.thread_time(), p0=time.process_time(), w0=time.monotonic())
        elif kind == "turn" and "t0" in SPAN:
            # Every turn line moves the span's end: the last one closes it (what follows is idle).
            SPAN.update(end=dict(t1=time.thread_time(), p1=time.process_time(), w1=time.monotonic()),
                        acc=dict(ACC), calls=dict(CALLS))
        return feed(self, kind, obj, raw)

    LiveTrace.feed_line = mark_span


def report() -> None:
    if "end" not in SPAN:
        print("parts: no turn finished", file=sys.stderr)
        return
    end = SPAN["end"]
    wall = end["w1"] - SPAN["w0"]
    print(f"parts: {wall:.1f} s streaming; GUI thread {(end['t1'] - SPAN['t0']) / wall:.4f} cores, process "
          f"{(end['p1'] - SPAN['p0']) / wall:.4f} cores", file=sys.stderr)
    for key, v in sorted(SPAN["acc"].items(), key=lambda kv: -kv[1]):
        n = SPAN["calls"][key]
        print(f"  {key:22s} {v / wall:.4f} cores  {n / wall:5.1f}/s  {1e3 * v / max(n, 1):5.2f} ms a call",
              file=sys.stderr)


if __name__ == "__main__":
    sys.argv = ["kvinspect", *sys.argv[1:]]
    _install()
    atexit.register(report)
    runpy.run_module("kvinspect", run_name="__main__", alter_sys=True)
