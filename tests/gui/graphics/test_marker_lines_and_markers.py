"""The lanes' overlays (gui/graphics/marker_lines.py): event markers and turn/recreate lines, drawn by lean items
that must draw what pyqtgraph's items drew and keep their tooltips and clicks."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6 import QtCore, QtGui, QtWidgets

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from redraw import synthetic_record  # noqa: E402

from tests.gui.helpers import plots_showing  # noqa: E402

NO_CACHE = QtWidgets.QGraphicsItem.CacheMode.NoCache
# Every symbol the event kinds use, two sizes, spots close enough to overlap, some outside the view.
SPOTS = [((x, y), sym, size) for (x, y), sym, size in (
    ((1.0, 0.2), "o", 10), ((1.6, 0.2), "t1", 12), ((3.0, 0.52), "d", 15), ((4.1, 0.2), "t", 12),
    ((5.0, 0.52), "s", 10), ((6.2, 0.2), "x", 15), ((7.0, 0.52), "star", 12), ((8.0, 0.2), "p", 15),
    ((8.4, 0.2), "h", 10), ((9.3, 0.52), "arrow_up", 12), ((-3.0, 0.2), "o", 10), ((30.0, 0.5), "s", 12))]
COLORS = ["#F28C28", "#E5484D", "#FF6FB5", "#E3A008", "#3DC2EC", "#B36AF5"]


def _spots(bg: str = "#131417") -> list[dict]:
    return [{"pos": pos, "symbol": sym, "size": size, "brush": pg.mkBrush(COLORS[i % len(COLORS)]),
             "pen": pg.mkPen(bg, width=1), "data": i} for i, (pos, sym, size) in enumerate(SPOTS)]


@pytest.fixture
def lane(qtbot):
    w = pg.PlotWidget()
    qtbot.addWidget(w)
    w.resize(420, 120)
    w.setBackground("#131417")
    w.show()
    qtbot.waitExposed(w)
    return w


def _grab(w, item) -> QtGui.QImage:
    w.addItem(item, ignoreBounds=True)
    item.setCacheMode(NO_CACHE)  # as while the view moves (PlotsWidget._set_caching)
    w.repaint()
    img = w.grab().toImage()
    w.removeItem(item)
    return img


def test_markers_draw_what_a_scatter_plot_item_drew(lane):
    """Each spot is pyqtgraph's rendered symbol at the pixel the atlas would put it: the same image,
    at several zooms and pans (overlapping spots, spots half out of view)."""
    from kvinspect.gui.graphics.event_markers import MarkersItem

    lane.setYRange(0, 1, padding=0)
    compared = 0
    for x0, x1 in ((0, 10), (0.37, 9.11), (-1.3, 4.45), (2, 2000), (7.9, 8.6)):
        lane.setXRange(x0, x1, padding=0)
        ref = pg.ScatterPlotItem(size=11, hoverable=True, hoverSize=14, pxMode=True)
        ref.setData(_spots())
        mine = MarkersItem(hover_size=14)
        mine.setData(_spots())
        want, got = _grab(lane, ref), _grab(lane, mine)
        assert got == want, (x0, x1)
        compared += len({want.pixel(x, y) for x in range(0, want.width(), 3) for y in range(0, want.height(), 3)}) > 3
    assert compared == 5  # spots were in view, not an empty plot


def test_a_hovered_marker_grows(lane):
    from kvinspect.gui.graphics.event_markers import MarkersItem

    lane.setXRange(0, 10, padding=0)
    lane.setYRange(0, 1, padding=0)
    item = MarkersItem(hover_size=14)
    empty = _grab(lane, item)
    item.setData(_spots()[:1])
    before = _grab(lane, item)
    item._hovered = frozenset({0})
    after = _grab(lane, item)
    def drawn(img):
        return sum(img.pixel(x, y) != empty.pixel(x, y) for x in range(img.width()) for y in range(img.height()))
    assert drawn(after) > 1.5 * drawn(before) > 0  # 15 px square against 11


@pytest.fixture
def plots(qtbot):
    from kvinspect.gui.base import theme as th

    rec = synthetic_record(20_000, 12, turns=8)
    w = plots_showing(qtbot, rec, theme=th.DARK)
    w.view.viewport().repaint()
    return rec, w


def _view_pos(w, item, pos: QtCore.QPointF) -> QtCore.QPoint:
    return w.view.mapFromScene(item.mapToScene(pos))


def _move(qtbot, vp, at: QtCore.QPoint) -> None:
    """A mouse move over the view, as the window system sends it (pyqtgraph's scene makes hover events)."""
    qtbot.wait(30)  # (the scene drops moves closer together than its rate limit)
    ev = QtGui.QMouseEvent(QtCore.QEvent.Type.MouseMove, QtCore.QPointF(at), QtCore.QPointF(vp.mapToGlobal(at)),
                           QtCore.Qt.MouseButton.NoButton, QtCore.Qt.MouseButton.NoButton,
                           QtCore.Qt.KeyboardModifier.NoModifier)
    QtWidgets.QApplication.sendEvent(vp, ev)


def test_markers_keep_their_tooltips_and_clicks(qtbot, plots):
    """Hovering a marker puts the event into the lane's tooltip; clicking it selects the event."""
    from PySide6.QtTest import QTest

    rec, w = plots
    pts = w.markers.points()
    assert len(pts) == len(rec.events) and [p.data() for p in pts] == list(range(len(rec.events)))
    pt = next(p for p in pts if rec.events[p.data()].kind == "cache_recreated")
    e = rec.events[pt.data()]
    assert pt.pos().x() == e.step
    at = _view_pos(w, w.markers, pt.pos())
    assert [p.data() for p in w.markers.pointsAt(pt.pos())] == [pt.data()]
    vp = w.view.viewport()
    _move(qtbot, vp, at + QtCore.QPoint(0, 60))  # off the markers first
    _move(qtbot, vp, at)
    qtbot.waitUntil(lambda: "cache_recreated" in w.lane.getViewBox().toolTip(), timeout=2000)
    tip = w.lane.getViewBox().toolTip()
    assert f"step {e.step}" in tip and e.message in tip
    assert w.markers._hovered == {pt.data()}
    clicked = []
    w.eventClicked.connect(clicked.append)
    QTest.mouseClick(vp, QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier, at)
    assert clicked == [pt.data()]
    # Away from every marker: no tooltip, no click.
    away = _view_pos(w, w.markers, QtCore.QPointF(e.step + 0.5 * (pts[-1].pos().x() - e.step) + 1, 0.9))
    _move(qtbot, vp, away)
    qtbot.waitUntil(lambda: w.lane.getViewBox().toolTip() == "", timeout=2000)
    QTest.mouseClick(vp, QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier, away)
    assert clicked == [pt.data()] and not w.markers._hovered


def _draw_lines(self, p, *args):
    """LinesItem's former paint: every line stroked by Qt with the dashed pen, in one drawLines."""
    if not len(self.xs):
        return
    r = self.boundingRect()
    i0 = int(np.searchsorted(self.xs, r.left(), side="left"))
    i1 = int(np.searchsorted(self.xs, r.right(), side="right"))
    if i1 <= i0:
        return
    t = p.transform()
    dev = t.mapRect(r)
    xs = np.floor(self.xs[i0:i1] * t.m11() + t.dx()) + 0.5
    p.save()
    p.resetTransform()
    p.setPen(self._pen)
    p.drawLines([QtCore.QLineF(x + k, dev.top(), x + k, dev.bottom()) for x in xs for k in range(self._width)])
    p.restore()


def test_turn_and_recreate_lines_are_the_lines_qt_strokes(plots):
    """The lines are one column image blitted per line: the pixels of stroking each dashed line, on
    every lane, at rest, zoomed and panned."""
    rec, w = plots
    items = w.turn_lines.curves + w.recreate_lines.curves
    assert len(w.turn_lines.positions()) == len(rec.turns) and len(w.recreate_lines.positions()) > 0
    for a, b in ((None, None), (4_000, 6_000), (4_999.3, 5_020.9), (123.4, 19_876.5)):
        if a is not None:
            w.set_follow(False)
            w.heat.plot.setXRange(a, b, padding=0)
        w.render(rec, force=True)
        w.view.viewport().repaint()
        got = w.view.grab().toImage()
        for item in items:
            item.paint = types.MethodType(_draw_lines, item)
            item.update()
        w.view.viewport().repaint()
        want = w.view.grab().toImage()
        for item in items:
            del item.paint
            item.update()
        assert got == want, (a, b)
