"""The base of the lean lane items: a view-spanning item, its pixel size, what it drew per zoom
(``ZoomMemo``), and text cached as pixmaps. See :mod:`kvinspect.gui.graphics.curve` for why these items exist."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

QUANTUM = 4  # sub-pixel steps per pixel below which a change is not drawn
ZOOM_MEMO = 4  # views (zoom levels) an item keeps what it drew for (ZoomMemo)

CACHE = QtWidgets.QGraphicsItem.CacheMode.DeviceCoordinateCache


def pixel_size(item: pg.GraphicsObject) -> tuple[float, float] | None:
    """Data units per device pixel in x and y of the item's view box (None before it has a size).

    From the view range and the box's size: ``ViewBox.viewPixelSize`` maps points through a
    transform that every range change invalidates, 60 µs a call.
    """
    vb = item.getViewBox()
    if vb is None or not hasattr(vb, "viewRange"):
        return None
    (x0, x1), (y0, y1) = vb.viewRange()
    w, h = vb.width(), vb.height()
    if w <= 0 or h <= 0:
        return None
    pw, ph = (x1 - x0) / w, (y1 - y0) / h
    return (pw, ph) if pw > 0 and ph > 0 and math.isfinite(pw) and math.isfinite(ph) else None


class ViewSpan(pg.GraphicsObject):
    """An item whose extent is its view box's visible rect, redrawn when the view moves (grid, marker lines)."""

    def __init__(self):
        super().__init__()
        self.setCacheMode(CACHE)

    def boundingRect(self) -> QtCore.QRectF:
        vb = self.getViewBox()
        return vb.viewRect() if vb is not None else QtCore.QRectF()

    def viewRangeChanged(self) -> None:
        self.prepareGeometryChange()
        self.update()


class GrowingItem(pg.GraphicsObject):
    """An item drawn from data that grow at their right end (the heatmap, the curves): a live frame
    repaints only the strip that changed.

    Its bounding rect is its data's united with its view box's visible rect, so it stays the same
    while a run grows inside the view: a frame then asks Qt for the strip right of the first changed
    point (:meth:`show_changed`), and Qt repaints that strip of the view (the pixmap cache and the
    screen), not every item under the whole lane. A new bounding rect (the data left the view, a
    zoom) repaints the item whole, as any item's change does.
    """

    def __init__(self):
        super().__init__()
        self._data_rect = QtCore.QRectF()
        self._paint_rect = QtCore.QRectF()

    def _painted_rect(self) -> QtCore.QRectF:
        if self._data_rect.isEmpty():
            return QtCore.QRectF()
        vb = self.getViewBox()
        view = vb.viewRect() if vb is not None and hasattr(vb, "viewRect") else QtCore.QRectF()
        return self._data_rect.united(view) if view.isValid() else QtCore.QRectF(self._data_rect)

    def show_changed(self, data_rect: QtCore.QRectF, changed_from: float | None = None) -> None:
        """The data now span ``data_rect``; what lies left of x = ``changed_from`` did not change (None:
        everything may have)."""
        right = max(self._data_rect.right(), data_rect.right()) if not self._data_rect.isEmpty() else data_rect.right()
        self._data_rect = QtCore.QRectF(data_rect)
        painted = self._painted_rect()
        if painted != self._paint_rect:
            self.prepareGeometryChange()
            self._paint_rect = painted
            self.update()
        elif changed_from is None or not painted.isValid():
            self.update()
        elif changed_from < right:
            # (to the old or new right end, whichever is further: what lies beyond was and stays empty)
            x, right = max(changed_from, painted.left()), min(right, painted.right())
            self.update(QtCore.QRectF(x, painted.top(), right - x, painted.height()))

    def viewRangeChanged(self) -> None:
        painted = self._painted_rect()
        if painted != self._paint_rect:
            self.prepareGeometryChange()
            self._paint_rect = painted

    def boundingRect(self) -> QtCore.QRectF:
        return QtCore.QRectF(self._paint_rect)


class ZoomMemo:
    """What an item drew for its last ``ZOOM_MEMO`` views, least recently used dropped first.

    A zoom and a Fit, or a view alternating between two ranges, then find what was drawn
    (paths, colours, ticks) instead of making it again; the caller checks the data still match.
    """

    __slots__ = ("_d",)

    def __init__(self):
        self._d: dict = {}

    def get(self, key):
        value = self._d.pop(key, None)
        if value is not None:
            self._d[key] = value
        return value

    def put(self, key, value) -> None:
        if not ZOOM_MEMO:
            return
        self._d.pop(key, None)
        while len(self._d) >= ZOOM_MEMO:
            self._d.pop(next(iter(self._d)))
        self._d[key] = value

    def clear(self) -> None:
        self._d.clear()


def cache_text(root: QtWidgets.QGraphicsItem | QtWidgets.QGraphicsScene) -> None:
    """Cache every text-like item under ``root`` as a pixmap: text is the slowest thing to paint
    in software, and legend labels, axis titles and turn labels change rarely."""
    items = root.items() if isinstance(root, QtWidgets.QGraphicsScene) else root.childItems()
    for item in items:
        if isinstance(item, (QtWidgets.QGraphicsTextItem, pg.LabelItem,
                             pg.graphicsItems.LegendItem.ItemSample)) and item.cacheMode() != CACHE:
            item.setCacheMode(CACHE)
