"""How long one redraw of the live plots takes, at 80 layers × 100k steps (goals: full view ≤ 8 ms, live ≤ 4 ms CPU).

A redraw = ``PlotsWidget.render(record)`` (decimate to the view's pixel width, setData on
every item) + a synchronous ``repaint()`` of the plot view, offscreen, at 1000 × 600. Measured
in three situations, interleaved round by round, median of the rounds:

* ``full view``: 100k steps, whole run in view, forced redraw right after the previous round's
  zoom (Fit, a theme change): every range changes; the items take back what they drew for
  this view when its data did not change (``lane_items.ZoomMemo``; a resize draws it all);
* ``full view, nothing kept``: the same after every item's ``ZoomMemo`` was emptied, as after
  a resize or on a new record: what a full view costs when everything is built again;
* ``live``: one new step per frame appended to the 100k-step record (follow mode);
* ``live, dirty region``: the same, painted as the window paints it: the event loop runs and Qt
  repaints only what the items marked dirty (``live`` forces a repaint of the whole view); the
  share of the view's pixels repainted per frame is printed;
* ``zoom/pan``: a 2,000-step window that moves every frame (ticks regenerate every time).

Both wall time and the GUI thread's CPU time are printed: on a shared machine other
processes stretch the wall time (the slowdown factor, wall/CPU of a plain Python loop, is
printed too), while the CPU time is what the redraw costs on an idle one. The baseline,
measured in the same process, is a naive heatmap: the 80 × 100k cells set without
decimation (before any painting). Usage:
``QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/redraw.py [--steps N] [--layers L] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from PySide6 import QtWidgets  # (binding before pyqtgraph)


def synthetic_record(n_steps: int, n_layers: int, turns: int = 20):
    """A record shaped like a long hybrid-model chat: 5 sliding layers in 6, window 4096."""
    from kvinspect.core.detect.events import Event
    from kvinspect.core.trace.record import TraceRecord, TurnRecord

    window = 4096
    kinds = ["sliding" if (i % 6) != 5 else "full" for i in range(n_layers)]
    header = {"layers": [{"index": i, "config_attention": k, "layer_type": f"{k}_attention",
                          "window": window if k == "sliding" else None} for i, k in enumerate(kinds)],
              "model": {"dtype": "bfloat16"}}
    r = TraceRecord(n_layers, header)
    r.set_devices(["cuda:0", "cpu"])
    seen = np.arange(1, n_steps + 1, dtype=np.int32)
    full = np.repeat(seen[:, None], n_layers, axis=1)
    sliding = np.minimum(full, window - 1)
    is_sliding = np.array([k == "sliding" for k in kinds])
    stored = np.where(is_sliding[None, :], sliding, full).astype(np.int32)
    per = n_steps // turns
    cols = {
        "turn": (np.arange(n_steps) // per).astype(np.int32),
        "t": np.arange(n_steps, dtype=np.float64) * 0.02,
        "cache_id": np.ones(n_steps, dtype=np.int32),
        "q_len": np.ones(n_steps, dtype=np.int32),
        "use_cache": np.ones(n_steps, dtype=np.int8),
        "rss": (2e9 + np.arange(n_steps) * 1e3).astype(np.int64),
        "accel_allocated": (1e9 + stored.sum(axis=1) * 2048).astype(np.int64),
        "accel_reserved": (1.2e9 + stored.sum(axis=1) * 2048).astype(np.int64),
        "seen": full, "stored": stored,
        "dev": np.where(np.arange(n_layers)[None, :] < n_layers - 8, 0, 1).repeat(n_steps, 0).astype(np.int8),
        "nbytes": (stored.astype(np.int64) * 2048),
    }
    r.append_columns(cols)
    for k in range(turns):
        r.add_turn(TurnRecord(index=k, first_step=k * per, end_step=(k + 1) * per, status="ok", peak_rss=int(2e9)))
    r.add_event(Event("window_reached", "info", 0, window - 1, "sliding layers stopped growing",
                      layers=[i for i in range(n_layers) if kinds[i] == "sliding"], data={"cache_id": 1}))
    for k in range(1, turns, 4):
        r.add_event(Event("cache_recreated", "warn", k, k * per, "a new cache object", data={"cache_id": 1}))
    return r


def _slowdown() -> float:
    """Wall/CPU of a plain Python loop on this thread: 1.0 on an idle machine."""
    r = []
    for _ in range(7):
        w, c = time.perf_counter(), time.thread_time()
        x = 0
        for i in range(300_000):
            x += i
        r.append((time.perf_counter() - w) / max(time.thread_time() - c, 1e-6))
    return sorted(r)[3]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # here, not at import: tests import this module

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    from kvinspect.gui.base import theme as th
    from kvinspect.gui.lanes.lanes_widget import PlotsWidget

    t0 = time.perf_counter()
    rec = synthetic_record(args.steps, args.layers)
    build_s = time.perf_counter() - t0
    w = PlotsWidget()
    w.resize(1000, 600)
    w.apply_theme(th.DARK)
    w.show()
    app.processEvents()
    t0 = time.perf_counter()
    w.render(rec, force=True)
    first_s = time.perf_counter() - t0  # includes building the pyramids over all 100k steps once
    app.processEvents()
    vp = w.view.viewport()

    # Live: a second record that starts with all but `rounds * 3` steps and grows one step per frame.
    live = synthetic_record(args.steps, args.layers)
    cols = {name: live.col(name).copy() for name in ("turn", "t", "cache_id", "q_len", "use_cache", "rss",
                                                     "accel_allocated", "accel_reserved", "seen", "stored",
                                                     "dev", "nbytes")}
    grow = args.rounds * 4
    head = {k: v[: args.steps - grow] for k, v in cols.items()}
    live2 = type(live)(args.layers, live.header)
    live2.set_devices(live.devices)
    live2.append_columns(head)
    for t in live.turns:
        live2.add_turn(t)
    for e in live.events:
        live2.add_event(e)
    lw = PlotsWidget()
    lw.resize(1000, 600)
    lw.apply_theme(th.DARK)
    lw.show()
    app.processEvents()
    lw.render(live2, force=True)
    app.processEvents()
    at = args.steps - grow

    naive = __import__("pyqtgraph").ImageItem()

    def timed(fn) -> tuple[float, float]:
        w, c = time.perf_counter(), time.thread_time()
        fn()
        return (time.perf_counter() - w) * 1000, (time.thread_time() - c) * 1000

    def full_view():
        w.set_follow(True)
        w.render(rec, force=True)
        vp.repaint()

    pan = {"at": args.steps // 2}

    def zoomed():
        w.set_follow(False)
        pan["at"] += 37
        w.heat.plot.setXRange(pan["at"] - 1000, pan["at"] + 1000, padding=0)
        w.render(rec, force=True)
        vp.repaint()

    def append_one():  # the worker's job, not timed
        nonlocal at
        live2.append_columns({k: v[at: at + 1] for k, v in cols.items()})
        at += 1

    def live_frame():
        lw.render(live2)
        lw.view.viewport().repaint()

    from PySide6 import QtCore

    painted: list[float] = []

    class PaintedArea(QtCore.QObject):
        def eventFilter(self, obj, ev):  # noqa: N802 - Qt's name
            if ev.type() == QtCore.QEvent.Type.Paint:
                area = sum(r.width() * r.height() for r in ev.region())
                painted.append(area / max(obj.width() * obj.height(), 1))
            return False

    area_filter = PaintedArea()
    lw.view.viewport().installEventFilter(area_filter)

    def live_dirty():
        lw.render(live2)
        app.sendPostedEvents()
        app.processEvents()  # the scene's dirty items, then the viewport's paint of their region
        app.processEvents()

    def baseline():
        naive.setImage(rec.col("stored"), levels=(0, args.steps))
        naive.render()  # what a plot would have to do to show every cell, before painting

    from kvinspect.gui.graphics.view_span import ZoomMemo

    def forget_views():  # not timed: every item's memo of the views it drew, emptied
        for item in w.view.scene().items():
            for v in list(vars(item).values()):
                if isinstance(v, ZoomMemo):
                    v.clear()

    lw.growing = True  # as while generating: the view grows in steps
    live_area: list[float] = []
    res = {"full view": [], "full view, nothing kept": [], "live": [], "live, dirty region": [], "zoom/pan": [],
           "baseline (no decimation)": []}
    for _ in range(args.rounds):  # interleaved: load on the machine hits every variant alike
        res["full view"].append(timed(full_view))
        append_one()
        res["live"].append(timed(live_frame))
        append_one()
        painted.clear()
        res["live, dirty region"].append(timed(live_dirty))
        live_area.append(sum(painted))
        res["zoom/pan"].append(timed(zoomed))
        forget_views()
        res["full view, nothing kept"].append(timed(full_view))
        zoomed()  # the next round's full view follows a zoom again
        res["baseline (no decimation)"].append(timed(baseline))
        app.processEvents()

    cols_drawn = w.heat.img.image.shape[0] if w.heat.img.image is not None else 0
    slow = _slowdown()
    print(f"redraw, {args.layers} layers × {args.steps:,} steps, plot 1000×600, {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f}, CPU slowdown {slow:.2f}×")
    print(f"  record built in {build_s:.2f} s; first render (pyramids over every step) {first_s * 1000:.0f} ms")
    base = statistics.median(c for _, c in res["baseline (no decimation)"])
    med = {}
    for name, v in res.items():
        wall, cpu = statistics.median(x for x, _ in v), statistics.median(c for _, c in v)
        med[name] = cpu
        print(f"  {name:26s} wall median {wall:7.2f} ms   CPU median {cpu:6.2f} ms (min {min(c for _, c in v):6.2f}, "
              f"max {max(c for _, c in v):6.2f})   {cpu / base:.2f}× baseline")
    print(f"  heatmap columns uploaded per frame: {cols_drawn} (of {args.steps:,} steps)")
    print(f"  live, dirty region: median {statistics.median(live_area) * 100:.1f} % of the view's pixels "
          f"repainted a frame (max {max(live_area) * 100:.1f} %)")
    for name, limit in (("full view", 8.0), ("full view, nothing kept", 8.0), ("live", 4.0)):
        print(f"  goal {name} ≤ {limit:g} ms CPU: {'met' if med[name] <= limit else 'NOT met'}")
    w.close()
    lw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
