"""The memory lane: KV bytes stacked by device (left axis), process and accelerator memory (right).

Two axes because the scales differ by orders of magnitude: a tiny model's KV is kilobytes
while the process RSS is hundreds of megabytes; on one axis the KV would be a flat line.
Offloaded layers show up as bytes on ``cpu`` in the stack, because the record stores the
device each layer's keys are on at every step.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore

from kvinspect.core.trace.series import ACCEL_ALLOC, ACCEL_RESERVED, RSS, RecordSeries
from kvinspect.gui.base import theme as th
from kvinspect.gui.graphics.axes import BytesAxis, StepAxis
from kvinspect.gui.graphics.curve import Curve, WindowPrefix
from kvinspect.gui.graphics.grid_lines import HGrid
from kvinspect.gui.graphics.legend import LaneLegend
from kvinspect.gui.graphics.sticky_range import StickyRange
from kvinspect.gui.graphics.view_span import pixel_size
from kvinspect.gui.lanes.lane_axes import fixed_axes

#: The RSS is sampled by the process that runs the model (the engine, for a live session), never the window.
RSS_LABEL = "model process RSS"


class MemoryLane:
    def __init__(self, layout: pg.GraphicsLayout, row: int):
        self.plot = layout.addPlot(row=row, col=1, axisItems={
            "bottom": StepAxis("bottom"), "left": BytesAxis("left"), "right": BytesAxis("right")})
        self.plot.hideButtons()
        self.plot.setMenuEnabled(False)
        self.plot.setLabel("left", "KV bytes")
        self.plot.setLabel("bottom", "step (forward pass)")
        self.plot.setLabel("right", "model process")
        fixed_axes(self.plot, bottom_values=True)
        vb = self.plot.getViewBox()
        vb.setMouseEnabled(x=True, y=False)
        vb.disableAutoRange()
        # Headroom for the legend row, which sits over the top of the lane.
        self.kv_range = StickyRange(keep_clear=0.28)
        # At least 4 % of the value: a flat RSS is not zoomed into sub-MiB noise (nor tick labels too wide to fit).
        self.proc_range = StickyRange(headroom=0.3, zero=False, min_frac=0.04)
        self.grid = HGrid(self.plot, th.DARK.plot_fg, th.DARK.grid_alpha, th.DARK.plot_bg)
        # Right axis: a second view box that follows the first in x.
        self.vb2 = pg.ViewBox()
        self.vb2.setMouseEnabled(x=False, y=False)
        self.plot.scene().addItem(self.vb2)
        self.plot.getAxis("right").linkToView(self.vb2)
        self.vb2.setXLink(self.plot)
        self.vb2.disableAutoRange()
        vb.sigResized.connect(self._sync_views)
        self.legend = LaneLegend(self.plot, offset=(4, 2), columns=6, text_pt=8, ver_spacing=-6, hor_spacing=14)
        self.stack: dict[str, Curve] = {}
        self._stack_names: list[str] = []
        self._peaks_key = None
        self._peak_values: list[float] = []
        self._prefix = WindowPrefix()
        # The process that runs the model: the engine for a live session, never the window.
        self.rss = Curve(pg.mkPen(th.RSS_COLOR, width=1.4), name=RSS_LABEL)
        self.alloc = Curve(pg.mkPen(th.ALLOC_COLOR, width=1.4), name="accel allocated")
        self.reserved = Curve(pg.mkPen(th.RESERVED_COLOR, width=1.2, style=QtCore.Qt.PenStyle.DashLine),
                              name="accel reserved")
        self.peaks = Curve(pg.mkPen(th.RSS_COLOR, width=3), connect="pairs", name="peak per turn")
        for item in (self.rss, self.alloc, self.reserved, self.peaks):
            self.vb2.addItem(item)
            self.legend.addItem(item, item.name())
        # memory_retained events: KV bytes another object keeps alive, on the KV axis, per turn.
        dotted = QtCore.Qt.PenStyle.DotLine
        self.retained = Curve(pg.mkPen(th.STATUS_COLORS["warn"], width=2, style=dotted),
                              connect="pairs", name="KV retained elsewhere")
        self.plot.addItem(self.retained)
        self._retained_key = None
        self._retained_top = 0.0
        self._accel = False
        self.alloc.setVisible(False)
        self.reserved.setVisible(False)
        self._hide_legend(self.alloc)
        self._hide_legend(self.reserved)

    def data_items(self) -> list:
        return [*self.stack.values(), self.rss, self.alloc, self.reserved, self.peaks, self.retained]

    def _sync_views(self) -> None:
        self.vb2.setGeometry(self.plot.getViewBox().sceneBoundingRect())
        self.vb2.linkedViewChanged(self.plot.getViewBox(), self.vb2.XAxis)

    def _hide_legend(self, item) -> None:
        self.legend.removeItem(item)

    def reset(self, record) -> None:
        for item in self.stack.values():
            self.plot.removeItem(item)
            self.legend.removeItem(item)
        self.stack.clear()
        self._stack_names = []
        self._peaks_key = None
        self._peak_values = []
        self.kv_range.reset()
        self.proc_range.reset()
        for item in (self.rss, self.alloc, self.reserved, self.peaks):
            item.setData([], [])
        if self._accel:
            self._hide_legend(self.alloc)
            self._hide_legend(self.reserved)
        self._accel = False
        self.alloc.setVisible(False)
        self.reserved.setVisible(False)

    def _ensure_stack(self, s: RecordSeries) -> None:
        names = [name for name, _ in s.device_columns()]
        if self._stack_names == names:
            return
        self._stack_names = names
        for item in self.stack.values():
            self.plot.removeItem(item)
            self.legend.removeItem(item)
        self.stack.clear()
        # Largest (top of the stack) first, so each lower band paints over the one above it.
        for j, name in reversed(list(enumerate(names))):
            color = pg.mkColor(th.device_color(name, j))
            fill = pg.mkColor(color)
            fill.setAlpha(150)
            item = Curve(pg.mkPen(color, width=1.2), name=f"KV on {name}", connect="all", fill_level=0, brush=fill)
            item.setZValue(-10 - j)
            self.plot.addItem(item)
            self.stack[name] = item
        # Legend in stack order (bottom device first), before the process curves.
        for name in names:
            self.legend.removeItem(self.stack[name])
        for item in (self.rss, self.peaks, self.alloc, self.reserved):
            self.legend.removeItem(item)
        for name in names:
            self.legend.addItem(self.stack[name], f"KV on {name}")
        self.legend.addItem(self.rss, RSS_LABEL)
        self.legend.addItem(self.peaks, "peak per turn")
        if self._accel:
            self.legend.addItem(self.alloc, "accel allocated")
            self.legend.addItem(self.reserved, "accel reserved")

    def refresh(self, s: RecordSeries, record, turns, a: float, b: float, cols: int, ahead: int = 0,
                since: int = 0) -> None:
        """Draw steps ``a``…``b``; the KV range takes in the bytes ``ahead`` more steps may hold, at
        their rate since step ``since`` (a running turn's)."""
        if s.curves.n == 0:
            return
        self._ensure_stack(s)
        win = s.curves.window(a, b, cols)
        cols_dev = [col for _, col in s.device_columns()]
        kv_top = float(win[2][:, cols_dev[-1]].max(initial=0)) if cols_dev else 0.0
        if cols_dev:
            kv_top = max(kv_top, s.projected(cols_dev[-1], ahead, since) or 0.0)
        self._set_retained(record, turns)
        new = self.kv_range.fit(0, max(kv_top, self._retained_top, 1024))  # ranges first: curves follow their pixels
        if new is not None:
            self.plot.setYRange(*new, padding=0)
        k, px = self._prefix.points(*win), pixel_size(self.retained)  # the KV axis' view box
        for name, col in s.device_columns():
            self.stack[name].set_bins(win, col, k, px)
        proc = [RSS] + ([ACCEL_ALLOC, ACCEL_RESERVED] if self._accel else [])
        if not self._accel and win[2][:, ACCEL_RESERVED].max(initial=0) > 0:
            self._accel = True  # CUDA/MPS counters: shown only where they exist
            self.alloc.setVisible(True)
            self.reserved.setVisible(True)
            self.legend.addItem(self.alloc, "accel allocated")
            self.legend.addItem(self.reserved, "accel reserved")
        if self._accel:
            proc = [RSS, ACCEL_ALLOC, ACCEL_RESERVED]
        key = tuple((t.index, t.status, t.end_step) for t in turns)
        if key != self._peaks_key:
            self._peaks_key = key
            self._peak_values = self._set_peaks(turns)
        peaks = self._peak_values
        lo_rows = win[3] if win[3] is not None else win[2]
        lo = min(float(lo_rows[:, c].min(initial=np.inf)) for c in proc)
        hi = max([float(win[2][:, c].max(initial=0)) for c in proc] + peaks)
        new = self.proc_range.fit(lo, hi)
        if new is not None:
            self.vb2.setYRange(*new, padding=0)
        px = pixel_size(self.rss)  # the right axis' view box
        self.rss.set_bins(win, RSS, k, px)
        if self._accel:
            self.alloc.set_bins(win, ACCEL_ALLOC, k, px)
            self.reserved.set_bins(win, ACCEL_RESERVED, k, px)

    def _set_retained(self, record, turns) -> None:
        """A dotted segment at each memory_retained event's bytes, across the turn it was found after."""
        events = [e for e in getattr(record, "events", []) if e.kind == "memory_retained"]
        key = tuple((e.turn, e.step, e.data.get("bytes")) for e in events)
        if key == self._retained_key:
            return
        self._retained_key = key
        spans = {t.index: (t.first_step, max(t.end_step - 1, t.first_step)) for t in turns}
        xs, ys = [], []
        for e in events:
            nbytes = float(e.data.get("bytes") or 0)
            xs += list(spans.get(e.turn, (e.step, e.step)))
            ys += [nbytes, nbytes]
        self._retained_top = max(ys, default=0.0)
        self.retained.setData(np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64))
        if events and self.retained.name() not in self.legend.names():
            self.legend.addItem(self.retained, self.retained.name())

    def _set_peaks(self, turns) -> list[float]:
        xs, ys = [], []
        for t in turns:
            if t.status == "running" or t.end_step <= t.first_step:
                continue
            peak = t.peak_accel_bytes if self._accel and t.peak_accel_bytes else t.peak_rss
            if peak:
                xs += [t.first_step, t.end_step - 1]
                ys += [peak, peak]
        self.peaks.setData(np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64))
        self.peaks.setPen(pg.mkPen(th.ALLOC_COLOR if self._accel else th.RSS_COLOR, width=3))
        return ys

    def apply_theme(self, t: th.Theme) -> None:
        self.grid.set_color(t.plot_fg, t.grid_alpha, t.plot_bg)
