"""Run ``kvinspect gui ...`` with the CPU of the window's parts counted (``window_cpu.py --parts``).

Each part below is wrapped to add the GUI thread's CPU time (``time.thread_time``) it spent, from the
first ``turn_start`` line of the stream to the last ``turn`` line. cProfile inflates the many small
calls of a paint; these counters cost one clock read a call. At exit, the window's GUI thread and
process CPU over that span and each part's cores, calls a second and ms a call are printed to stderr
(parts nest: ``plots.render`` is inside ``clock paint``). Measurement only: nothing here ships.

With ``KVINSPECT_PARTS_EVENTS=1`` the application's ``notify`` is wrapped too, and the GUI thread's CPU
over the span is also split by the Qt event being delivered (its type and receiver's class, time
exclusive of nested deliveries): what Qt does outside the counted Python parts (painting plain
widgets, composing and flushing the window to the X server, timers, socket reads). A Python
``notify`` on every event costs a few microseconds each, so this figure runs a little high.

Each turn's first token on screen is printed too: the wall time from its ``turn_start`` line's
arrival to the transcript's first append of its reply (a paint's), beside the engine's own TTFT.
"""

from __future__ import annotations

import atexit
import collections
import os
import runpy
import sys
import time

ACC: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()
START: dict[str, float] = {}  # the clocks at the first turn_start line
END: dict = {}  # the clocks and the counters at the last turn line seen
EVENTS_SHOWN = 30
FIRST: list[dict] = []  # a turn each: its turn_start line's arrival, its first token's paint, its TTFT


def _wrap(cls, name: str, key: str) -> None:
    orig = getattr(cls, name)

    def wrapped(self, *a, **k):
        t = time.thread_time()
        try:
            return orig(self, *a, **k)
        finally:
            if START:
                ACC[key] += time.thread_time() - t
                CALLS[key] += 1

    setattr(cls, name, wrapped)


def _count_events() -> None:
    from PySide6 import QtCore, QtWidgets

    names = {}
    stack: list[float] = []  # the CPU of the deliveries nested in each open one

    class CountingApp(QtWidgets.QApplication):
        def notify(self, receiver, event):
            t = time.thread_time()
            stack.append(0.0)
            try:
                return super().notify(receiver, event)
            finally:
                spent = time.thread_time() - t
                inner = stack.pop()
                if stack:
                    stack[-1] += spent
                if START:
                    et = event.type()
                    name = names.get(et)
                    if name is None:
                        name = names[et] = getattr(et, "name", str(et))
                    key = f"event {name} → {type(receiver).__name__}"
                    if type(receiver) in (QtCore.QTimer, QtWidgets.QWidget):  # whose timer, whose viewport
                        owner = receiver.parent()
                        key += f" of {type(owner).__name__ if owner is not None else '-'}"
                    elif isinstance(receiver, QtWidgets.QDockWidget):  # which dock
                        key += f" {receiver.objectName() or receiver.windowTitle()!r}"
                    elif type(receiver).__name__ in ("QObject", "QEvent"):  # a wrapper PySide could not type
                        try:
                            key += f" ({receiver.metaObject().className()} {receiver.objectName()!r})"
                        except (AttributeError, RuntimeError):
                            pass
                    ACC[key] += spent - inner
                    CALLS[key] += 1

    QtWidgets.QApplication = CountingApp  # looked up when the window makes its application


