"""Overlays of the lanes: vertical marker lines (turn boundaries, recreated caches), their labels,
the window lines and the event markers.

One ``InfiniteLine`` per turn per lane cost ~0.1 ms each on every zoom or pan (pyqtgraph
recomputes each line's bounds): 100 of them were 12 ms of a redraw. Here each lane has one
item that draws every line in view in one call, from the top of its view to the bottom, so a
y-range change moves nothing. The labels (``turn N``) are one more item on the first lane,
drawn unscaled at the lines' screen positions; the latest win where they would overlap.

The event markers (``MarkersItem``) were a ``ScatterPlotItem``: on every zoom or pan it
recomputed its bounds and, to paint six points, masked, stacked and mapped them with a dozen
numpy calls. Here each spot is a symbol rendered once by pyqtgraph (the same pixels) and
blitted at its device position.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from .lane_items import ViewSpan

_renderSymbol = pg.graphicsItems.ScatterPlotItem.renderSymbol

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


class MarkerPoint:
    """One spot of a ``MarkersItem``, as pyqtgraph's ``SpotItem`` shows it: ``pos()``, ``data()``, ``index()``."""

    __slots__ = ("_item", "_i")

    def __init__(self, item: MarkersItem, i: int):
        self._item, self._i = item, i

    def pos(self) -> QtCore.QPointF:
        return QtCore.QPointF(float(self._item._x[self._i]), float(self._item._y[self._i]))

    def data(self):
        return self._item._data[self._i]

    def index(self) -> int:
        return self._i


class MarkersItem(ViewSpan):
    """Symbols at fixed pixel sizes at data positions: ``ScatterPlotItem``'s spots, tooltips and clicks.

    ``setData`` takes its spot dicts (``pos``, ``symbol``, ``size``, ``pen``, ``brush``, ``data``);
    each style is rendered once by pyqtgraph's ``renderSymbol`` and drawn where the atlas would
    draw it, centred on the spot's device position. Hovering a spot draws it at ``hover_size``
    and sets the view box's tooltip to ``tip(x=, y=, data=)`` of the spots under the mouse (at
    most three, the topmost first); a left click on spots emits ``sigClicked(item, points, ev)``.
    """

    sigClicked = QtCore.Signal(object, object, object)

    def __init__(self, tip=None, hover_size: float | None = None):
        super().__init__()
        self._tip, self._hover_size = tip, hover_size
        self._x = self._y = np.zeros(0)
        self._data: list = []
        self._styles: list[tuple] = []
        self._hovered: frozenset[int] = frozenset()
        self._keys: list[tuple] = []
        self._sprites: dict[tuple, tuple[QtGui.QPixmap, float, float]] = {}  # by style, size and dpr
        self._tip_cleared = True

    def setData(self, spots: list[dict]) -> None:
        self._x = np.array([s["pos"][0] for s in spots], dtype=np.float64)
        self._y = np.array([s["pos"][1] for s in spots], dtype=np.float64)
        self._data = [s.get("data") for s in spots]
        self._styles = [(s["symbol"], float(s["size"]), pg.mkPen(s["pen"]), pg.mkBrush(s["brush"])) for s in spots]
        self._keys = [(sym, pen.color().rgba(), pen.widthF(), pen.style().value, brush.color().rgba())
                      for sym, _size, pen, brush in self._styles]
        self._hovered = frozenset()
        self.update()

    def clear(self) -> None:
        self.setData([])

    def points(self) -> list[MarkerPoint]:
        return [MarkerPoint(self, i) for i in range(len(self._data))]

    def _sprite(self, i: int, dpr: float) -> tuple[QtGui.QPixmap, float, float]:
        """The spot's pixmap and its size in device-independent pixels (hovered: at ``hover_size``)."""
        symbol, size, pen, brush = self._styles[i]
        if i in self._hovered and self._hover_size is not None:
            size = float(self._hover_size)
        key = (self._keys[i], size, dpr)
        if key not in self._sprites:
            img = _renderSymbol(symbol, size, pen, brush, dpr=dpr)
            self._sprites[key] = (QtGui.QPixmap.fromImage(img), img.width() / dpr, img.height() / dpr)
        return self._sprites[key]

    def _device_xy(self, t: QtGui.QTransform) -> tuple[np.ndarray, np.ndarray]:
        # (a view box maps without rotation: pyqtgraph's transformCoordinates gives these numbers)
        return self._x * t.m11() + self._y * t.m21() + t.dx(), self._x * t.m12() + self._y * t.m22() + t.dy()

    def paint(self, p, opt=None, widget=None) -> None:
        if not self._data:
            return
        t = p.transform()
        view = t.mapRect(self.boundingRect())
        dpr = widget.devicePixelRatioF() if widget is not None else 1.0
        xs, ys = self._device_xy(t)
        p.save()
        p.resetTransform()
        for i, (x, y) in enumerate(zip(xs.tolist(), ys.tolist())):
            pm, w, h = self._sprite(i, dpr)
            if view.left() - w / 2 <= x <= view.right() + w / 2 and view.top() - h / 2 <= y <= view.bottom() + h / 2:
                p.drawPixmap(QtCore.QRectF(x - 0.5 * w, y - 0.5 * h, w, h), pm, QtCore.QRectF(pm.rect()))
        p.restore()

    def pointsAt(self, pos: QtCore.QPointF) -> list[MarkerPoint]:
        """The spots whose symbol's square covers ``pos`` (item coordinates), the topmost first."""
        if not self._data:
            return []
        t = self.deviceTransform_()
        if t is None:
            return []
        at = t.map(pos)
        xs, ys = self._device_xy(t)
        out = []
        for i in range(len(self._data) - 1, -1, -1):
            _pm, w, h = self._sprite(i, 1.0)
            if abs(xs[i] - at.x()) <= w / 2 and abs(ys[i] - at.y()) <= h / 2:
                out.append(MarkerPoint(self, i))
        return out

    def mouseClickEvent(self, ev) -> None:
        pts = self.pointsAt(ev.pos()) if ev.button() == QtCore.Qt.MouseButton.LeftButton else []
        if not pts:
            ev.ignore()
            return
        ev.accept()
        self.sigClicked.emit(self, pts, ev)

    def hoverEvent(self, ev) -> None:
        pts = [] if ev.exit else self.pointsAt(ev.pos())
        hovered = frozenset(pt.index() for pt in pts)
        if hovered != self._hovered:
            self._hovered = hovered
            self.update()
        vb = self.getViewBox()
        if vb is None or self._tip is None:
            return
        if pts:
            tips = [self._tip(x=pt.pos().x(), y=pt.pos().y(), data=pt.data()) for pt in pts[:3]]
            if len(pts) > 3:
                tips.append(f"({len(pts) - 3} others...)")
            vb.setToolTip("\n\n".join(tips))
            self._tip_cleared = False
        elif not self._tip_cleared:
            vb.setToolTip("")
            self._tip_cleared = True
