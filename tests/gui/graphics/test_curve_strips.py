"""A growing curve repaints the strip after its previous last point and leaves what a full repaint
paints; a dashed one too, its dashes made in its path (gui/graphics/curve.py: ``dash_points``)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6 import QtCore, QtWidgets

from kvinspect.gui.graphics.curve import Curve, dash_points


def _pieces(x, y, connect):
    """The drawn pieces as runs of connected points: [(length along the line, first point, last point)]."""
    runs, start, length = [], 0, 0.0
    for i in range(len(x)):
        if i and connect[i - 1]:
            length += float(np.hypot(x[i] - x[i - 1], y[i] - y[i - 1]))
        if not connect[i]:
            runs.append((length, (x[start], y[start]), (x[i], y[i])))
            start, length = i + 1, 0.0
    return runs


def test_the_dashes_follow_the_pens_pattern_along_the_line_in_device_pixels():
    x = np.array([0.0, 50.0])
    y = np.array([0.0, 0.0])
    # 2 data units a pixel in x: the line is 25 px long, dashed 4 on / 2 off from its first point: a
    # piece 3 px long lights 4 pixels (both ends).
    pieces = _pieces(*dash_points(x, y, (2.0, 1.0), (4.0, 2.0)))
    assert [round(p[0] / 2, 9) for p in pieces] == [3.0, 3.0, 3.0, 3.0, 1.0]
    assert [p[1][0] / 2 for p in pieces] == [0.0, 6.0, 12.0, 18.0, 24.0]


def test_a_dash_over_a_corner_follows_the_line_and_a_gap_in_it_breaks_none():
    # Up 2 px, then right: the first dash (3 px long) turns the corner, and the pattern goes on over
    # a NaN gap without drawing across it.
    x = np.array([0.0, 0.0, 10.0, np.nan, 20.0, 30.0])
    y = np.array([0.0, 2.0, 2.0, np.nan, 2.0, 2.0])
    px_, py_, connect = dash_points(x, y, (1.0, 1.0), (4.0, 2.0))
    first = _pieces(px_, py_, connect)[0]
    assert first[0] == pytest.approx(3.0) and first[2] == (1.0, 2.0)
    assert (0.0, 2.0) in list(zip(px_.tolist(), py_.tolist(), strict=True))  # the corner is one of its points
    gap_x = 15.0  # the x of the NaN point
    for length, a, b in _pieces(px_, py_, connect):
        assert not (a[0] < gap_x < b[0]), "a piece drawn across the gap"
        assert length <= 3.0 + 1e-9
    assert dash_points(np.array([1.0, 1.0]), np.array([2.0, 2.0]), (1.0, 1.0), (4.0, 2.0)) is None


@pytest.mark.parametrize("style", [QtCore.Qt.PenStyle.DashLine, QtCore.Qt.PenStyle.SolidLine], ids=["dashed", "solid"])
def test_a_growing_curve_repaints_strips_and_leaves_what_a_full_repaint_paints(qtbot, style):
    w = pg.PlotWidget()
    qtbot.addWidget(w)
    w.resize(600, 300)
    w.show()
    qtbot.waitExposed(w)
    w.setXRange(0, 300, padding=0)
    w.setYRange(0, 300, padding=0)
    w.getViewBox().setMouseEnabled(False, False)
    curve = Curve(pg.mkPen("#4fc3f7", width=1.6, style=style))
    # Uncached, so a strip is painted on the view itself, clipped. (Cached, a strip is painted into a
    # pixmap of its size, where Qt's stroker cuts a sloped line at the pixmap's edge: in a live
    # window that left pixels a full repaint does not, tests/gui/windows/test_window_paint.py.)
    assert curve.cacheMode() == QtWidgets.QGraphicsItem.CacheMode.NoCache
    w.addItem(curve)
    app = QtWidgets.QApplication.instance()
    rng = np.random.default_rng(3)
    ys = np.cumsum(rng.uniform(0.0, 1.8, 300))
    painted: list[int] = []

    class Painted(QtCore.QObject):
        def eventFilter(self, obj, ev):  # noqa: N802 - Qt's name
            if ev.type() == QtCore.QEvent.Type.Paint:
                painted.append(sum(r.width() * r.height() for r in ev.region()))
            return False

    curve.setData(np.arange(20.0), ys[:20])
    app.processEvents()
    vp = w.viewport()
    spy = Painted()
    vp.installEventFilter(spy)
    frames = []
    for n in range(21, 260):
        painted.clear()
        curve.setData(np.arange(float(n)), ys[:n], same_prefix=n - 1)
        app.sendPostedEvents()
        app.processEvents()
        frames.append(sum(painted))
    vp.removeEventFilter(spy)
    area = vp.width() * vp.height()
    assert sorted(frames)[len(frames) // 2] < 0.1 * area, frames
    if w.screen().depth() < 24:
        pytest.skip(f"a {w.screen().depth()}-bit screen: the pixels are compared offscreen, in 32 bits")

    def shown():
        at = vp.mapTo(w.window(), QtCore.QPoint(0, 0))
        return w.screen().grabWindow(w.window().winId(), at.x(), at.y(), vp.width(), vp.height()).toImage()

    live = shown()
    vp.repaint()
    app.processEvents()
    assert live == shown(), "a strip left pixels on screen that a full repaint does not draw"
    if style == QtCore.Qt.PenStyle.SolidLine:
        return
    # And it is dashed: 4 px on, 2 off, so about two thirds of the solid line's pixels.
    def lit(img):  # the curve's pixels
        img = img.convertToFormat(img.Format.Format_RGB32)
        return sum(img.pixel(x, y) & 0xFFFFFF == 0x4FC3F7 for x in range(img.width()) for y in range(img.height()))

    dashed = lit(live)
    curve.setPen(pg.mkPen("#4fc3f7", width=1.6))
    vp.repaint()
    app.processEvents()
    assert 0.5 < dashed / lit(shown()) < 0.85
