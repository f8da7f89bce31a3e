"""The Tokens panel on real sessions: each state drawn where the view puts it, hover, slider, event clicks.

Every state gets a screenshot (``tokens-*.png`` under ``KVINSPECT_SHOTS`` when set, else the test's
tmp dir) and a pixel check: the cell the model says is evicted (cropped, duplicated, …) is
painted in that state's colour on the panel itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PySide6 import QtCore, QtGui

from kvinspect.core.tokens.states import (
    CROPPED,
    DUPLICATE,
    HELD,
    NOT_CACHED,
    WINDOWED_OUT,
    TokenView,
)
from kvinspect.core.trace.redact import redact_record
from kvinspect.gui.panels.tokens_panel import DUP_COLOR, STATE_COLORS, TokensPanel, tooltip
from tests.core.tokens.test_tokens import QWEN3, session_for

CASES = {
    "evicted": ("tiny-gemma3", "reuse", {}),
    "refeed": ("tiny-llama", "refeed", {}),
    "think": ("tiny-llama", "reuse", {"chat_template": QWEN3}),
    "nocache": ("tiny-llama", "nocache", {}),
}


@pytest.fixture(scope="module")
def traces():
    """Each case's session record (tests/core/tokens/test_tokens.py checks that a trace file reads back the same view)."""
    out = {}
    for name, (model, policy, opts) in CASES.items():
        _, session, _, _ = session_for(model, policy=policy, new=16 if name == "evicted" else 8, **opts)
        out[name] = session.record
    return out


