"""Small pyqtgraph building blocks shared by the plot lanes and the report figures: axes (bytes,
steps, layer kinds), overlays."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets

from ..core.units import byte_scale
from . import theme as th


class BytesAxis(pg.AxisItem):
    """Ticks at round numbers of one binary unit (0, 50 KiB, 100 KiB…), labelled with it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.enableAutoSIPrefix(False)  # the tick labels carry the unit; no "(x1e+09)" on the label

    @staticmethod
    def _scale(lo: float, hi: float) -> tuple[float, str]:
        # From the span, not the magnitude: 1.076–1.082 GiB reads better as 1102…1108 MiB.
        return byte_scale(abs(hi - lo) or max(abs(lo), abs(hi), 1.0))

    def tickSpacing(self, minVal, maxVal, size):
        u, _ = self._scale(minVal, maxVal)
        return [(a * u, b * u) for a, b in super().tickSpacing(minVal / u, maxVal / u, size)]

    def tickStrings(self, values, scale, spacing):
        if not values:
            return []
        u, unit = self._scale(*sorted(self.range))  # the same view range tickSpacing saw
        step = spacing / u if spacing else 1
        digits = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
        return [f"{v / u:.{digits}f} {unit}" if v else "0" for v in values]


class StepAxis(pg.AxisItem):
    """The forward-pass axis of the window's lanes and of the report figures: whole step ticks from 0.

    The view may reach left of step 0 (the report's layer-kind strip, padding), where pyqtgraph's
    default ticks would label ``-1``; a short trace would get ``0.5`` steps, which do not exist;
    and SI scaling (``k`` for thousands) reads wrong for steps: labels are integers, ``1,000``.
    """

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.enableAutoSIPrefix(False)

    def tickValues(self, minVal, maxVal, size):
        levels = [(spacing, [v for v in values if v >= 0 and float(v).is_integer()])
                  for spacing, values in super().tickValues(minVal, maxVal, size) if spacing >= 1]
        levels = [(spacing, values) for spacing, values in levels if values]
        if not levels and math.isfinite(minVal) and math.isfinite(maxVal):
            # Zoomed into a step or two (or a two-step trace): the default spacing was below a step.
            lo, hi = max(0, math.ceil(minVal)), math.floor(maxVal)
            levels = [(1.0, [float(v) for v in range(lo, hi + 1)])] if hi - lo < 1000 else []
        return levels

    def tickStrings(self, values, scale, spacing):
        return [f"{int(round(v)):,}" if abs(v - round(v)) < 1e-6 else "" for v in values]


class LayerAxis(pg.AxisItem):
    """The heatmap's layer axis, with each layer's kind as a colour chip right next to its row."""

    CHIP = 7

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.colors: list[QtGui.QColor] = []
        self.enableAutoSIPrefix(False)
        self.setStyle(tickLength=0, tickTextOffset=self.CHIP + 5)  # labels clear of the chips

    def set_kinds(self, kinds: list[str]) -> None:
        self.colors = [QtGui.QColor(th.kind_color(k)) for k in kinds]
        self.update()

    def paint(self, p, opt, widget) -> None:
        super().paint(p, opt, widget)
        view = self.linkedView()
        if view is None or not self.colors:
            return
        y0, y1 = view.viewRange()[1]
        h = self.geometry().height()
        if y1 <= y0 or h <= 0:
            return
        inverted = view.yInverted()

        def to_px(v: float) -> float:
            f = (v - y0) / (y1 - y0)
            return f * h if inverted else (1 - f) * h

        x = self.geometry().width() - self.CHIP
        for i, c in enumerate(self.colors):
            a, b = sorted((to_px(i), to_px(i + 1)))
            if b < 0 or a > h:
                continue
            p.fillRect(QtCore.QRectF(x, a, self.CHIP, max(b - a, 1.0)), c)


