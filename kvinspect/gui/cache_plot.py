"""The cache lanes: a layers × steps heatmap of stored length, and a tokens-per-layer plot.

Both draw from :class:`~.series.RecordSeries` windows sized to the plot's pixel width, so a
frame costs the same at 1k and at 100k steps.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore

from ..core.trace.series import MEAN_SEEN, MEAN_STORED, RecordSeries
from . import theme as th
from .lane_items import Curve, Heatmap, WindowPrefix, pixel_size
from .layer_info import layer_kinds, layer_windows
from .legend import LaneLegend
from .overlays import HLinesItem
from .plot_items import HGrid, LayerAxis, RegionsItem, StepAxis, StickyRange, ValueAxis, layer_ticks, merged_spans

AXIS_W = 72  # every lane's left and right axes have the same width, so their steps line up


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
            if rows or item._rects:  # (most models have neither kind: nothing to key or repaint)
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

    def refresh(self, s: RecordSeries, a: float, b: float, cols: int) -> int:
        """Draw steps ``a``…``b``; returns the top of the colour scale (the largest stored length in view).

        Scaled to the view, not the whole record: one runaway turn (a cache fed with
        use_cache=False holds thousands of rows) would otherwise paint every other turn flat.
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
        if not (top <= self._scale_top <= top * (1 + 2 / 256)):
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


#: Picked layers: their kind's colour, made lighter/darker for the 2nd, 3rd… of one kind.
_SHADES = (100, 145, 70, 180, 55, 210)


class TokensLane:
    """Mean seen/stored over layers, the picked layers' stored length, window reference lines."""

    def __init__(self, layout: pg.GraphicsLayout, row: int):
        self.plot = layout.addPlot(row=row, col=1, axisItems={"bottom": StepAxis("bottom"), "left": ValueAxis("left")})
        self.plot.hideButtons()
        self.plot.setMenuEnabled(False)
        self.plot.setLabel("left", "tokens")
        fixed_axes(self.plot)
        vb = self.plot.getViewBox()
        vb.setMouseEnabled(x=True, y=False)
        vb.disableAutoRange()
        self.yrange = StickyRange(keep_clear=0.28)  # the legend row sits over the lane's top
        self.grid = HGrid(self.plot, th.DARK.plot_fg, th.DARK.grid_alpha, th.DARK.plot_bg)
        self.legend = LaneLegend(self.plot, offset=(4, 2), columns=6, text_pt=8, ver_spacing=-6, hor_spacing=14)
        self.seen = self._curve("seen", pg.mkPen(th.DARK.seen, width=1.6, style=QtCore.Qt.PenStyle.DashLine))
        self.seen.setZValue(10)  # dashed, on top: every attention layer has seen this many tokens
        self.stored = self._curve("stored (mean)", pg.mkPen(th.DARK.stored, width=2.2))
        self.stored.setZValue(9)
        self.layer_curves: dict[int, pg.PlotDataItem] = {}
        self._prefix = WindowPrefix()
        self._layer_prefix: dict[int, WindowPrefix] = {}
        self.window_lines = HLinesItem()  # window/chunk sizes, under the curves
        self.window_lines.setZValue(-5)
        self.plot.addItem(self.window_lines, ignoreBounds=True)
        self.theme = th.DARK

    def data_items(self) -> list:
        return [self.seen, self.stored, *self.layer_curves.values()]

    def _curve(self, name: str, pen) -> Curve:
        c = Curve(pen, name=name)
        self.plot.addItem(c)
        self.legend.addItem(c, name)
        return c

    def reset(self, record) -> None:
        for c in list(self.layer_curves.values()):
            self._remove_curve(c)
        self.layer_curves.clear()
        self.seen.setData([], [])
        self.stored.setData([], [])
        self.yrange.reset()
        self.set_windows(record)

    def _remove_curve(self, c) -> None:
        self.plot.removeItem(c)
        self.legend.removeItem(c)

    def set_windows(self, record) -> None:
        self.windows: list[int] = []
        lines = []
        kinds, windows = layer_kinds(record), layer_windows(record)
        seen: dict[int, set[str]] = {}
        for k, w in zip(kinds, windows):
            if w and th.kind_base(k) in ("sliding", "chunked"):
                seen.setdefault(int(w), set()).add(th.kind_base(k))
        for w, ks in sorted(seen.items()):
            word = "chunk" if ks == {"chunked"} else "window"
            lines.append((w, th.kind_color(sorted(ks)[-1]), f"{word} {w}", 1.2, QtCore.Qt.PenStyle.DashDotLine))
            self.windows.append(w)
        self.window_lines.set_lines(lines)

    def set_picked(self, record, picked: list[int]) -> None:
        kinds = layer_kinds(record)
        for i in [i for i in self.layer_curves if i not in picked]:
            self._remove_curve(self.layer_curves.pop(i))
        count: dict[str, int] = {}
        for i in picked:
            k = th.kind_base(kinds[i] if i < len(kinds) else "full")
            shade = _SHADES[count.get(k, 0) % len(_SHADES)]
            count[k] = count.get(k, 0) + 1
            color = pg.mkColor(th.kind_color(k)).lighter(shade)
            if i in self.layer_curves:
                self.layer_curves[i].setPen(pg.mkPen(color, width=1.6))
                continue
            self.layer_curves[i] = self._curve(f"L{i} {k}", pg.mkPen(color, width=1.6))

    def refresh(self, s: RecordSeries, a: float, b: float, cols: int) -> None:
        if s.curves.n == 0:
            return
        win = s.curves.window(a, b, cols)
        layers = {i: s.layer(i).window(a, b, cols) for i in self.layer_curves}
        top = float(win[2][:, MEAN_SEEN].max(initial=0))
        for _x0, _stride, hi, _lo in layers.values():
            top = max(top, float(hi[:, 1].max(initial=0)))
        # A window line joins the range once the data come near it (a 4096 window must not squash 300 tokens).
        top = max([top] + [w for w in self.windows if top >= 0.5 * w])
        new = self.yrange.fit(0, top)  # the range first: the curves are drawn to its pixels
        if new is not None:
            self.plot.setYRange(*new, padding=0)
        k, px = self._prefix.points(*win), pixel_size(self.seen)  # one view box: its pixel size once
        self.seen.set_bins(win, MEAN_SEEN, k, px)
        self.stored.set_bins(win, MEAN_STORED, k, px)
        for i, curve in self.layer_curves.items():
            k = self._layer_prefix.setdefault(i, WindowPrefix()).points(*layers[i])
            curve.set_bins(layers[i], 1, k, px, gaps=True)  # no token axis (state, shared): a gap

    def apply_theme(self, t: th.Theme) -> None:
        self.theme = t
        self.grid.set_color(t.plot_fg, t.grid_alpha, t.plot_bg)
        self.seen.setPen(pg.mkPen(t.seen, width=1.6, style=QtCore.Qt.PenStyle.DashLine))
        self.stored.setPen(pg.mkPen(t.stored, width=2.2))


