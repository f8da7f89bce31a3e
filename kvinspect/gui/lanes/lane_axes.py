"""The axes every lane shares: fixed widths so that steps line up, values only on the last lane."""

from __future__ import annotations

import pyqtgraph as pg

AXIS_W = 72  # every lane's left and right axes have the same width, so their steps line up


def fixed_axes(plot: pg.PlotItem, bottom_values: bool = False) -> None:
    """Same-width left/right axes on every lane (x stays aligned); step values only on the last lane."""
    plot.getAxis("left").setWidth(AXIS_W)
    plot.getAxis("top").unlinkFromView()  # never shown: following the view would only re-set its label
    plot.showAxis("right")
    right = plot.getAxis("right")
    right.setWidth(AXIS_W)
    if not right.labelText:
        right.setStyle(showValues=False, tickLength=0)
        # Only a spacer with an edge line: following the view would regenerate it on every zoom.
        right.unlinkFromView()
    if bottom_values:
        plot.getAxis("bottom").setStyle(showValues=True)
    else:
        plot.hideAxis("bottom")  # x is shared; only the last lane shows steps
        plot.getAxis("bottom").unlinkFromView()  # hidden: following the view only re-sets its label
