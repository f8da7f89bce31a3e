"""The lanes' vertical marker lines (turn boundaries, recreated caches) and their labels.

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

from kvinspect.gui.graphics.view_span import ViewSpan

MAX_LABELS = 40
LABEL_PAD = 4  # px between a line and its label


class LinesItem(ViewSpan):
    """Vertical lines at ``xs`` across the whole height of the view, each a blit of one column.

    The pen's line is drawn once into a column image at the view's sub-pixel top and bottom
    (``_column``), and every line in view is that column blitted at its device pixel: the same
    pixels as drawing each line, whose dashes cost Qt's cosmetic stroker per pixel.
    """

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
        self._column_key: tuple | None = None
        self._column_pixmap: QtGui.QPixmap | None = None
        self.update()

    def _column(self, top: float, bottom: float) -> tuple[QtGui.QPixmap, int]:
        """The line from device ``top`` to ``bottom``, ``_width`` 1-px lines side by side, and the
        device row its image starts at (a pixel above the line: whole-pixel shifts keep the pixels)."""
        y0 = math.floor(top) - 1
        key = (top - y0, bottom - y0)
        if key != self._column_key:
            img = QtGui.QImage(self._width, math.ceil(bottom) + 2 - y0, QtGui.QImage.Format.Format_ARGB32_Premultiplied)
            img.fill(QtCore.Qt.GlobalColor.transparent)
            q = QtGui.QPainter(img)
            q.setPen(self._pen)
            q.drawLines([QtCore.QLineF(k + 0.5, key[0], k + 0.5, key[1]) for k in range(self._width)])
            q.end()
            self._column_key, self._column_pixmap = key, QtGui.QPixmap.fromImage(img)
        return self._column_pixmap, y0

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
        column, y0 = self._column(dev.top(), dev.bottom())
        xs = np.floor(self.xs[i0:i1] * t.m11() + t.dx())  # device pixels (no rotation in a view box)
        p.save()
        p.resetTransform()  # in device pixels: the dash pattern is the same on every lane
        for x in xs.astype(np.int64).tolist():
            p.drawPixmap(x, y0, column)
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
