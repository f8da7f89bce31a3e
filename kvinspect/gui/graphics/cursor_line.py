"""The vertical cursor line of the lanes (the step under the mouse or the replay)."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets


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
