"""Horizontal grid lines at a lane's left-axis ticks, drawn in its view box as one item."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from kvinspect.gui.graphics.view_span import ViewSpan, ZoomMemo


class HGrid(ViewSpan):
    """Horizontal grid lines at the ticks of ``plot``'s left axis, drawn in its view box.

    pyqtgraph's own grid is part of the axis: the axis' cached picture then spans the whole
    plot, and every range change re-rasterises it with the tick labels (measured: 7 of the
    19 ms a zoom costs). A few cosmetic lines painted here cost next to nothing and need no cache.
    """

    def __init__(self, plot: pg.PlotItem, color: str = "#FFFFFF", alpha: float = 0.15, background: str | None = None):
        super().__init__()
        self.axis = plot.getAxis("left")
        # Without a grid an axis no longer spans the plot, and pyqtgraph would let a vertical
        # axis' edge labels spill 15 px into the next lane: keep them inside, as before.
        for name in ("left", "right"):
            plot.getAxis(name).setStyle(hideOverlappingLabels=True)
        plot.getViewBox().addItem(self, ignoreBounds=True)
        self.setZValue(-100)  # under every curve
        self.set_color(color, alpha, background)

    def set_color(self, color: str, alpha: float, background: str | None = None) -> None:
        """Lines of ``color`` at ``alpha``; over ``background`` they are drawn as the opaque colour
        the blend gives (the grid lies under everything else): translucent lines take Qt's slow
        blending path, 0.39 ms against 0.07 ms for eight lines across a lane."""
        self._pens = []
        for a in (alpha, alpha / 2):
            c = pg.mkColor(color)
            if background is None:
                c.setAlphaF(a)
            else:
                bg = pg.mkColor(background)
                c = QtGui.QColor(*(round(bg_v + (fg_v - bg_v) * a) for fg_v, bg_v in
                                   ((c.red(), bg.red()), (c.green(), bg.green()), (c.blue(), bg.blue()))))
            self._pens.append(pg.mkPen(c, width=1, cosmetic=True))
        self._lines_memo = ZoomMemo()
        self.update()

    def _lines(self, rect: QtCore.QRectF, height: float) -> list[list[QtCore.QLineF]]:
        """The grid lines of each tick level, computed again only for a view not seen lately."""
        key = (rect.left(), rect.right(), rect.top(), rect.bottom(), height)
        lines = self._lines_memo.get(key)
        if lines is None:
            lo, hi = rect.top(), rect.bottom()
            levels = self.axis.tickValues(min(lo, hi), max(lo, hi), max(height, 1.0))
            lines = [[QtCore.QLineF(rect.left(), y, rect.right(), y) for y in values]
                     for _spacing, values in levels[: len(self._pens)]]
            self._lines_memo.put(key, lines)
        return lines

    def paint(self, p, *args) -> None:
        vb = self.getViewBox()
        if vb is None:
            return
        for pen, lines in zip(self._pens, self._lines(vb.viewRect(), vb.height())):
            p.setPen(pen)
            p.drawLines(lines)
