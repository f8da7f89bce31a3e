"""The heatmap's colour scale (viridis) as a small pixmap for the lanes' header."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6 import QtGui


def gradient_pixmap(w: int, h: int) -> QtGui.QPixmap:
    lut = pg.colormap.get("viridis").getLookupTable(nPts=w)
    img = QtGui.QImage(w, h, QtGui.QImage.Format.Format_RGB32)
    for x in range(w):
        c = QtGui.QColor(int(lut[x][0]), int(lut[x][1]), int(lut[x][2])).rgb()
        for y in range(h):
            img.setPixel(x, y, c)
    return QtGui.QPixmap.fromImage(img)
