"""Plots and panels render from (record, step): decimation is exact, replay steps are honoured.

Speed is measured by benchmarks/redraw.py, not here; these tests pin what is drawn.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kvinspect.core.trace.series import MIN_COLUMNS, Pyramid

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from redraw import synthetic_record  # noqa: E402

from tests.gui.helpers import plots_showing, show_panel  # noqa: E402


def test_pyramid_is_exact_under_incremental_appends():
    rng = np.random.default_rng(0)
    full = rng.integers(-1, 1000, (5000, 3)).astype(np.int32)
    p = Pyramid(3, np.int32, with_min=True)
    n = 0
    while n < len(full):
        n = min(len(full), n + int(rng.integers(1, 400)))
        p.update(full[:n])
        for a, b, cols in ((0, n, 50), (10, n - 1, 7), (n // 3, n // 2 + 1, 20), (0, n, 10_000)):
            x0, stride, hi, lo = p.window(a, b, cols)
            assert len(hi) <= max(2 * cols, 2 * MIN_COLUMNS) + 2  # the coarsest level keeps ~MIN_COLUMNS
            for j in range(len(hi)):
                seg = full[x0 + j * stride: min(x0 + (j + 1) * stride, n)]
                assert (hi[j] == seg.max(0)).all() and (lo[j] == seg.min(0)).all()


def _shown_plots(qtbot, steps: int, layers: int):
    """A synthetic record drawn by a shown 1000 × 600 plots widget (the benchmark's size)."""
    rec = synthetic_record(steps, layers)
    return rec, plots_showing(qtbot, rec)


def test_big_record_is_decimated_to_the_plot_width(qtbot):
    rec, w = _shown_plots(qtbot, 100_000, 80)
    img = w.heat.img.image
    px = int(w.heat.plot.getViewBox().width())
    assert img.shape[1] == 80 and img.shape[0] <= px + 2  # never 100k columns per frame
    # Every uploaded column is the true max of the steps it covers (peaks survive decimation).
    stored = rec.stored
    rect = w.heat.img.mapRectToParent(w.heat.img.boundingRect())
    x0, stride = int(rect.left()), int(round(rect.width() / img.shape[0]))
    assert stride > 1 and stride & (stride - 1) == 0  # a pyramid level: 2, 4, 8, …
    for j in (0, img.shape[0] // 2, img.shape[0] - 1):
        seg = stored[x0 + j * stride: x0 + (j + 1) * stride]
        if len(seg):
            assert (img[j] == seg.max(0)).all()
    # Curves are decimated too, and kind chips sit on the layer axis.
    x, _ = w.tokens.stored.getData()
    assert 0 < len(x) <= 2 * px + 4
    assert len(w.heat.axis.colors) == 80
    # Markers for every event; one shaded region per contiguous run of sliding layers.
    assert len(w.markers.points()) == len(rec.events)
    assert len(w.heat.regions.rects) == 14  # 80 layers, every 6th full → 14 sliding runs


def test_panels_render_a_record_without_a_session_at_a_replay_step(qtbot, window):
    """What viewer mode needs: a record (here from a headless core session) and a step."""
    from kvinspect.core.session.chat import ChatSession
    from kvinspect.core.session.options import SessionOptions
    from kvinspect.core.session.script import GenerationSettings
    from tests.conftest import load_cached

    loaded = load_cached("tiny-mistral")
    with ChatSession(loaded, SessionOptions(settings=GenerationSettings(max_new_tokens=60))) as s:
        s.run_turn("Replay me later, please.")
        s.run_turn("Second turn.")
        rec = s.record
    ev = next(e for e in rec.events if e.kind == "window_reached")
    before = ev.step - 5
    show_panel(qtbot, window, window.layers_dock)  # the layer table's tab in front: a hidden panel is not rendered
    window.set_record(rec, step=before)
    assert window.events.count() == 0  # the window had not been reached yet
    rows = window.layers.model.rows
    assert [r["seen"] for r in rows] == list(rec.seen[before])
    assert window.plots.heat.img.image.shape[0] <= before + 1
    window.set_record(rec, step=None)
    assert window.events.count() == len(rec.events)
    assert [r["stored"] for r in window.layers.model.rows] == list(rec.stored[-1])
    show_panel(qtbot, window, window.check_dock)  # the checklist shares the layer table's tab group
    assert window.checklist.statuses()


def test_theme_switch_keeps_the_data(qtbot, window):
    rec = synthetic_record(2_000, 12, turns=4)
    window.set_record(rec)
    before = window.plots.heat.img.image.copy()
    window.set_theme("light")
    window.set_theme("dark")
    assert np.array_equal(window.plots.heat.img.image, before)
    assert len(window.plots.turn_lines.positions()) == 4


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_window_screenshot_is_not_blank(qtbot, window, theme, tmp_path):
    rec = synthetic_record(5_000, 24, turns=5)
    window.set_theme(theme)
    window.set_record(rec)
    path = tmp_path / f"{theme}.png"
    assert window.save_screenshot(str(path))
    from PySide6 import QtGui

    img = QtGui.QImage(str(path))
    assert img.width() >= 1200 and img.height() >= 700
    colors = {img.pixel(x, y) for x in range(0, img.width(), 37) for y in range(0, img.height(), 29)}
    assert len(colors) > 30  # plots, text and panels, not an empty frame


def _specs(specs):
    """Draw specs as comparable numbers: pens by colour and alpha, points and rects by coordinates."""
    axis, ticks, texts = specs
    def pt(q):
        return (round(q.x(), 9), round(q.y(), 9))
    return ((axis[0].color().rgba(), pt(axis[1]), pt(axis[2])),
            [(pen.color().rgba(), pen.widthF(), pt(a), pt(b)) for pen, a, b in ticks],
            [(tuple(round(v, 9) for v in r.getRect()), int(f), s) for r, f, s in texts])


def test_lane_axes_specs_are_pyqtgraphs(qtbot):
    """LaneAxis.generateDrawSpecs is a leaner copy of pyqtgraph's: the same ticks, labels and places,
    for every axis of the lanes, zoomed, panned and at rest."""
    import pyqtgraph as pg

    from kvinspect.gui.graphics.axes import LaneAxis, _Measure

    rec, w = _shown_plots(qtbot, 20_000, 24)
    axes = [p.getAxis(o) for p in w.lanes for o in ("left", "bottom", "right")] + [w.memory.plot.getAxis("right")]
    axes = [a for a in axes if isinstance(a, LaneAxis) and a.isVisible()]
    assert {a.orientation for a in axes} >= {"left", "bottom", "right"}
    compared = 0
    for a, b in ((0, 20_000), (9_000, 11_000), (10.2, 13.7), (3, 19_000.5), (17_777, 17_790)):
        w.set_follow(False)
        w.heat.plot.setXRange(a, b, padding=0)
        w.render(rec, force=True)
        for ax in axes:
            mine = ax.generateDrawSpecs(_Measure({}, ax.style["tickFont"] or w.view.font()))
            theirs = pg.AxisItem.generateDrawSpecs(ax, _Measure({}, ax.style["tickFont"] or w.view.font()))
            assert (mine is None) == (theirs is None)
            if mine is not None:
                assert _specs(mine) == _specs(theirs), (ax.orientation, a, b)
                compared += bool(mine[2])
    assert compared > 10  # labelled axes were compared, not only empty ones
    ax = w.tokens.plot.getAxis("left")  # empty labels (no width: pyqtgraph's bounds test drops them)
    lo, hi = ax.range
    ax.setTicks([[(lo + (hi - lo) * f, s) for f, s in ((0.2, ""), (0.5, "half"), (0.8, ""))]])
    mine = ax.generateDrawSpecs(_Measure({}, ax.style["tickFont"] or w.view.font()))
    theirs = pg.AxisItem.generateDrawSpecs(ax, _Measure({}, ax.style["tickFont"] or w.view.font()))
    assert _specs(mine) == _specs(theirs) and [s for _, _, s in mine[2]] == ["half"]
    ax.setTicks(None)
    # Tick values: LaneAxis drops a finer level's repeats as np.isclose did.
    rng = np.random.default_rng(1)
    for ax in axes:
        for _ in range(40):
            a = float(rng.uniform(-1e3, 1e9)) * rng.choice([1e-6, 1.0])
            b = a + float(rng.uniform(1e-3, 1e6)) * rng.choice([1e-3, 1.0, 1e3])
            size = float(rng.uniform(50, 1500))
            assert LaneAxis.tickValues(ax, a, b, size) == pg.AxisItem.tickValues(ax, a, b, size)


def test_window_lines_are_drawn_with_their_labels(qtbot):
    """The tokens lane's window sizes: one line item, labelled, in the sliding kind's colour, in view
    once the data come near the window."""
    from PySide6 import QtCore, QtGui

    from kvinspect.gui.base import theme as th

    rec = synthetic_record(6000, 12, turns=2)  # window 4096; the stored mean passes half of it
    w = plots_showing(qtbot, rec, (900, 500), th.DARK)
    lines = w.tokens.window_lines
    assert lines.labels() == ["window 4096"] and w.tokens.windows == [4096]
    vb = w.tokens.plot.getViewBox()
    assert vb.viewRange()[1][1] > 4096  # in view
    img = w.view.grab().toImage()
    at = w.view.mapFromScene(vb.mapViewToScene(QtCore.QPointF(0, 4096)))
    left = w.view.mapFromScene(vb.sceneBoundingRect().topLeft()).x()
    right = w.view.mapFromScene(vb.sceneBoundingRect().topRight()).x()
    want = QtGui.QColor(th.kind_color("sliding"))
    row = [img.pixelColor(x, at.y()) for x in range(left + 2, right - 2)]
    assert sum(c == want for c in row) > 0.15 * len(row)  # dash-dot, partly under the curves
    # The label sits above the line near its left end, in the same colour.
    above = [img.pixelColor(x, y) for x in range(left, left + 120) for y in range(at.y() - 16, at.y() - 2)]
    assert sum(abs(c.red() - want.red()) + abs(c.green() - want.green()) + abs(c.blue() - want.blue()) < 60
               for c in above) > 20


def _growing_record(steps: int, layers: int, grow: int):
    """The benchmark's synthetic record (4 turns) without its last ``grow`` steps, and its columns, to
    append one step a frame as an engine would."""
    full = synthetic_record(steps, layers, turns=4)
    names = ("turn", "t", "cache_id", "q_len", "use_cache", "rss", "accel_allocated", "accel_reserved",
             "seen", "stored", "dev", "nbytes")
    cols = {k: full.col(k).copy() for k in names}
    rec = type(full)(layers, full.header)
    rec.set_devices(full.devices)
    rec.append_columns({k: v[: steps - grow] for k, v in cols.items()})
    for t in full.turns:
        rec.add_turn(t)
    for e in full.events:
        rec.add_event(e)
    return rec, cols


def test_live_frames_draw_what_a_forced_redraw_draws(qtbot):
    """Live frames compare only the curves' last bins (an append-only record at one zoom): what
    they leave drawn, arrays and regions included, must equal a redraw from scratch."""
    from kvinspect.core.trace.series import envelope
    from kvinspect.gui.lanes.lanes_widget import PlotsWidget

    steps, layers, grow = 6000, 12, 700
    rec, cols = _growing_record(steps, layers, grow)
    w = PlotsWidget()
    qtbot.addWidget(w)
    w.resize(900, 560)
    w.show()
    w.growing = True
    w.render(rec, force=True)
    curves = lambda: [w.tokens.seen, w.tokens.stored, *w.tokens.layer_curves.values(),  # noqa: E731
                      *w.memory.stack.values(), w.memory.rss, w.memory.alloc, w.memory.reserved]
    redrawn = skipped = 0
    for at in range(steps - grow, steps):  # one step a frame, across many bins' ends
        rec.append_columns({k: v[at: at + 1] for k, v in cols.items()})
        w.render(rec)
        for c in curves():
            redrawn += c._pending is None
            skipped += c._pending is not None
    assert skipped > redrawn > 0  # most frames compare a bin or two and draw nothing
    live = [(c._key_of()[1].copy(), c._key_of()[2].copy(), *(a.copy() for a in c.getData())) for c in curves()]
    live_rects = [(r.left(), r.top(), r.right(), r.bottom()) for r in w.heat.regions.rects]
    (a, b), _ = w.heat.plot.getViewBox().viewRange()
    x, y = envelope(*w.series.curves.window(a, min(b, steps - 1), max(int(w.heat.plot.getViewBox().width()) // 2, 50)), 0)
    assert np.array_equal(live[0][2], x) and np.array_equal(live[0][3], y)
    w.render(rec, force=True)
    for c, (qx, qy, x, y) in zip(curves(), live):
        assert np.array_equal(c._key_of()[1], qx) and np.array_equal(c._key_of()[2], qy, equal_nan=True)
        cx, cy = c.getData()
        assert np.array_equal(cx, x) and np.array_equal(cy, y, equal_nan=True)
    assert [(r.left(), r.top(), r.right(), r.bottom()) for r in w.heat.regions.rects] == live_rects


def _on_screen(w):
    """What the plot view shows on screen now (the window's backing store, as the last paints left it)."""
    from PySide6 import QtCore

    vp = w.view.viewport()
    at = vp.mapTo(w.window(), QtCore.QPoint(0, 0))
    return w.screen().grabWindow(w.window().winId(), at.x(), at.y(), vp.width(), vp.height()).toImage()


def _assert_on_screen_as_a_full_repaint(w, app):
    """What the last paints left on screen equals the same view repainted whole with every item's pixmap
    cache dropped."""
    from PySide6 import QtWidgets

    if w.screen().depth() < 24:
        # (pytest-xvfb's screen is 16-bit: there translucent items blend with a rounding that depends on
        # the region painted, and a full repaint differs from any partial one by a colour step)
        pytest.skip(f"a {w.screen().depth()}-bit screen: the pixels are compared offscreen, in 32 bits")
    live = _on_screen(w)
    for item in w.view.scene().items():
        mode = item.cacheMode()
        item.setCacheMode(QtWidgets.QGraphicsItem.CacheMode.NoCache)
        item.setCacheMode(mode)
    w.view.viewport().repaint()
    app.processEvents()
    assert live == _on_screen(w), "the last paints left pixels on screen that a full repaint does not paint"


def _growing_plots(qtbot, steps: int, layers: int, grow: int):
    """A shown 1000 × 600 plots widget drawing ``_growing_record`` as a generation (``growing``), painted once."""
    from PySide6 import QtWidgets

    from kvinspect.gui.lanes.lanes_widget import PlotsWidget

    rec, cols = _growing_record(steps, layers, grow)
    w = PlotsWidget()
    qtbot.addWidget(w)
    w.resize(1000, 600)
    w.show()
    qtbot.waitExposed(w)
    w.growing = True
    w.render(rec, force=True)
    app = QtWidgets.QApplication.instance()
    app.processEvents()
    return rec, cols, w, app


def _painted_areas(widget):
    """An event filter installed on ``widget``: its ``areas`` list each paint's area in pixels."""
    from PySide6 import QtCore

    class PaintedArea(QtCore.QObject):
        def __init__(self):
            super().__init__()
            self.areas: list[float] = []

        def eventFilter(self, obj, ev):  # noqa: N802 - Qt's name
            if ev.type() == QtCore.QEvent.Type.Paint:
                self.areas.append(sum(r.width() * r.height() for r in ev.region()))
            return False

    area = PaintedArea()
    widget.installEventFilter(area)
    return area


def test_live_frames_repaint_a_strip_and_leave_on_screen_what_a_full_repaint_paints(qtbot):
    """A live frame asks Qt for the strip its items changed, not their lanes; after many such frames
    (solid curves, the heatmap, dashed curves whole) the screen equals the same view repainted whole
    with every item's pixmap cache dropped."""
    steps, layers, grow = 2000, 30, 120
    rec, cols, w, app = _growing_plots(qtbot, steps, layers, grow)
    heat_px = w.heat.plot.getViewBox().width() * w.heat.plot.getViewBox().height()
    area = _painted_areas(w.view.viewport())
    frames = []
    for at in range(steps - grow, steps):
        rec.append_columns({k: v[at: at + 1] for k, v in cols.items()})
        area.areas.clear()
        w.render(rec)
        app.sendPostedEvents()
        app.processEvents()
        app.processEvents()
        frames.append(sum(area.areas))
    w.view.viewport().removeEventFilter(area)
    # Most frames repaint a strip a few pixels wide (the heatmap's new column, the solid curves' ends);
    # none repaints less than it changed, which the screen check below would show.
    assert sorted(frames)[len(frames) // 2] < 0.6 * heat_px, frames
    _assert_on_screen_as_a_full_repaint(w, app)


def test_a_zoom_back_out_draws_what_a_fresh_redraw_draws(qtbot):
    """Curves, heatmap, grid and axes keep what they drew for the last few views (a zoom, then Fit,
    finds the full view's paths): every frame equals a new widget's first frame, also after the
    record changed under the same view."""
    from PySide6 import QtGui


    rec, w = _shown_plots(qtbot, 20_000, 24)
    other = synthetic_record(20_000, 24)
    other.col("stored")[:] = other.col("stored") // 3  # same shape and views, other values
    other.col("rss")[:] = other.col("rss")[::-1]

    def show(widget, record, view):
        if view is None:
            widget.set_follow(True)
        else:
            widget.set_follow(False)
            widget.heat.plot.setXRange(*view, padding=0)
        widget.render(record, force=True)
        widget.view.viewport().repaint()
        return widget.view.grab().toImage()

    def fresh(record, view) -> QtGui.QImage:
        f = plots_showing(qtbot, record)
        img = show(f, record, view)
        f.close()
        return img

    paths = {}
    for i, (record, view) in enumerate([(rec, None), (rec, (9_000, 11_000)), (rec, None), (rec, (9_000, 11_000)),
                                        (rec, None), (other, None), (other, (9_000, 11_000)), (other, None)]):
        assert show(w, record, view) == fresh(record, view), (i, view)
        path = w.tokens.stored._path
        if (record, view) in paths:
            assert path is paths[(record, view)]  # taken back, not built again
        paths.setdefault((record, view), path)
    assert paths[(rec, None)] is not paths[(other, None)]


def test_curves_and_heatmap_from_windows_are_built_as_from_their_arrays(qtbot):
    """A curve made from a pyramid window (``set_bins``: no checks for a zigzag, unordered or
    non-finite x) has the path, fill and bounds ``setData`` builds from the same arrays; the
    heatmap's indexed image has the colours of a lookup in its table."""
    import pyqtgraph as pg
    from PySide6 import QtGui

    from kvinspect.gui.graphics.curve import dash_points
    from kvinspect.gui.graphics.view_span import pixel_size

    rng = np.random.default_rng(7)

    def elements(path):
        return None if path is None else [(e.x, e.y, e.type) for e in (path.elementAt(i) for i in range(path.elementCount()))]

    def drawn(c):
        return elements(c._path), elements(c._fill), c._bounds.getRect()

    rec, w = _shown_plots(qtbot, 20_000, 24)
    for view in (None, (9_000, 11_000), (10_000, 10_300), (19_990, 20_010)):  # coarse bins, fine bins, raw steps
        w.set_follow(view is None)
        if view is not None:
            w.heat.plot.setXRange(*view, padding=0)
        w.render(rec, force=True)
        for c in [w.tokens.seen, w.tokens.stored, *w.tokens.layer_curves.values(), *w.memory.stack.values(),
                  w.memory.rss, w.memory.alloc, w.memory.reserved]:
            before = drawn(c)
            c.invalidate()
            assert c.setData(*(a.copy() for a in c.getData()))
            assert drawn(c) == before, (view, c.name())
        c, px = w.tokens.seen, pixel_size(w.tokens.seen)
        hi = np.linspace(0, 50 * px[1], 400)[:, None] + [[0.0, 3.0]]
        for lo in (hi - 0.3 * px[1], hi - rng.uniform(0, 3 * px[1], hi.shape)):  # within a pixel; some not
            for gaps in (False, True):
                c.set_bins((100, 16, hi, lo), 1, 0, px, gaps=gaps)
                before = drawn(c)
                x, y = c.getData()
                keep = np.ones(len(x), dtype=bool)
                keep[0::2] = ~(np.abs(y[1::2] - y[0::2]) < px[1])  # a bin within a pixel: its high point only
                # The seen curve is dashed: its path holds the dashes of those points (graphics/curve.py).
                d = dash_points(x[keep], y[keep], px, c._pattern)
                assert c._pattern and before[0] == elements(pg.arrayToQPath(*d[:2], connect=d[2]))
                c.invalidate()
                c.setData(*(a.copy() for a in c.getData()))
                assert drawn(c) == before, gaps
        img = w.heat.img
        buf = img._lut.take(img._idx.T)
        if img._pixels is not None:  # one image column per device pixel: the column under each pixel's centre
            left, pw, count = img._pixels
            centres = left + (np.arange(count) + 0.5) * pw
            at = np.floor((centres - img._rect.left()) / img._rect.width() * len(img._idx)).astype(int)
            buf = np.ascontiguousarray(buf[:, np.clip(at, 0, len(img._idx) - 1)])
            assert abs(img._draw.width() - count * pw) < 1e-9 and img._draw.left() <= img._rect.left()
        assert img._qimage == QtGui.QImage(buf.data, buf.shape[1], buf.shape[0], 4 * buf.shape[1],
                                           QtGui.QImage.Format.Format_RGB32)


def test_curves_within_a_pixel_are_built_as_by_the_general_path(qtbot, monkeypatch):
    """``Curve._set_within`` (every bin within a pixel, as in a whole run's view: the bins' highs,
    no zigzag, the key made when first asked for) draws the path, fill and bounds of the general
    build (envelope, ``setData``, ``_rebuild``), and its arrays and key, made later, are theirs."""
    from kvinspect.gui.graphics.curve import Curve
    from kvinspect.gui.graphics.view_span import pixel_size

    rng = np.random.default_rng(3)

    def elements(path):
        return None if path is None else [(e.x, e.y, e.type) for e in (path.elementAt(i) for i in range(path.elementCount()))]

    def build(c, win, col, px, gaps):
        c.invalidate()
        c._memo.clear()
        assert c.set_bins(win, col, 0, px, gaps=gaps)
        lazy = c._key[1] is None
        key = c._key_of()
        x, y = c.getData()
        return lazy, (elements(c._path), elements(c._fill), c._bounds.getRect(), key[0], key[1].tobytes(),
                      key[2].tobytes(), x.tobytes(), y.tobytes())

    rec, w = _shown_plots(qtbot, 20_000, 24)
    general = Curve._set_within
    shortcuts = 0
    for c in (w.tokens.seen, next(iter(w.memory.stack.values()))):  # a line, and a filled one
        px = pixel_size(c)
        for n, dtype in ((400, np.float64), (3, np.float64), (250, np.int32)):
            hi = np.linspace(-5 * px[1], 50 * px[1], n)[:, None] + [[0.0, 3.0]]
            for spread in (0.3, 0.999, 1.5, 3.0):  # within a pixel; just; not
                lo = hi - rng.uniform(0, spread * px[1], hi.shape)
                win = (100, 16, hi.astype(dtype), lo.astype(dtype))
                for gaps in (False, True):
                    monkeypatch.setattr(Curve, "_set_within", general)
                    lazy, fast = build(c, win, 1, px, gaps)
                    monkeypatch.setattr(Curve, "_set_within", lambda *a, **k: False)
                    _, slow = build(c, win, 1, px, gaps)
                    assert fast == slow, (c.name(), n, dtype, spread, gaps)
                    shortcuts += lazy
    assert shortcuts >= 8  # the shortcut was taken, not only the general path compared with itself


def test_lane_axes_key_sees_a_style_changed_in_place(qtbot):
    """The specs' key keeps the style's ``repr`` until the style changes; pyqtgraph's ``setStyle``
    changes ``tickTextOffset`` in place. The axis' pens are pyqtgraph's."""
    import pyqtgraph as pg

    rec, w = _shown_plots(qtbot, 2_000, 8)
    ax = w.tokens.plot.getAxis("left")
    font = ax.style["tickFont"] or w.view.font()
    before = ax._specs_key(font)
    assert ax._specs_key(font) == before
    ax.setStyle(tickTextOffset=9)
    assert ax._specs_key(font) != before
    assert ax._style_key() == repr(sorted(ax.style.items()))
    ax.style["textFillLimits"] = [(0, 0.5)]  # set directly, not through setStyle
    assert ax._style_key() == repr(sorted(ax.style.items()))
    for mine, theirs in ((ax.pen(), pg.AxisItem.pen(ax)), (ax.tickPen(), pg.AxisItem.tickPen(ax))):
        assert mine == theirs and mine.isCosmetic() == theirs.isCosmetic()



def _live_frames(rec, cols, w, app, area, steps: int, per: int):
    """Append ``per`` of ``cols``' steps a frame, from the record's end up to ``steps``, as an engine would,
    and paint each frame: yields after each, with its paints' areas in ``area.areas``."""
    for at in range(rec.n_steps, steps, per):
        rec.append_columns({k: v[at: at + per] for k, v in cols.items()})
        area.areas.clear()
        w.render(rec)
        for _ in range(3):
            app.sendPostedEvents()
            app.processEvents()
        yield


def _ranges(w) -> tuple:
    """The step axis' top, the tokens and KV lanes' y tops and the heatmap's colour scale's top."""
    return w.heat.plot.getViewBox().viewRange()[0][1], w.tokens.yrange.hi, w.memory.kv_range.hi, w.heat._scale_top


def _fits_at_rest(w, rec, steps: int) -> bool:
    """The run has ended: its view fits the data tightly again."""
    w.growing = False
    w.refit()
    w.render(rec)
    return w.heat.plot.getViewBox().viewRange()[0][1] == steps


def test_a_growing_run_steps_its_ranges_coarsely_and_each_frame_paints_once(qtbot):
    """While a run grows, the step axis, the lanes' y ranges and the heatmap's colour scale move in
    coarse steps (each step repaints lanes whole); a frame whose range stepped is still painted once
    (pyqtgraph moves its items only when the view paints, which used to dirty them mid-paint)."""
    from kvinspect.gui.graphics.sticky_range import growth_ceiling

    steps, layers, grow = 640, 8, 600
    rec, cols, w, app = _growing_plots(qtbot, steps, layers, grow)
    area = _painted_areas(w.view.viewport())
    ranges = {"x": set(), "tokens": set(), "kv": set(), "colours": set()}
    per_frame = []
    for _ in _live_frames(rec, cols, w, app, area, steps, 1):
        per_frame.append(len(area.areas))
        for name, top in zip(ranges, _ranges(w), strict=True):
            ranges[name].add(top)
    w.view.viewport().removeEventFilter(area)
    assert max(per_frame) == 1, per_frame
    # 40 → 640 steps: 64, 100, 200, 300, 500, 1000 (the fine series would take 12 steps)
    assert sorted(ranges["x"]) == [64, 100, 200, 300, 500, 1000]
    for name in ("tokens", "kv", "colours"):
        values = sorted(v for v in ranges[name] if v)
        # Each a 1, 2, 3 or 5 × 10^k, and each step the next of them: none skipped, none between
        # (the fine series would have stepped 100 → 120 → 150).
        assert len(values) >= 3 and all(growth_ceiling(v) == v for v in values), (name, values)
        assert all(growth_ceiling(a * 1.01) == b for a, b in zip(values, values[1:])), (name, values)
    assert _fits_at_rest(w, rec, steps)


def test_a_running_turn_s_ranges_take_in_its_budget_at_its_start_and_its_frames_repaint_strips(qtbot):
    """A turn whose budget (``max_new_tokens``) is known sizes the step axis, the lanes' y ranges and the
    heatmap's colour scale for where it may get to as it starts (its first frame has only its prefill:
    the y ranges take the prefill's rate a prompt token): none of them steps again while it streams,
    so every later frame repaints a strip, not lanes whole. At rest the view fits the data again."""
    from kvinspect.core.trace.record import TurnRecord
    from kvinspect.core.trace.series import KV_TOTAL, MEAN_SEEN

    steps, layers, grow = 640, 8, 600  # a turn of 40 steps, then one of 600 streams
    rec, cols, w, app = _growing_plots(qtbot, steps, layers, grow)
    turn = TurnRecord(index=1, first_step=steps - grow, end_step=steps - grow, status="running",
                      settings={"max_new_tokens": grow})
    with rec.lock:
        rec.turns[:] = [TurnRecord(index=0, first_step=0, end_step=steps - grow, status="ok"), turn]
    viewport = w.view.viewport()
    area = _painted_areas(viewport)
    whole = viewport.width() * viewport.height()
    ranges, areas = [], []
    for per, end in ((1, steps - grow + 1), (8, steps)):  # the prefill alone, then 8 steps a frame
        for _ in _live_frames(rec, cols, w, app, area, end, per):
            areas.append(sum(area.areas))
            ranges.append(_ranges(w))
    viewport.removeEventFilter(area)
    assert ranges[0][0] == 1000  # the step axis: the turn's end (640) from its first frame
    assert len(set(ranges)) == 1, ranges  # from its first frame on, nothing steps
    x, tokens, kv, colours = ranges[-1]
    last = w.series.curve_row(steps - 1)
    assert tokens >= last[MEAN_SEEN] and kv >= last[KV_TOTAL] and colours >= w.series.vmax
    # Later frames repaint strips; one repaints the curves' lanes whole, where their steps first bin two
    # to a point (the data's own doing). Growing as it went, the turn repainted lanes whole in 15 frames.
    big = [i for i, a in enumerate(areas) if a > 0.2 * whole]
    assert big[0] == 0 and len(big) <= 2, [(i, round(areas[i] / whole, 2)) for i in big]
    turn.status, turn.end_step = "ok", steps
    assert _fits_at_rest(w, rec, steps)


def test_a_new_record_is_drawn_by_its_render_without_asking_for_the_interactive_rate(qtbot):
    """A record swap resizes, fits and picks layers inside render(), which draws all of it: no
    wantsPaint (the window would paint at 60 Hz for half a second, as for a drag, while the first
    turn's prompt is prefilled). The user's own Fit still asks."""
    from kvinspect.gui.lanes.lanes_widget import PlotsWidget

    w = PlotsWidget()
    qtbot.addWidget(w)
    w.resize(1000, 600)
    w.show()
    qtbot.waitExposed(w)
    asked = []
    w.wantsPaint.connect(lambda: asked.append(1))
    assert w.render(synthetic_record(500, 8))
    assert asked == []
    w.set_follow(True)
    assert asked == [1]


def test_a_held_render_of_a_moved_view_paints_nothing_until_released_then_all_of_it(qtbot):
    """``hold_whole``: a frame whose view steps (here the step axis) leaves Qt's paint of it to
    ``release_paint()``, so a caller painting in parts lets the event loop run between the render and
    that paint. Until then nothing of the view is painted; then it is painted once, whole, and the screen
    equals a full repaint. A frame that only appends a step is not held."""
    steps, layers, grow = 640, 8, 600
    rec, cols, w, app = _growing_plots(qtbot, steps, layers, grow)
    viewport = w.view.viewport()
    area = _painted_areas(viewport)
    whole = viewport.width() * viewport.height()
    held = appended = 0
    for at in range(steps - grow, steps):
        rec.append_columns({k: v[at: at + 1] for k, v in cols.items()})
        area.areas.clear()
        top = _ranges(w)[0]
        w.render(rec, hold_whole=True)
        for _ in range(3):
            app.sendPostedEvents()
            app.processEvents()
        if _ranges(w)[0] == top:  # an appended step: its strip painted at once
            assert not w.held
            appended += 1
            continue
        assert w.held and area.areas == [], area.areas
        w.release_paint()
        for _ in range(3):
            app.sendPostedEvents()
            app.processEvents()
        assert not w.held and area.areas == [whole], (area.areas, whole)
        held += 1
    viewport.removeEventFilter(area)
    assert held >= 3 and appended > 100, (held, appended)
    _assert_on_screen_as_a_full_repaint(w, app)