def layer_ticks(n_layers: int, px_height: float) -> list:
    """Major ticks at layer centres, thinned so labels never overlap (≥ 14 px apart)."""
    if n_layers <= 0:
        return [[]]
    per = max(px_height, 1.0) / n_layers
    every = next((e for e in (1, 2, 5, 10, 20, 50, 100, 200, 500) if per * e >= 14), 1000)
    return [[(i + 0.5, str(i)) for i in range(0, n_layers, every)]]


def merged_spans(layers: list[int]) -> list[tuple[int, int]]:
    """[3, 0, 1, 2, 5] → [(0, 4), (5, 6)]: contiguous layer ranges, end exclusive."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(layers)):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


class RegionsItem(pg.GraphicsObject):
    """Many hatched rectangles in one item (window/chunk reached): one paint call, any count."""

    def __init__(self, color: str):
        super().__init__()
        self._rects: list[QtCore.QRectF] = []
        self._color = pg.mkColor(color)  # "#RRGGBBAA" (QColor would read #AARRGGBB)
        self._bounds = QtCore.QRectF()

    def set_rects(self, rects: list[QtCore.QRectF]) -> None:
        self.prepareGeometryChange()
        self._rects = rects
        b = QtCore.QRectF()
        for r in rects:
            b = b.united(r)
        self._bounds = b
        self.update()

    def set_color(self, color: str) -> None:
        self._color = pg.mkColor(color)
        self.update()

    def boundingRect(self) -> QtCore.QRectF:
        return self._bounds

    def paint(self, p, *args) -> None:
        if not self._rects:
            return
        edge = QtGui.QColor(self._color)
        edge.setAlpha(200)
        pen = pg.mkPen(edge, width=1.5)
        pen.setCosmetic(True)
        hatch = QtGui.QBrush(edge, QtCore.Qt.BrushStyle.BDiagPattern)
        hatch.setTransform(QtGui.QTransform(p.transform().inverted()[0]))  # hatch in pixels, not data units
        fill = QtGui.QBrush(self._color)
        p.setPen(pen)
        for r in self._rects:
            p.fillRect(r, fill)
            p.fillRect(r, hatch)
            p.drawRect(r)


class HGrid(pg.GraphicsObject):
    """Horizontal grid lines at the ticks of ``plot``'s left axis, drawn in its view box.

    pyqtgraph's own grid is part of the axis: the axis' cached picture then spans the whole
    plot, and every range change re-rasterises it with the tick labels (measured: 7 of the
    19 ms a zoom costs). A few cosmetic lines painted here cost next to nothing and need no cache.
    """

    def __init__(self, plot: pg.PlotItem, color: str = "#FFFFFF", alpha: float = 0.15):
        super().__init__()
        self.axis = plot.getAxis("left")
        # Without a grid an axis no longer spans the plot, and pyqtgraph would let a vertical
        # axis' edge labels spill 15 px into the next lane: keep them inside, as before.
        for name in ("left", "right"):
            plot.getAxis(name).setStyle(hideOverlappingLabels=True)
        plot.getViewBox().addItem(self, ignoreBounds=True)
        self.setZValue(-100)  # under every curve
        self.set_color(color, alpha)

    def set_color(self, color: str, alpha: float) -> None:
        c = pg.mkColor(color)
        c.setAlphaF(alpha)
        self._pens = [pg.mkPen(c, width=1, cosmetic=True)]
        c2 = QtGui.QColor(c)
        c2.setAlphaF(alpha / 2)
        self._pens.append(pg.mkPen(c2, width=1, cosmetic=True))
        self.update()

    def boundingRect(self) -> QtCore.QRectF:
        vb = self.getViewBox()
        return vb.viewRect() if vb is not None else QtCore.QRectF()

    def viewRangeChanged(self) -> None:
        self.prepareGeometryChange()
        self.update()

    def paint(self, p, *args) -> None:
        vb = self.getViewBox()
        if vb is None:
            return
        rect = vb.viewRect()
        lo, hi = rect.top(), rect.bottom()
        levels = self.axis.tickValues(min(lo, hi), max(lo, hi), max(vb.height(), 1.0))
        for pen, (_spacing, values) in zip(self._pens, levels):
            p.setPen(pen)
            for y in values:
                p.drawLine(QtCore.QPointF(rect.left(), y), QtCore.QPointF(rect.right(), y))


def vline(color: str, style=QtCore.Qt.PenStyle.SolidLine, width: float = 1.0, label: str | None = None,
          label_pos: float = 0.95, label_color: str | None = None) -> pg.InfiniteLine:
    pen = pg.mkPen(color, width=width, style=style)
    opts = {}
    if label:
        opts = {"label": label, "labelOpts": {"position": label_pos, "color": label_color or color,
                                              "movable": False, "anchors": [(0, 0.5), (0, 0.5)]}}
    line = pg.InfiniteLine(angle=90, movable=False, pen=pen, **opts)
    line.setZValue(20)
    if label:
        line.label.setCacheMode(QtWidgets.QGraphicsItem.CacheMode.DeviceCoordinateCache)
    return line


def nice_ceiling(v: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k that is ≥ v."""
    if v <= 0:
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * k >= v:
            return m * k
    return 10 * k


