"""Vertical marker lines across every lane (turn boundaries, recreated caches), one item per lane.

One ``InfiniteLine`` per turn per lane cost ~0.1 ms each on every zoom or pan (pyqtgraph
recomputes each line's bounds): 100 of them were 12 ms of a redraw. Here each lane has one
item that draws every line in view in one call, from the top of its view to the bottom, so a
y-range change moves nothing. The labels (``turn N``) are one more item on the first lane,
drawn unscaled at the lines' screen positions; the latest win where they would overlap.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from .lane_items import ViewSpan

MAX_LABELS = 40
LABEL_PAD = 4  # px between a line and its label


class LinesItem(ViewSpan):
    """Vertical lines at ``xs`` across the whole height of the view, in one ``drawLines``."""

    def __init__(self, pen):
        super().__init__()
        self.xs = np.zeros(0)
        self.set_pen(pen)

    def set_pen(self, pen) -> None:
        pen = QtGui.QPen(pg.mkPen(pen))
        self._width = max(1, int(round(pen.widthF())))  # drawn as that many 1-px lines side by side
        pen.setWidthF(1.0)
        pen.setCosmetic(True)
        self._pen = pen
        self.update()

    def set_xs(self, xs: np.ndarray) -> None:
        self.xs = xs
        self.update()

    def getData(self) -> tuple[np.ndarray, np.ndarray]:
        """x and y of each line's two ends, as a ``connect="pairs"`` curve would hold them."""
        vb = self.getViewBox()
        y0, y1 = vb.viewRange()[1] if vb is not None else (0.0, 1.0)
        return np.repeat(self.xs, 2), np.tile([y0, y1], len(self.xs))

    def paint(self, p, *args) -> None:
        if not len(self.xs):
            return
        r = self.boundingRect()
        i0 = int(np.searchsorted(self.xs, r.left(), side="left"))
        i1 = int(np.searchsorted(self.xs, r.right(), side="right"))
        if i1 <= i0:
            return
        t = p.transform()
        dev = t.mapRect(r)
        top, bottom = dev.top(), dev.bottom()
        xs = np.floor(self.xs[i0:i1] * t.m11() + t.dx()) + 0.5  # device pixel centres (no rotation in a view box)
        lines = [QtCore.QLineF(x + k, top, x + k, bottom) for x in xs for k in range(self._width)]
        p.save()
        p.resetTransform()  # in device pixels: the dash pattern is the same on every lane
        p.setPen(self._pen)
        p.drawLines(lines)
        p.restore()


class LabelsItem(ViewSpan):
    """``labels[i]`` just right of ``xs[i]`` at the top of the view, unscaled; overlapping ones hidden."""

    def __init__(self, color: str):
        super().__init__()
        self.xs = np.zeros(0)
        self.labels: list[str] = []
        self._color = pg.mkColor(color)
        self._font = QtGui.QFont()
        self._metrics = QtGui.QFontMetricsF(self._font)
        self._texts: dict[str, tuple[QtGui.QStaticText, float]] = {}

    def set_labels(self, xs: np.ndarray, labels: list[str]) -> None:
        self.xs, self.labels = xs, labels
        self.update()

    def set_color(self, color: str) -> None:
        self._color = pg.mkColor(color)
        self.update()

    def _text(self, s: str) -> tuple[QtGui.QStaticText, float]:
        if s not in self._texts:
            st = QtGui.QStaticText(s)
            st.setTextFormat(QtCore.Qt.TextFormat.PlainText)
            self._texts[s] = (st, self._metrics.horizontalAdvance(s))
        return self._texts[s]

    def arrange(self, x0: float, x1: float, width_px: float) -> list[tuple[str, float, bool]]:
        """(label, left edge in px, flipped) of the labels shown in a view of ``x0``…``x1``.

        Walk from the latest: a label is kept when it ends left of the last kept one; one that
        would pass the right edge is drawn to the left of its line instead.
        """
        scale = width_px / max(x1 - x0, 1e-9)
        free_from = math.inf
        out = []
        for x, s in reversed(list(zip(self.xs, self.labels))):
            px = (x - x0) * scale
            w = self._text(s)[1] + 2 * LABEL_PAD
            flip = px + w > width_px
            left, right = (px - w, px) if flip else (px, px + w)
            if right <= free_from - 2 and right > 0 and left < width_px:
                out.append((s, left + LABEL_PAD, flip))
                free_from = left
        return out[::-1]

    def paint(self, p, *args) -> None:
        if not self.labels:
            return
        r = self.boundingRect()
        dev = p.transform().mapRect(r)  # the view in device pixels (y may be flipped: take its top)
        if dev.width() <= 0:
            return
        p.save()
        p.resetTransform()
        p.setFont(self._font)
        p.setPen(self._color)
        for s, left, _flip in self.arrange(r.left(), r.right(), dev.width()):
            p.drawStaticText(QtCore.QPointF(dev.left() + left, dev.top() + 1), self._text(s)[0])
        p.restore()


