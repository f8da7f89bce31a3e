"""The viewer, export, follow and compare on the real SmolLM2-135M-Instruct (30 full-attention layers)."""

from __future__ import annotations

import pytest

from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.trace.tracefile import read_trace
from tests.gui.helpers import load, open_trace, send, show_panel

pytestmark = pytest.mark.smollm2
TIMEOUT_MS = 300_000


def test_smollm2_view_replay_export_and_follow(qtbot, window, smollm2, tmp_path):
    run = tmp_path / "run"
    run_script(smollm2, ChatScript(turns=["What is the capital of France?", "And of Italy?"],
                                   settings=GenerationSettings(max_new_tokens=10)), run)
    rec = read_trace(run)
    show_panel(qtbot, window, window.layers_dock)  # the layer table's tab in front: a hidden panel is not rendered
    open_trace(qtbot, window, run)
    k = rec.turns[1].first_step + 2
    window.viewer.bar.slider.setValue(k)
    window.refresh(force=True)
    rows = window.layers.model.rows
    assert len(rows) == 30 and [r["stored"] for r in rows] == rec.stored[k].tolist()
    assert [r["seen"] for r in rows] == [w["seen"] for w in rec.layer_table_at(k)]
    assert window.plots.heat.img.image.shape[1] == 30
    assert rec.turns[0].reply.strip()[:8] in window.chat.replay.toPlainText()

    dlg = window.export_report_dialog()
    dlg.folder.setText(str(tmp_path / "bundle"))
    with qtbot.waitSignal(dlg.finished_export, timeout=TIMEOUT_MS):
        dlg.start()
    out = tmp_path / "bundle"
    assert {"report.md", "cache.png", "memory.png", "window.png", "summary.json", "trace.jsonl"} <= {
        p.name for p in out.iterdir()}
    assert "--model smollm2" in (out / "report.md").read_text()

    folder = tmp_path / "live"
    folder.mkdir()
    window.follow_trace(str(folder))
    with ChatSession(smollm2, SessionOptions(settings=GenerationSettings(max_new_tokens=8)),
                     trace_path=folder / "trace.jsonl") as s:
        s.run_turn("Name a colour.")
        v = window.viewer
        qtbot.waitUntil(lambda: v.record is not None and len(v.record.turns) == 1
                        and v.record.turns[0].status == "ok", timeout=TIMEOUT_MS)
        qtbot.waitUntil(lambda: window.layers.model.rows
                        and window.layers.model.rows[0].get("seen") == int(s.record.seen[-1, 0]), timeout=TIMEOUT_MS)
        assert v.record.n_steps == s.record.n_steps and window.record.n_layers == 30
    window.back_to_live()


def test_smollm2_compare_window(qtbot, window, smollm2_fetched):
    load(qtbot, window, "smollm2")
    send(qtbot, window, "What is the capital of France?", max_new_tokens=6)
    cw = window.open_compare()
    qtbot.addWidget(cw)
    qtbot.waitUntil(lambda: not cw.pending, timeout=TIMEOUT_MS)
    cw.set_selected(["dynamic", "static", "nocache"])
    cw.repeat.setValue(1)
    cw.max_new.setValue(4)
    cw.capacity.setValue(256)
    with qtbot.waitSignal(cw.runFinished, timeout=TIMEOUT_MS) as blocker:
        assert cw.start()
    data = blocker.args[0]
    assert [r[0] for r in cw.rows()] == ["dynamic", "static", "nocache"]
    st = next(c for c in data["configs"] if c["name"] == "static")
    assert st["max_cache_len"] == 256 and st["summary"]["kv_capacity_rows"] == 256
    assert cw.tabs.count() >= 2
