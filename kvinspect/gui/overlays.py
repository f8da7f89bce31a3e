"""Vertical marker lines across every lane (turn boundaries, recreated caches) as one item per lane.

One ``InfiniteLine`` per turn per lane looked simple but cost ~0.1 ms each on every zoom or
pan (pyqtgraph recomputes each line's bounds): 100 of them were 12 ms of a redraw. One
``connect="pairs"`` curve per lane draws any number of lines in one paint (qt-and-ci.md §8);
its segments span the lane's current y-range, refreshed when that range changes. Labels
(``turn N``) are text items on the first lane only, for the most recent lines.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtGui

MAX_LABELS = 40


class VLines:
    """``place(xs, labels)`` draws a vertical line at each x on every lane."""

    def __init__(self, lanes: list[pg.PlotItem], pen, label_color: str | None = None):
        self.lanes = lanes
        self.xs = np.zeros(0)
        self.curves = []
        for plot in lanes:
            curve = pg.PlotCurveItem(pen=pen, connect="pairs")
            curve.setZValue(20)
            plot.addItem(curve, ignoreBounds=True)
            plot.getViewBox().sigYRangeChanged.connect(lambda *_, c=curve, p=plot: self._draw(c, p))
            self.curves.append(curve)
        self.label_color = label_color
        self.labels: list[pg.TextItem] = []
        self._used = 0  # labels in use; some may be hidden to keep the others readable
        vb = lanes[0].getViewBox()
        vb.sigXRangeChanged.connect(lambda *_: self._declutter())
        vb.sigResized.connect(lambda *_: self._declutter())

    def place(self, positions: list[float], labels: list[str] | None = None) -> None:
        self.xs = np.asarray(positions, dtype=np.float64)
        for curve, plot in zip(self.curves, self.lanes):
            self._draw(curve, plot)
        self._place_labels(labels or [])

    def _draw(self, curve, plot) -> None:
        if not len(self.xs):
            curve.setData([], [])
            return
        y0, y1 = plot.getViewBox().viewRange()[1]
        curve.setData(np.repeat(self.xs, 2), np.tile([y0, y1], len(self.xs)), connect="pairs")

    def _place_labels(self, labels: list[str]) -> None:
        if not self.label_color:
            return
        shown = list(zip(self.xs, labels))[-MAX_LABELS:]
        plot = self.lanes[0]
        while len(self.labels) < len(shown):
            item = pg.TextItem(color=self.label_color, anchor=(0, 0))
            plot.addItem(item, ignoreBounds=True)
            self.labels.append(item)
        y_top = plot.getViewBox().viewRange()[1][1]
        for item, (x, text) in zip(self.labels, shown):
            item.setText(text)
            item.setPos(x, y_top)
            item.setVisible(True)
        for item in self.labels[len(shown):]:
            item.setVisible(False)
        self._used = len(shown)
        self._declutter()

    def _declutter(self) -> None:
        """Hide labels that would overlap a later one (the latest turns win); flip the last inwards.

        Zoomed out over many short turns, "turn 9turn 10turn 11" was unreadable; and a label at
        the right edge was cut off.
        """
        if not self._used:
            return
        vb = self.lanes[0].getViewBox()
        (x0, x1), _ = vb.viewRange()
        width_px = max(vb.width(), 1.0)
        scale = width_px / max(x1 - x0, 1e-9)
        free_from = math.inf  # left end of the label kept just to the right
        for item in reversed(self.labels[: self._used]):
            px = (item.pos().x() - x0) * scale
            w = QtGui.QFontMetricsF(item.textItem.font()).horizontalAdvance(item.toPlainText()) + 8
            flip = px + w > width_px
            item.setAnchor((1, 0) if flip else (0, 0))
            left, right = (px - w, px) if flip else (px, px + w)
            keep = right <= free_from - 2 and right > 0 and left < width_px
            item.setVisible(keep)
            if keep:
                free_from = left

    def positions(self) -> list[float]:
        return [float(x) for x in self.xs]

    def restyle(self, pen, label_color: str | None = None) -> None:
        for curve in self.curves:
            curve.setPen(pen)
        if label_color:
            self.label_color = label_color
            for item in self.labels:
                item.setColor(label_color)
