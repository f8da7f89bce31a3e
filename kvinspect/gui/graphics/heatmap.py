"""The layers × steps heatmap item: stored lengths mapped to 256 colours, a new image only when a cell's colour changed."""

from __future__ import annotations

import math

import numpy as np
from PySide6 import QtCore, QtGui

from kvinspect.gui.graphics.view_span import CACHE, ZOOM_MEMO, GrowingItem, ZoomMemo, pixel_size


class Heatmap(GrowingItem):
    """Columns × rows of values drawn through a 256-colour lookup table into ``rect`` (data units).

    ``image`` is the last window given (x = columns, y = rows, as pyqtgraph's column-major images).
    A live frame maps and repaints only the columns from the first changed one (``same_prefix``).
    """

    def __init__(self, lut: np.ndarray):
        super().__init__()
        lut = np.asarray(lut)
        self._lut = (0xFF000000 | (lut[:, 0].astype(np.uint32) << 16) | (lut[:, 1].astype(np.uint32) << 8)
                     | lut[:, 2].astype(np.uint32)).astype(np.uint32)
        self._colors = self._lut.tolist()  # (the colour table of an indexed QImage)
        self.image: np.ndarray | None = None
        self._rect = QtCore.QRectF()
        self._idx: np.ndarray | None = None
        self._qimage: QtGui.QImage | None = None
        self._buf: np.ndarray | None = None
        self._scale = 0.0
        self._pixels: tuple[float, float, int] | None = None
        self._draw = QtCore.QRectF()
        self._memo = ZoomMemo()  # (rect, scale, shape) → (values, idx, buf, image)
        self.setCacheMode(CACHE)

    def clear(self) -> None:
        self._memo.clear()
        self.image = self._idx = self._qimage = self._buf = self._pixels = None
        self._rect = QtCore.QRectF()
        self._draw = QtCore.QRectF()
        self.show_changed(self._rect)

    def invalidate(self) -> None:
        self._idx = None

    def set_window(self, values: np.ndarray, top: float, rect: QtCore.QRectF, same_prefix: int = 0) -> bool:
        """Show ``values`` scaled 0…``top``; True when a cell's colour or the rect changed.

        ``same_prefix``: the caller knows the first columns equal the previous call's (an
        append-only record seen at the same zoom), so only the rest is mapped again.
        """
        self.image = values
        scale = 256.0 / max(float(top), 1e-9)
        old = self._idx
        pixels = self._device_pixels(rect, len(values))
        if (pixels and pixels[:2]) != (self._pixels and self._pixels[:2]):
            old = None  # another pixel grid: every column is drawn again (more pixels of one grid are a live frame's)
        k = min(same_prefix, len(values), len(old)) if old is not None and scale == self._scale else 0
        memo_key = (rect.getRect(), scale, values.shape, pixels)
        if not k:
            hit = self._memo.get(memo_key)
            if hit is not None and np.array_equal(hit[0], values):
                if hit[1] is old and rect == self._rect:
                    return False
                self._scale = scale
                self._show(rect, pixels, *hit[1:])
                return True
        tail = values[k:] * scale
        tail = np.clip(tail, 0, 255, out=tail).astype(np.uint8)  # (in place: 8 bytes a cell fewer)
        if k:
            if rect == self._rect and len(values) == len(old) and np.array_equal(tail, old[k:]):
                return False
            idx = np.concatenate([old[:k], tail])
        else:
            idx = tail
            if old is not None and rect == self._rect and idx.shape == old.shape and np.array_equal(idx, old):
                self._scale = scale
                return False
        self._scale = scale
        # Rows = layers, as QImage wants them. Qt maps an indexed image to RGB32 in fewer
        # instructions than numpy's take() (which first casts every index to intp).
        buf = np.ascontiguousarray(idx.T if pixels is None else idx.T[:, self._columns(pixels, rect, len(values))])
        h, w = buf.shape
        indexed = QtGui.QImage(buf.data, w, h, w, QtGui.QImage.Format.Format_Indexed8)
        indexed.setColorTable(self._colors)
        # Columns left of k kept their colours and places (a column's x is x0 + i · stride, whatever the width).
        changed_from = rect.left() + k * rect.width() / len(values) if k else None
        self._show(rect, pixels, idx, buf, indexed.convertToFormat(QtGui.QImage.Format.Format_RGB32), changed_from)
        if ZOOM_MEMO and not k:  # (a live frame's columns are new: nothing to keep)
            self._memo.put(memo_key, (np.array(values), idx, buf, self._qimage))
        return True

    def _device_pixels(self, rect: QtCore.QRectF, n: int) -> tuple[float, float, int] | None:
        """Where the image's device pixels lie: (left, width of a pixel, count), in data units.

        The image is drawn one column per device pixel from a pixel edge, each pixel the colour of
        the column under its centre: Qt then copies pixels instead of scaling columns (a scale
        steps through columns in fixed point, so a strip drawn alone could pick a boundary pixel's
        neighbour). None (no size yet, or a rect far wider than the view): one image column per column.
        """
        px = pixel_size(self)
        vb = self.getViewBox()
        if px is None or vb is None or n == 0:
            return None
        left = vb.mapViewToDevice(QtCore.QPointF(rect.left(), rect.top()))
        if left is None:
            return None
        edge = vb.mapDeviceToView(QtCore.QPointF(math.floor(left.x()), left.y()))
        count = int(math.ceil((rect.right() - edge.x()) / px[0]))
        return (round(edge.x(), 9), px[0], count) if 0 < count <= 8 * max(vb.width(), 1) else None

    @staticmethod
    def _columns(pixels: tuple[float, float, int], rect: QtCore.QRectF, n: int) -> np.ndarray:
        left, pw, count = pixels
        centres = left + (np.arange(count) + 0.5) * pw
        return np.clip(((centres - rect.left()) * (n / rect.width())).astype(np.intp), 0, n - 1)

    def _show(self, rect: QtCore.QRectF, pixels, idx: np.ndarray, buf: np.ndarray, image: QtGui.QImage,
              changed_from: float | None = None) -> None:
        self._rect = QtCore.QRectF(rect)
        self._pixels = pixels
        self._draw = rect if pixels is None else QtCore.QRectF(pixels[0], rect.top(), pixels[1] * pixels[2], rect.height())
        self._idx, self._buf, self._qimage = idx, buf, image
        self.show_changed(self._rect, changed_from)

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange=None):
        if self._rect.isEmpty():
            return (None, None)
        r = self._rect
        return (r.left(), r.right()) if ax == 0 else (r.top(), r.bottom())

    def paint(self, p, *args) -> None:
        img = self._qimage
        if img is None:
            return
        # Image pixel j at left + j · width by one transform, whatever the image's width: drawn into the
        # rect (a scale of width / pixels) a pixel's place could differ in the last bit from one frame to
        # the next, and a live frame repaints only its new strip.
        r = self._draw
        p.save()
        p.translate(r.left(), r.top())
        p.scale(r.width() / img.width(), r.height() / img.height())
        p.drawImage(QtCore.QPointF(0, 0), img)
        p.restore()