def fixed_axes(plot: pg.PlotItem, bottom_values: bool = False) -> None:
    """Same-width left/right axes on every lane (x stays aligned); step values only on the last lane."""
    plot.getAxis("left").setWidth(AXIS_W)
    plot.getAxis("top").unlinkFromView()  # never shown: following the view would only re-set its label
    plot.showAxis("right")
    right = plot.getAxis("right")
    right.setWidth(AXIS_W)
    if not right.labelText:
        right.setStyle(showValues=False, tickLength=0)
        # Only a spacer with an edge line: following the view would regenerate it on every zoom.
        right.unlinkFromView()
    if bottom_values:
        plot.getAxis("bottom").setStyle(showValues=True)
    else:
        plot.hideAxis("bottom")  # x is shared; only the last lane shows steps
        plot.getAxis("bottom").unlinkFromView()  # hidden: following the view only re-sets its label


def region_spans(record, series: RecordSeries, kinds=("window_reached", "chunk_reached"),
                 memo: dict | None = None) -> list:
    """Where layers stopped growing: from each event's step to the end of that cache object's life.

    ``memo`` (one dict per view, kept between frames) remembers how far each event's cache
    object was already followed, so a live frame scans only the new steps, not the whole run.
    """
    cid = series._raw_views.get("cache_id") if series._raw_views else None
    n = series.n
    memo = {} if memo is None else memo
    out = []
    for idx, e in enumerate(record.events):
        if e.kind not in kinds or not e.layers:
            continue
        end = n
        want = e.data.get("cache_id")
        if cid is not None and want is not None and e.step < n:
            key = (idx, e.step, want)
            done, found = memo.get(key, (e.step, None))
            if found is None and done < n:
                other = np.nonzero(cid[done:n] != want)[0]
                found = done + int(other[0]) if len(other) else None
                done = n
            if done > n:  # the record shrank (a new one): start over
                other = np.nonzero(cid[e.step:n] != want)[0]
                found, done = (e.step + int(other[0]) if len(other) else None), n
            memo[key] = (done, found)
            if found is not None and found < n:
                end = found
        runs = memo.get(("runs", idx, e.step))
        if runs is None:  # an event's layers never change: merged once, not on every frame
            runs = memo[("runs", idx, e.step)] = merged_spans(e.layers)
        for l0, l1 in runs:
            out.append((float(e.step), float(end), l0, l1))
    return out
