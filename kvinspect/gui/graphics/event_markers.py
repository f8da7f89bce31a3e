"""The event markers of the lanes: each spot a symbol rendered once by pyqtgraph and blitted at
its device position (a ``ScatterPlotItem`` recomputed its bounds on every zoom or pan)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from kvinspect.gui.graphics.view_span import ViewSpan

_renderSymbol = pg.graphicsItems.ScatterPlotItem.renderSymbol


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
