"""The tokens lane: seen and stored per layer (mean and picked layers) on the shared step axis.

Draws from :class:`~kvinspect.core.trace.series.RecordSeries` windows sized to the plot's pixel width,
so a frame costs the same at 1k and at 100k steps."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6 import QtCore

from kvinspect.core.trace.series import MEAN_SEEN, MEAN_STORED, RecordSeries
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.record_layers import layer_kinds, layer_windows
from kvinspect.gui.graphics.axes import StepAxis, ValueAxis
from kvinspect.gui.graphics.curve import Curve, WindowPrefix
from kvinspect.gui.graphics.grid_lines import HGrid
from kvinspect.gui.graphics.horizontal_lines import HLinesItem
from kvinspect.gui.graphics.legend import LaneLegend
from kvinspect.gui.graphics.regions import RegionsItem
from kvinspect.gui.graphics.sticky_range import StickyRange
from kvinspect.gui.graphics.view_span import pixel_size
from kvinspect.gui.lanes.lane_axes import fixed_axes

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
        # Image spans: the positions of each image, shaded per layer kind while that kind's layers hold them.
        self.image_items: dict[str, RegionsItem] = {}
        self.image_labels: dict[int, pg.TextItem] = {}
        self._image_key: tuple | None = None
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
        self.set_image_bands([])
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

    def set_image_bands(self, bands, step: int | None = None) -> None:
        """Shade each image's positions (y) over the steps (x) its kind's layers hold them: a sliding layer's band
        ends where the window let the image go, the full layers' runs on."""
        by_kind: dict[str, list[tuple[float, float, float, float]]] = {}
        labels: dict[int, tuple[float, float, str]] = {}
        order = {"full": 0, "chunked": 1, "sliding": 2}
        kinds = sorted({b.kind for b in bands}, key=lambda k: order.get(k, 3))
        for b in bands:
            if step is not None and b.x0 > step:
                continue
            x1 = b.x1 if step is None else min(b.x1, step + 1)
            # One strip of the span's height per kind (full at the bottom): where both hold it both colours show,
            # and a sliding layer letting the image go leaves only the full strip.
            h = (b.last + 1 - b.first) / len(kinds)
            y0 = b.first + kinds.index(b.kind) * h
            by_kind.setdefault(b.kind, []).append((float(b.x0), float(y0), float(x1), float(y0 + h)))
            labels.setdefault(b.image, (float(b.x0), float(b.last + 1), f"image {b.image + 1} #{b.hash[:4]}"))
        key = (tuple(sorted((k, tuple(v)) for k, v in by_kind.items())), tuple(sorted(labels.items())))
        if key == self._image_key:
            return
        self._image_key = key
        for kind in set(self.image_items) - set(by_kind):
            self.image_items.pop(kind).set_boxes([])
        for kind, boxes in by_kind.items():
            item = self.image_items.get(kind)
            if item is None:
                item = self.image_items[kind] = RegionsItem(th.kind_color(kind) + "66")
                item.setZValue(-4)
                self.plot.addItem(item, ignoreBounds=True)
            item.set_boxes(boxes)
        for i in set(self.image_labels) - set(labels):
            self.plot.removeItem(self.image_labels.pop(i))
        for i, (x, y, text) in labels.items():
            lab = self.image_labels.get(i)
            if lab is None:
                lab = self.image_labels[i] = pg.TextItem(anchor=(0, 1), color=self.theme.plot_fg)
                lab.setZValue(8)
                self.plot.addItem(lab, ignoreBounds=True)
            lab.setText(text)
            lab.setPos(x, y)

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

    def refresh(self, s: RecordSeries, a: float, b: float, cols: int, reach: float | None = None) -> None:
        """Draw steps ``a``…``b``; ``reach``: the tokens seen a running turn may get to (the y range takes it in)."""
        if s.curves.n == 0:
            return
        win = s.curves.window(a, b, cols)
        layers = {i: s.layer(i).window(a, b, cols) for i in self.layer_curves}
        top = float(win[2][:, MEAN_SEEN].max(initial=0))
        for _x0, _stride, hi, _lo in layers.values():
            top = max(top, float(hi[:, 1].max(initial=0)))
        top = max(top, reach or 0.0)
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
