"""Plots and panels render from (record, step): decimation is exact, replay steps are honoured.

Speed is measured by benchmarks/redraw.py, not here; these tests pin what is drawn.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kvinspect.core.trace.series import MIN_COLUMNS, Pyramid

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from redraw import synthetic_record  # noqa: E402


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


def test_big_record_is_decimated_to_the_plot_width(qtbot):
    from kvinspect.gui.plots import PlotsWidget

    rec = synthetic_record(100_000, 80)
    w = PlotsWidget()
    qtbot.addWidget(w)
    w.resize(1000, 600)
    w.show()
    qtbot.waitExposed(w)
    w.render(rec, force=True)
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
    assert len(w.heat.regions._rects) == 14  # 80 layers, every 6th full → 14 sliding runs


def test_panels_render_a_record_without_a_session_at_a_replay_step(qtbot, window):
    """What viewer mode needs: a record (here from a headless core session) and a step."""
    from kvinspect.core.session.chat import ChatSession, SessionOptions
    from kvinspect.core.session.script import GenerationSettings
    from tests.conftest import load_cached

    loaded = load_cached("tiny-mistral")
    with ChatSession(loaded, SessionOptions(settings=GenerationSettings(max_new_tokens=60))) as s:
        s.run_turn("Replay me later, please.")
        s.run_turn("Second turn.")
        rec = s.record
    ev = next(e for e in rec.events if e.kind == "window_reached")
    before = ev.step - 5
    window.set_record(rec, step=before)
    assert window.events.count() == 0  # the window had not been reached yet
    rows = window.layers.model.rows
    assert [r["seen"] for r in rows] == list(rec.seen[before])
    assert window.plots.heat.img.image.shape[0] <= before + 1
    window.set_record(rec, step=None)
    assert window.events.count() == len(rec.events)
    assert [r["stored"] for r in window.layers.model.rows] == list(rec.stored[-1])
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
