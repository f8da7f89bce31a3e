"""Vertical marker lines across every lane (turn boundaries, recreated caches) as one item per lane.

One ``InfiniteLine`` per turn per lane looked simple but cost ~0.1 ms each on every zoom or
pan (pyqtgraph recomputes each line's bounds): 100 of them were 12 ms of a redraw. One
``connect="pairs"`` curve per lane draws any number of lines in one paint (qt-and-ci.md §8);
its segments span the lane's current y-range, refreshed when that range changes. Labels
(``turn N``) are text items on the first lane only, for the most recent lines.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg

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

    def positions(self) -> list[float]:
        return [float(x) for x in self.xs]

    def restyle(self, pen, label_color: str | None = None) -> None:
        for curve in self.curves:
            curve.setPen(pen)
        if label_color:
            self.label_color = label_color
            for item in self.labels:
                item.setColor(label_color)
