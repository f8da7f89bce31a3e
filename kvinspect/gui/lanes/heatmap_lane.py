"""The heatmap lane: layers × steps of stored length, the layer-kind strip and its legend.

Draws from :class:`~kvinspect.core.trace.series.RecordSeries` windows sized to the plot's pixel width,
so a frame costs the same at 1k and at 100k steps."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore

from kvinspect.core.trace.series import RecordSeries
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.record_layers import layer_kinds
from kvinspect.gui.graphics.axes import LayerAxis, StepAxis, layer_ticks
from kvinspect.gui.graphics.heatmap import Heatmap
from kvinspect.gui.graphics.regions import RegionsItem
from kvinspect.gui.graphics.sticky_range import growth_ceiling
from kvinspect.gui.lanes.lane_axes import fixed_axes


class HeatmapLane:
    """Stored tokens per layer (rows) and step (columns); the layer axis carries a kind chip per row."""

    def __init__(self, layout: pg.GraphicsLayout, row: int):
        self.axis = LayerAxis("left")
        self.plot = layout.addPlot(row=row, col=1, axisItems={"bottom": StepAxis("bottom"), "left": self.axis})
        self.plot.hideButtons()
        self.plot.setMenuEnabled(False)
        self.plot.setLabel("left", "layer")
        fixed_axes(self.plot)
        vb = self.plot.getViewBox()
        vb.invertY(True)
        vb.setMouseEnabled(x=True, y=False)
        vb.setDefaultPadding(0)
        self.img = Heatmap(pg.colormap.get("viridis").getLookupTable(nPts=256))
        self.plot.addItem(self.img)
        self.regions = RegionsItem(th.DARK.region)
        self.regions.setZValue(5)
        self.plot.addItem(self.regions, ignoreBounds=True)
        # Rows of layers with no token axis (recurrent state, KV-shared): "stored" would read as an empty 0,
        # so they are hatched in their kind's colour across the whole lane instead.
        self.no_tokens = {k: RegionsItem(th.KIND_COLORS[k] + "55") for k in ("state", "shared")}
        for item in self.no_tokens.values():
            item.setZValue(4)
            self.plot.addItem(item, ignoreBounds=True)
        self.n_layers = 0
        self._tick_h = -1.0
        self._scale_top = 0.0
        self._window_key: tuple | None = None
        self._window_len = 0
        self._no_token_rows: dict[str, list[int]] = {}
        self._no_token_span = None

    def _mark_no_tokens(self, kinds: list[str]) -> None:
        self._no_token_rows = {k: [i for i, x in enumerate(kinds) if th.kind_base(x) == k] for k in self.no_tokens}
        self._no_token_span = None

    def _draw_no_tokens(self, x0: float, width: float) -> None:
        if self._no_token_span == (x0, width):
            return
        self._no_token_span = (x0, width)
        for k, item in self.no_tokens.items():
            rows = self._no_token_rows.get(k, [])
            if rows or item.rects:  # (most models have neither kind: nothing to key or repaint)
                item.set_rects([QtCore.QRectF(x0, i, width, 1) for i in rows])

    def reset(self, record) -> None:
        self.n_layers = record.n_layers
        self.axis.set_kinds(layer_kinds(record))
        self._mark_no_tokens(layer_kinds(record))
        self.axis.setTicks(layer_ticks(self.n_layers, self.plot.getViewBox().height()))
        self.plot.setYRange(0, max(self.n_layers, 1), padding=0)
        self.img.clear()
        self.regions.set_rects([])
        self._tick_h = -1.0
        self._scale_top = 0.0
        self._window_key = None
        self._window_len = 0

    def data_items(self) -> list:
        """The items drawn from the record (``invalidate()`` on a forced redraw)."""
        return [self.img, self.regions, *self.no_tokens.values()]

    def update_kinds(self, record) -> None:
        self.axis.set_kinds(layer_kinds(record))
        self._mark_no_tokens(layer_kinds(record))

    def refresh(self, s: RecordSeries, a: float, b: float, cols: int, growing: bool = False,
                reach: float | None = None) -> int:
        """Draw steps ``a``…``b``; returns the top of the colour scale (the largest stored length in view).

        Scaled to the view, not the whole record: one runaway turn (a cache fed with
        use_cache=False holds thousands of rows) would otherwise paint every other turn flat.
        ``growing`` (a generation streams): the top moves in steps with headroom, as the step axis
        does, so a new token does not recolour every cell; at rest it is the largest length again.
        ``reach``: the longest length a running turn may get to (the scale takes it in).
        """
        h = self.plot.getViewBox().height()
        if abs(h - self._tick_h) > 1:
            self._tick_h = h
            ticks = layer_ticks(self.n_layers, h)
            self.plot.getAxis("left").setTicks(ticks)
        if s.stored.n == 0:
            self.img.clear()
            return 0
        x0, stride, hi, _ = s.stored.window(a, b, cols)
        if len(hi) == 0:
            self.img.clear()
            return 0
        top = max(int(hi.max()), 1)
        # The colour scale's top moves only when the largest length in view leaves a band just
        # above it (cells stay within two of the 256 colour steps of an exact scale): while a run
        # grows the cells keep their colours, so only the newest column is mapped again and most
        # frames upload nothing.
        if growing:
            need = max(top, reach or 0.0)
            if not (need <= self._scale_top <= need * 2.5):
                self._scale_top = growth_ceiling(max(top * 1.15, need))  # (a reach is a bound: no headroom)
            top = int(self._scale_top)
        elif not (top <= self._scale_top <= top * (1 + 2 / 256)):
            self._scale_top = top * (1 + 1 / 256)
        same = (x0, stride, self._scale_top)
        prefix = max(self._window_len - 1, 0) if same == self._window_key else 0
        self._window_key, self._window_len = same, len(hi)
        self.img.set_window(hi, self._scale_top, QtCore.QRectF(x0, 0, len(hi) * stride, self.n_layers), prefix)
        self._draw_no_tokens(float(x0), float(len(hi) * stride))
        return top

    def set_regions(self, spans: list[tuple[float, float, int, int]]) -> None:
        """``(x0, x1, layer0, layer1)`` rectangles where layers stopped growing."""
        sp = np.asarray(spans, dtype=np.float64).reshape(-1, 4)  # x0, x1, l0, l1
        self.regions.set_boxes(np.stack([sp[:, 0], sp[:, 2], sp[:, 0] + np.maximum(sp[:, 1] - sp[:, 0], 0.5),
                                         sp[:, 3]], axis=1))

    def apply_theme(self, t: th.Theme) -> None:
        self.regions.set_color(t.region)