class HLinesItem(ViewSpan):
    """Horizontal reference lines across the view, each labelled just above its left end.

    The tokens lane's window sizes. pyqtgraph's ``InfiniteLine`` with a label recomputes its
    bounds and re-places the label's text item on every view change: one such line was
    0.4–0.8 ms of a zoom's frame (docs/redraw.md). Lines and labels are drawn here in device
    pixels, as pyqtgraph drew them: the pen's dashes at its width, from the right edge; the
    text in the default font 2 % of the width in.
    """

    LABEL_AT = 0.02  # of the view's width
    TEXT_MARGIN = 4  # QGraphicsTextItem's document margin, kept so labels sit where they did

    def __init__(self):
        super().__init__()
        self._lines: list[tuple[float, float, QtGui.QPen, QtGui.QColor, QtGui.QStaticText, float]] = []
        self._font = QtGui.QFont()
        self._metrics = QtGui.QFontMetricsF(self._font)

    def set_lines(self, lines: list[tuple[float, str, str, float, QtCore.Qt.PenStyle]]) -> None:
        """``(y, colour, label, pen width, pen style)`` per line."""
        self._lines = []
        for y, color, label, width, style in lines:
            pen = QtGui.QPen(pg.mkColor(color))
            pen.setStyle(style)
            if style not in (QtCore.Qt.PenStyle.SolidLine, QtCore.Qt.PenStyle.NoPen):
                # One device pixel wide (a thin line takes Qt's fast path), dashes as long as at ``width``.
                pen.setDashPattern([v * width for v in pen.dashPattern()])
            pen.setWidthF(1.0)
            pen.setCosmetic(True)
            text = QtGui.QStaticText(label)
            text.setTextFormat(QtCore.Qt.TextFormat.PlainText)
            text.prepare(QtGui.QTransform(), self._font)
            self._lines.append((float(y), float(width), pen, pg.mkColor(color), text, self._metrics.height()))
        self.update()

    def labels(self) -> list[str]:
        return [t.text() for *_, t, _ in self._lines]

    def paint(self, p, *args) -> None:
        if not self._lines:
            return
        t = p.transform()
        dev = t.mapRect(self.boundingRect())
        p.save()
        p.resetTransform()
        p.setFont(self._font)
        for y, width, pen, color, text, text_h in self._lines:
            py = t.map(QtCore.QPointF(0.0, y)).y()
            if not dev.top() - 1 <= py <= dev.bottom() + 1:
                continue
            p.setPen(pen)
            # The rows a ``width``-px band around the line covers (pixel centres inside it), as
            # Qt fills a wide line without antialiasing: one or two 1-px lines.
            for k in range(math.ceil(py - width / 2 - 0.5), math.floor(py + width / 2 - 0.5) + 1):
                p.drawLine(QtCore.QPointF(dev.right(), k + 0.5), QtCore.QPointF(dev.left(), k + 0.5))
            p.setPen(color)
            x = dev.left() + self.LABEL_AT * dev.width() + self.TEXT_MARGIN
            p.drawStaticText(QtCore.QPointF(x, py - self.TEXT_MARGIN - text_h), text)
        p.restore()


class VLines:
    """``place(xs, labels)`` draws a vertical line at each x on every lane."""

    def __init__(self, lanes: list[pg.PlotItem], pen, label_color: str | None = None):
        self.lanes = lanes
        self.xs = np.zeros(0)
        self.curves = []  # one LinesItem per lane
        for plot in lanes:
            item = LinesItem(pen)
            item.setZValue(20)
            plot.addItem(item, ignoreBounds=True)
            self.curves.append(item)
        self.label_color = label_color
        self.labels_item: LabelsItem | None = None
        if label_color:
            self.labels_item = LabelsItem(label_color)
            self.labels_item.setZValue(21)
            lanes[0].addItem(self.labels_item, ignoreBounds=True)

    def place(self, positions: list[float], labels: list[str] | None = None) -> None:
        order = np.argsort(np.asarray(positions, dtype=np.float64), kind="stable")
        self.xs = np.asarray(positions, dtype=np.float64)[order]
        for item in self.curves:
            item.set_xs(self.xs)
        if self.labels_item is not None:
            names = [labels[i] for i in order] if labels else []
            shown = list(zip(self.xs, names))[-MAX_LABELS:]
            self.labels_item.set_labels(np.asarray([x for x, _ in shown]), [s for _, s in shown])

    def positions(self) -> list[float]:
        return [float(x) for x in self.xs]

    def shown_labels(self) -> list[str]:
        """The labels drawn in the current view (the others would overlap a later one)."""
        if self.labels_item is None:
            return []
        vb = self.lanes[0].getViewBox()
        (x0, x1), _ = vb.viewRange()
        return [s for s, _, _ in self.labels_item.arrange(x0, x1, max(vb.width(), 1.0))]

    def restyle(self, pen, label_color: str | None = None) -> None:
        for item in self.curves:
            item.set_pen(pen)
        if label_color:
            self.label_color = label_color
            if self.labels_item is not None:
                self.labels_item.set_color(label_color)