def shot(panel: TokensPanel, name: str, tmp_path: Path) -> QtGui.QImage:
    img = panel.grab().toImage()
    where = Path(os.environ.get("KVINSPECT_SHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    assert img.save(str(where / f"tokens-{name}.png"))
    return panel.canvas.grab().toImage()


def make_panel(qtbot, record, step=None) -> TokensPanel:
    panel = TokensPanel()
    qtbot.addWidget(panel)
    panel.resize(1000, 560)
    panel.show()
    qtbot.waitExposed(panel)
    panel.render(record, step)
    qtbot.wait(30)  # the labels' new heights settle
    return panel


def expected(panel: TokensPanel, state: int) -> QtGui.QColor:
    base = panel.canvas.palette().color(QtGui.QPalette.ColorRole.Base)
    hexa, alpha = STATE_COLORS[state]
    c, a = QtGui.QColor(hexa), alpha / 255
    return QtGui.QColor(*(round(getattr(c, k)() * a + getattr(base, k)() * (1 - a)) for k in ("red", "green", "blue")))


def painted(img: QtGui.QImage, panel: TokensPanel, cell: int) -> QtGui.QColor:
    canvas = panel.canvas
    canvas.scroll_to_cell(cell)
    img = canvas.grab().toImage()
    r = canvas.cell_rect(cell).translated(canvas.viewport().pos())
    return img.pixelColor(r.left() + 1, r.top() + 1)


def close(a: QtGui.QColor, b: QtGui.QColor, tol=12) -> bool:
    return max(abs(a.red() - b.red()), abs(a.green() - b.green()), abs(a.blue() - b.blue())) <= tol


def test_evicted_tokens_drawn_as_held_only_by_the_full_layer(qtbot, traces, tmp_path):
    rec = traces["evicted"]
    panel = make_panel(qtbot, rec)
    v = panel.view
    img = shot(panel, "evicted", tmp_path)
    early = int(np.flatnonzero(v.state == WINDOWED_OUT)[0])
    late = int(np.flatnonzero(v.state == HELD)[-1])
    assert close(painted(img, panel, early), expected(panel, WINDOWED_OUT))
    assert close(painted(img, panel, late), expected(panel, HELD))
    tip = tooltip(v, early)
    assert f"position {int(v.pos[early])}" in tip and f"id {int(v.ids[early])}" in tip and "turn 1" in tip
    assert "held by 1 of 6 layers: 5" in tip
    assert "held by 6 of 6 layers: 0–5" in tooltip(v, late)
    assert "sliding 96 ×5 (layers 0–4)" in panel.summary.text()
    # Hovering is the canvas's own hit test: the cell under a point is the one drawn there.
    r = panel.canvas.cell_rect(late)
    assert panel.canvas.cell_at(r.center()) == late


def test_refeed_draws_the_duplicate(qtbot, traces, tmp_path):
    panel = make_panel(qtbot, traces["refeed"])
    img = shot(panel, "refeed", tmp_path)
    dup = int(np.flatnonzero(panel.view.flags & DUPLICATE)[0])
    canvas = panel.canvas
    canvas.scroll_to_cell(dup)
    img = canvas.grab().toImage()
    r = canvas.cell_rect(dup).translated(canvas.viewport().pos())
    assert close(img.pixelColor(r.left(), r.center().y()), QtGui.QColor(DUP_COLOR), 40)
    assert "the duplicate" in tooltip(panel.view, dup)


def test_think_template_draws_cropped_and_replacement(qtbot, traces, tmp_path):
    panel = make_panel(qtbot, traces["think"])
    v = panel.view
    img = shot(panel, "think", tmp_path)
    cropped = int(np.flatnonzero(v.state == CROPPED)[0])
    canvas = panel.canvas
    canvas.scroll_to_cell(cropped)
    img = canvas.grab().toImage()
    r = canvas.cell_rect(cropped).translated(canvas.viewport().pos())
    row = [img.pixelColor(x, r.center().y()) for x in range(r.left() + 1, r.right())]
    assert any(close(c, QtGui.QColor("#E5484D"), 40) for c in row)  # the strike-through line
    assert "cropped away" in tooltip(v, cropped) and "was at position" in tooltip(v, cropped)
    assert any("diverged at position" in lab for lab in v.labels.values())


def test_nocache_and_the_replay_slider(qtbot, traces, tmp_path):
    rec = traces["nocache"]
    panel = make_panel(qtbot, rec)
    img = shot(panel, "nocache", tmp_path)
    assert (panel.view.state == NOT_CACHED).all()
    assert close(painted(img, panel, 0), expected(panel, NOT_CACHED))
    first = rec.turns[1].first_step
    panel.render(rec, first)  # the slider moved: the view is that step's
    assert panel.view.step == first and len(panel.view) == rec.turns[1].prompt_tokens + 1


def test_event_click_pins_the_step_until_the_slider_moves(qtbot, traces):
    rec = traces["think"]
    ev = next(e for e in rec.events if e.kind == "prefix_divergence")
    panel = make_panel(qtbot, rec)
    panel.pin(rec, None, ev.step, ev.data.get("position"))
    assert panel.view.step == ev.step
    panel.render(rec, None)  # the window's next refresh, nothing moved
    assert panel.view.step == ev.step
    cell = panel.view.cell_at(ev.data["position"])
    r = panel.canvas.cell_rect(cell)
    assert 0 <= r.top() < panel.canvas.viewport().height()
    panel.render(rec, 3)
    assert panel.view.step == 3


def test_not_recorded_and_100k_tokens_paint_only_what_is_visible(qtbot, traces, tmp_path):
    rec = redact_record(traces["evicted"])  # a redacted copy has no ids, like a v1 trace
    panel = make_panel(qtbot, rec)
    assert "not recorded" in panel.summary.text()
    shot(panel, "not-recorded", tmp_path)
    n = 100_000
    big = TokenView(0, 0, ids=np.arange(n, dtype=np.int64) % 500, pos=np.arange(n, dtype=np.int64),
                    turn_of=np.zeros(n, np.int32), state=np.zeros(n, np.uint8), flags=np.zeros(n, np.uint8),
                    pieces={i: f"w{i}" for i in range(500)}, starts=np.zeros(2, np.int64), ends=np.full(2, n))
    panel.canvas.set_view(big)
    panel.canvas.grab()
    assert 0 < panel.canvas.painted_cells < 3000
    panel.canvas.scroll_to_cell(n - 1)
    panel.canvas.grab()
    assert 0 < panel.canvas.painted_cells < 3000
    assert panel.canvas.cell_at(panel.canvas.cell_rect(n - 1).center()) == n - 1
    assert QtCore.QRect(panel.canvas.viewport().rect()).contains(panel.canvas.cell_rect(n - 1))


def test_tokens_png_for_the_bundle(traces, tmp_path):
    from kvinspect.core.trace.tracefile import write_trace
    from kvinspect.gui.report_images.tokens_figures import render

    path = write_trace(tmp_path / "trace.jsonl", traces["think"])
    files, notes = render(path, tmp_path / "out")
    assert [f.name for f in files] == ["tokens.png"] and notes == [], notes
    assert QtGui.QImage(str(files[0])).width() >= 1000
    files, notes = render(write_trace(tmp_path / "red.jsonl", redact_record(traces["think"])), tmp_path / "red")
    assert files == [] and "not recorded" in notes[0]