class StickyRange:
    """A y (or x) range with headroom that changes only when the data leave it or shrink far below it.

    Live plots that re-fit every frame jitter and force every axis to regenerate its ticks; a
    range that grows in steps keeps axes cached and the picture calm.
    """

    def __init__(self, headroom: float = 0.15, shrink: float = 0.35, zero: bool = True, min_frac: float = 0.01,
                 keep_clear: float = 0.0):
        self.headroom, self.shrink, self.zero = headroom, shrink, zero
        # Fraction of the range at the top that data must never enter (a legend row sits there).
        self.keep_clear = keep_clear
        self.min_frac = min_frac  # the narrowest span, as a fraction of the value (a flat line is not noise)
        self.lo: float | None = None
        self.hi: float | None = None

    def reset(self) -> None:
        self.lo = self.hi = None

    def fit(self, lo: float, hi: float) -> tuple[float, float] | None:
        """New (lo, hi) when the range must change, else None."""
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        if self.zero:
            lo = 0.0
        span = max(hi - lo, abs(hi) * self.min_frac, 1.0)
        top_ok = self.hi is not None and hi <= self.hi - self.keep_clear * (self.hi - (self.lo or 0.0))
        if self.lo is not None and self.lo <= lo and top_ok and span >= self.shrink * (self.hi - self.lo):
            return None
        if self.zero:
            want = max(hi * (1 + self.headroom), hi / (1 - self.keep_clear)) if self.keep_clear < 1 else hi
            new = (0.0, nice_ceiling(want) if hi > 0 else 1.0)
        else:
            mid, m = (lo + hi) / 2, span * (0.5 + self.headroom)
            new = (mid - m, mid + m)
        self.lo, self.hi = new
        return new


def gradient_pixmap(w: int, h: int) -> QtGui.QPixmap:
    lut = pg.colormap.get("viridis").getLookupTable(nPts=w)
    img = QtGui.QImage(w, h, QtGui.QImage.Format.Format_RGB32)
    for x in range(w):
        c = QtGui.QColor(int(lut[x][0]), int(lut[x][1]), int(lut[x][2])).rgb()
        for y in range(h):
            img.setPixel(x, y, c)
    return QtGui.QPixmap.fromImage(img)


MAX_PICKED = 6  # layer curves at once: more turns the tokens lane into noise


def default_picks(kinds: list[str]) -> list[int]:
    """The first layer of each kind: a hybrid model shows sliding against full at once."""
    out, seen = [], set()
    for i, k in enumerate(kinds):
        b = th.kind_base(k)
        if b not in seen and b not in ("shared",):
            seen.add(b)
            out.append(i)
    return out[:MAX_PICKED]
