"""The layers × steps heatmap item: stored lengths mapped to 256 colours, a new image only when a cell's colour changed."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from kvinspect.gui.graphics.view_span import CACHE, ZOOM_MEMO, ZoomMemo


class Heatmap(pg.GraphicsObject):
    """Columns × rows of values drawn through a 256-colour lookup table into ``rect`` (data units).

    ``image`` is the last window given (x = columns, y = rows, as pyqtgraph's column-major images).
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
        self._memo = ZoomMemo()  # (rect, scale, shape) → (values, idx, buf, image)
        self.setCacheMode(CACHE)

    def clear(self) -> None:
        self.prepareGeometryChange()
        self._memo.clear()
        self.image = self._idx = self._qimage = self._buf = None
        self._rect = QtCore.QRectF()
        self.update()

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
        k = min(same_prefix, len(values), len(old)) if old is not None and scale == self._scale else 0
        memo_key = (rect.getRect(), scale, values.shape)
        if not k:
            hit = self._memo.get(memo_key)
            if hit is not None and np.array_equal(hit[0], values):
                if hit[1] is old and rect == self._rect:
                    return False
                self._scale = scale
                self._show(rect, *hit[1:])
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
        buf = np.ascontiguousarray(idx.T)
        h, w = buf.shape
        indexed = QtGui.QImage(buf.data, w, h, w, QtGui.QImage.Format.Format_Indexed8)
        indexed.setColorTable(self._colors)
        self._show(rect, idx, buf, indexed.convertToFormat(QtGui.QImage.Format.Format_RGB32))
        if ZOOM_MEMO and not k:  # (a live frame's columns are new: nothing to keep)
            self._memo.put(memo_key, (np.array(values), idx, buf, self._qimage))
        return True

    def _show(self, rect: QtCore.QRectF, idx: np.ndarray, buf: np.ndarray, image: QtGui.QImage) -> None:
        if rect != self._rect:
            self.prepareGeometryChange()
            self._rect = QtCore.QRectF(rect)
        self._idx, self._buf, self._qimage = idx, buf, image
        self.update()

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange=None):
        if self._rect.isEmpty():
            return (None, None)
        r = self._rect
        return (r.left(), r.right()) if ax == 0 else (r.top(), r.bottom())

    def boundingRect(self) -> QtCore.QRectF:
        return QtCore.QRectF(self._rect)

    def paint(self, p, *args) -> None:
        if self._qimage is not None:
            p.drawImage(self._rect, self._qimage)