def _count_items() -> None:
    """Each graphics item's ``paint`` and the view's background and items, inside the plots' Qt paint."""
    import pyqtgraph as pg

    from kvinspect.gui.graphics import (
        axes,
        curve,
        event_markers,
        grid_lines,
        heatmap,
        horizontal_lines,
        legend,
        marker_lines,
        regions,
    )

    classes = {pg.ViewBox, pg.PlotItem, pg.AxisItem, pg.LabelItem, pg.GraphicsLayout}
    for mod in (axes, curve, event_markers, grid_lines, heatmap, horizontal_lines, legend, marker_lines, regions):
        classes.update(c for c in vars(mod).values() if isinstance(c, type) and "paint" in vars(c))
    for cls in sorted(classes, key=lambda c: c.__name__):
        if "paint" in vars(cls):
            _wrap(cls, "paint", f"    item {cls.__name__}.paint")


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

    dearer = float(os.environ.get("KVINSPECT_PARTS_DEARER_MS") or 0) / 1000
    if dearer:  # a slower machine's plots, emulated: a render spins this much more of the thread's CPU
        render = PlotsWidget.render

        def dear_render(self, *a, **k):
            end = time.thread_time() + dearer
            while time.thread_time() < end:
                pass
            return render(self, *a, **k)

        PlotsWidget.render = dear_render
    for cls, name, key in ((PaintClock, "flush", "clock paint"), (PlotsWidget, "render", "  plots.render"),
                           (RecordSeries, "update", "    series.update"), (HeatmapLane, "refresh", "    heatmap lane"),
                           (TokensLane, "refresh", "    tokens lane"), (MemoryLane, "refresh", "    memory lane"),
                           (PlotsWidget, "_update_overlays", "    overlays"), (Curve, "_rebuild", "      curve paths"),
                           (ChatPanel, "append_tokens", "  transcript append"),
                           (pg.GraphicsView, "paintEvent", "plots' Qt paint"),
                           (EngineClient, "_on_stdout", "stream reads"), (LiveTrace, "feed_line", "  trace lines")):
        _wrap(cls, name, key)
    # A paint in parts: its first part runs in flush, the others from the clock's part timer. They are the
    # paint too (its calls count frames: flush's alone).
    flush, next_part, inside = PaintClock.flush, getattr(PaintClock, "_next_part", None), [0]

    def counted_flush(self):
        inside[0] += 1
        try:
            return flush(self)
        finally:
            inside[0] -= 1

    def counted_part(self, wait=True):
        if inside[0]:
            return next_part(self, wait)
        t = time.thread_time()
        try:
            return next_part(self, wait)
        finally:
            if START:
                ACC["clock paint"] += time.thread_time() - t

    if next_part is not None:  # (a baseline's clock may paint in one piece)
        PaintClock.flush, PaintClock._next_part = counted_flush, counted_part
    clocks: list = []  # the window's paint clock: its frames over the span, and those cut short
    init = PaintClock.__init__

    def kept_init(self, *a, **k):
        init(self, *a, **k)
        clocks.append(self)

    PaintClock.__init__ = kept_init

    def frames() -> tuple[int, int]:
        return (clocks[0].paints, getattr(clocks[0], "short_frames", 0)) if clocks else (0, 0)

    feed = LiveTrace.feed_line
    append = ChatPanel.append_tokens

    def first_on_screen(self, text):
        if text and FIRST and "shown" not in FIRST[-1]:
            FIRST[-1]["shown"] = time.monotonic()
        return append(self, text)

    ChatPanel.append_tokens = first_on_screen

    def mark_span(self, kind, obj, raw):
        if kind == "turn_start":
            FIRST.append({"start": time.monotonic()})
        elif kind == "turn" and FIRST and isinstance(obj, dict):
            FIRST[-1]["ttft"] = obj.get("ttft_s")
        if kind == "turn_start" and not START:
            START.update(t=time.thread_time(), p=time.process_time(), w=time.monotonic(), clock=frames())
        elif kind == "turn" and START:
            # Every turn line moves the span's end: the last one closes it (what follows is idle).
            END.update(t=time.thread_time(), p=time.process_time(), w=time.monotonic(), acc=dict(ACC),
                       clock=tuple(b - a for a, b in zip(START["clock"], frames())),
                       calls=dict(CALLS))
        return feed(self, kind, obj, raw)

    LiveTrace.feed_line = mark_span


def report() -> None:
    if not END:
        print("parts: no turn finished", file=sys.stderr)
        return
    wall = END["w"] - START["w"]
    print(f"parts: {wall:.1f} s streaming; GUI thread {(END['t'] - START['t']) / wall:.4f} cores, process "
          f"{(END['p'] - START['p']) / wall:.4f} cores", file=sys.stderr)
    clock = END.get("clock")
    if clock:
        from kvinspect.gui.base.paint_clock import MIN_WHOLE_SHARE

        whole = (clock[0] - clock[1]) / clock[0] if clock[0] else 1.0
        print(f"  frames: {clock[0] / wall:.2f}/s, of them cut to their first part {clock[1] / wall:.2f}/s "
              f"(whole: {whole:.0%}; the floor is MIN_WHOLE_SHARE, {MIN_WHOLE_SHARE:.0%})", file=sys.stderr)
    for i, f in enumerate(FIRST):
        shown = f"{1e3 * (f['shown'] - f['start']):.0f} ms" if "shown" in f else "never"
        ttft = f"{1e3 * f['ttft']:.0f} ms" if isinstance(f.get("ttft"), (int, float)) else "-"
        print(f"  turn {i + 1}: first token on screen {shown} after its turn_start line (engine TTFT {ttft})",
              file=sys.stderr)
    rows = sorted(END["acc"].items(), key=lambda kv: -kv[1])
    events = [kv for kv in rows if kv[0].startswith("event ")]
    if events:
        print(f"  events (exclusive; all of them {sum(v for _, v in events) / wall:.4f} cores):", file=sys.stderr)
    for key, v in [kv for kv in rows if not kv[0].startswith("event ")] + events[:EVENTS_SHOWN]:
        n = END["calls"][key]
        print(f"  {key:22s} {v / wall:.4f} cores  {n / wall:5.1f}/s  {1e3 * v / max(n, 1):5.2f} ms a call",
              file=sys.stderr)


if __name__ == "__main__":
    sys.argv = ["kvinspect", *sys.argv[1:]]
    if os.environ.get("KVINSPECT_PARTS_EVENTS") == "1":
        _count_events()
    _install()
    if os.environ.get("KVINSPECT_PARTS_ITEMS") == "1":
        _count_items()
    atexit.register(report)
    runpy.run_module("kvinspect", run_name="__main__", alter_sys=True)
