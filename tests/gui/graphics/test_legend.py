"""The lanes' legends (gui/graphics/legend.py): pyqtgraph's grid and entries, drawn by one item."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6 import QtCore, QtGui

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from redraw import synthetic_record  # noqa: E402

KINDS = ["sliding", "full", "state", "shared", "indexed", "chunked", "sliding", "full"]


def _record_with_kinds(kinds: list[str], steps: int = 400):
    rec = synthetic_record(steps, len(kinds), turns=2)
    for i, k in enumerate(kinds):  # the kinds a hybrid model's config gives, as the header holds them
        rec.header["layers"][i]["config_attention"] = k
    return rec


@pytest.fixture(scope="module")
def plots(qapp):
    from kvinspect.gui.base import theme as th
    from kvinspect.gui.lanes.lanes_widget import PlotsWidget

    w = PlotsWidget()
    w.resize(1000, 600)
    w.apply_theme(th.DARK)
    w.show()
    qapp.processEvents()
    w.render(_record_with_kinds(KINDS), force=True)
    qapp.processEvents()
    yield w
    w.close()


def _pixel(w, legend, point: QtCore.QPointF) -> QtGui.QColor:
    """The window's colour at ``point`` (legend coordinates)."""
    view = w.view
    at = view.mapFromScene(legend.mapToScene(point))
    return view.grab().toImage().pixelColor(at)


def test_entries_per_kind_in_lane_order(plots):
    # First layer of each kind (shared ones read another layer: not picked), after the means.
    assert plots.tokens.legend.names() == ["seen", "stored (mean)", "L0 sliding", "L1 full", "L2 state",
                                          "L4 indexed", "L5 chunked"]
    # Devices bottom of the stack first, then the process curves; accelerator counters exist here.
    assert plots.memory.legend.names() == ["KV on cuda:0", "KV on cpu", "model process RSS", "peak per turn",
                                          "accel allocated", "accel reserved"]


def test_grid_matches_pyqtgraphs_legend(plots, qapp):
    """Same cells as pyqtgraph's LegendItem with the lanes' options: samples, labels, the box."""
    mine = plots.tokens.legend
    plot = pg.PlotItem()
    ref = plot.addLegend(offset=(4, 2), colCount=6, labelTextSize="8pt", verSpacing=-6, horSpacing=14)
    for e in mine.entries:
        ref.addItem(e.item, e.name)
    ref.layout.activate()
    qapp.processEvents()
    assert len(mine.entries) == 7  # two rows: the grid's second row is laid out too
    for (sample, label), e in zip(ref.items, mine.entries):
        box = mine.sample_rect(e.name)
        assert box is not None
        assert (box.x(), box.y()) == pytest.approx((sample.pos().x(), sample.pos().y()), abs=0.01)
        at = mine._labels[mine.entries.index(e)]
        assert (at.x(), at.y()) == pytest.approx((label.pos().x() + 4, label.pos().y() + 4), abs=0.01)
    assert mine.boundingRect().size().toTuple() == pytest.approx((ref.width(), ref.height()), abs=0.01)
    assert mine.pos().toTuple() == pytest.approx(ref.pos().toTuple())


def test_samples_are_painted_with_their_pens_and_follow_changes(plots, qapp):
    legend = plots.tokens.legend
    curve = plots.tokens.layer_curves[1]
    box = legend.sample_rect("L1 full")
    mid = QtCore.QPointF(box.center().x(), box.y() + 11)
    assert _pixel(plots, legend, mid).name() == curve.opts["pen"].color().name()
    curve.setPen(pg.mkPen("#FF0000", width=1.6))  # the cached picture must follow
    qapp.processEvents()
    assert _pixel(plots, legend, mid).name() == "#ff0000"
    # A click on the sample hides the curve (a crossed eye instead of the pen), a second shows it.
    legend.mouseClickEvent(_Click(QtCore.QPointF(box.center())))
    qapp.processEvents()
    assert not curve.isVisible() and _pixel(plots, legend, mid).name() != "#ff0000"
    legend.mouseClickEvent(_Click(QtCore.QPointF(box.center())))
    qapp.processEvents()
    assert curve.isVisible() and _pixel(plots, legend, mid).name() == "#ff0000"


def test_labels_and_background_follow_the_theme(plots, qapp):
    from kvinspect.gui.base import theme as th

    legend = plots.memory.legend
    rect = plots.view.mapFromScene(legend.mapToScene(legend.boundingRect())).boundingRect()
    for t in (th.LIGHT, th.DARK):
        plots.apply_theme(t)
        qapp.processEvents()
        img = plots.view.grab().toImage().copy(rect)
        px = np.array([[img.pixelColor(x, y).lightness() for x in range(0, img.width(), 2)]
                       for y in range(0, img.height(), 2)])
        fg = QtGui.QColor(t.plot_fg).lightness()
        # Text in the label colour is there: some pixels close to plot_fg's lightness.
        assert (np.abs(px - fg) < 25).sum() > 20


def test_a_removed_entry_reflows_the_grid(plots):
    legend = plots.memory.legend
    before = legend.boundingRect().width()
    legend.removeItem("accel reserved")
    assert "accel reserved" not in legend.names() and legend.boundingRect().width() < before
    legend.addItem(plots.memory.reserved, "accel reserved")
    assert legend.names()[-1] == "accel reserved" and legend.boundingRect().width() == pytest.approx(before)


class _Click:
    def __init__(self, pos: QtCore.QPointF):
        self._pos, self.accepted = pos, False

    def button(self):
        return QtCore.Qt.MouseButton.LeftButton

    def pos(self):
        return self._pos

    def accept(self):
        self.accepted = True
