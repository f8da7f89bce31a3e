"""Tools → Compare configurations…: the window's loaded model, compared on the worker thread.

Real runs (core ``run_compare``) on tiny models; assertions are structural (rows, statuses,
what is disabled while it runs, what an export writes), never about timings.
"""

from __future__ import annotations

import json

from PySide6 import QtCore

from kvinspect.core.compare.configs import NAMED
from tests.gui.helpers import load, send

RUN_TIMEOUT_MS = 300_000


def open_compare(qtbot, win):
    cw = win.open_compare()
    qtbot.addWidget(cw)
    qtbot.waitExposed(cw)
    qtbot.waitUntil(lambda: not cw.pending, timeout=RUN_TIMEOUT_MS)  # availability checked on the worker
    return cw


def test_compare_dynamic_static_nocache_shows_three_rows_and_exports(qtbot, window, tmp_path):
    load(qtbot, window, "tiny-llama")
    send(qtbot, window, "First turn of the chat.", max_new_tokens=4)
    send(qtbot, window, "Second turn.", max_new_tokens=4)
    chat_record = window.record
    n_steps = chat_record.n_steps
    cw = open_compare(qtbot, window)
    assert list(cw.checks) == list(NAMED)
    # offloaded needs CUDA: shown, disabled, with the reason; the others can run on this CPU.
    assert not cw.checks["offloaded"].isEnabled() and "CUDA" in cw.notes["offloaded"].text()
    assert cw.checks["dynamic"].isEnabled() and cw.checks["nocache"].isEnabled()
    assert "(2)" in cw.use_chat.text()
    cw.set_selected(["dynamic", "static", "nocache"])
    cw.repeat.setValue(2)
    cw.max_new.setValue(4)
    with qtbot.waitSignal(cw.runFinished, timeout=RUN_TIMEOUT_MS) as blocker:
        assert cw.start()
        # One model, one thread: the chat (and loads) wait while it runs; the window stays responsive.
        assert window.controller.busy == "compare" and not window.chat.send_button.isEnabled()
        assert not window.commands["load"].isEnabled() and cw.cancel_button.isEnabled() and not cw.run_button.isEnabled()
        assert window.send(window.chat.request("now?")) is False
    data = blocker.args[0]
    rows = cw.rows()
    assert [r[0] for r in rows] == ["dynamic", "static", "nocache"]
    assert all(r[1] == "ran ×2" for r in rows)
    assert [c["name"] for c in data["configs"]] == ["dynamic", "static", "nocache"]
    by = {c["name"]: c for c in data["configs"]}
    # Structural: static holds its capacity; nocache no KV; dynamic prefills only the suffix after turn 1.
    prompts = by["dynamic"]["summary"]["prompt_tokens_per_turn"]
    assert by["dynamic"]["summary"]["prefill_tokens_per_turn"][1] < prompts[1]
    assert by["nocache"]["summary"]["peak_kv_bytes"] == 0 and rows[2][6] == "0 B"
    assert by["static"]["summary"]["kv_capacity_rows"] == by["static"]["max_cache_len"]
    assert cw.tabs.count() >= 2 and cw.tabs.tabText(0) == "Latency per turn"
    # The chat's own record got nothing from the comparison, and the chat works again.
    assert window.record is chat_record and chat_record.n_steps == n_steps
    assert window.controller.busy == "" and window.chat.send_button.isEnabled()
    assert send(qtbot, window, "Back to chatting.", max_new_tokens=4).reused_tokens > 0

    # Export: the same files as `kvinspect compare`.
    out = tmp_path / "cmp"
    assert cw.export_button.isEnabled()
    with qtbot.waitSignal(cw.exported, timeout=RUN_TIMEOUT_MS):
        cw.export(str(out))
    doc = json.loads((out / "compare.json").read_text())
    assert doc["format"] == "kvinspect-compare" and [c["name"] for c in doc["configs"]] == ["dynamic", "static",
                                                                                          "nocache"]
    md = (out / "compare.md").read_text()
    assert "## Summary" in md and "**static**" in md
    assert (out / "plots" / "latency_per_turn.png").is_file() and (out / "plots" / "memory_per_turn.png").is_file()
    assert len(list((out / "runs").iterdir())) == 6 and (out / "script.json").is_file()
    assert doc["command"][:2] == ["kvinspect", "compare"] and "--script" in doc["command"]


def test_cancel_keeps_what_finished_and_frees_the_chat(qtbot, window):
    load(qtbot, window, "tiny-llama")
    send(qtbot, window, "One turn to compare.", max_new_tokens=4)
    cw = open_compare(qtbot, window)
    cw.set_selected(["dynamic", "nocache"])
    cw.repeat.setValue(20)
    cw.max_new.setValue(400)
    with qtbot.waitSignal(cw.runFinished, timeout=RUN_TIMEOUT_MS) as blocker:
        assert cw.start()
        qtbot.waitUntil(lambda: window.controller.busy == "compare" and cw.table.rowCount() > 0
                        or cw.progress.maximum() > 1, timeout=RUN_TIMEOUT_MS)
        qtbot.mouseClick(cw.cancel_button, QtCore.Qt.MouseButton.LeftButton)
    data = blocker.args[0]
    assert data["cancelled"] is True and "cancelled" in cw.summary.text()
    assert "Cancelled" in cw.status.text()
    runs = sum(len(c["runs"]) for c in data["configs"])
    assert runs < 40  # stopped long before 2 configurations × 20 repeats
    assert window.controller.busy == "" and window.chat.send_button.isEnabled() and cw.run_button.isEnabled()


def test_mistakes_are_one_line_in_the_window(qtbot, window, tmp_path):
    load(qtbot, window, "tiny-llama")
    cw = open_compare(qtbot, window)
    assert "(0)" in cw.use_chat.text()
    assert not cw.start() and "no turns yet" in cw.status.text()
    cw.use_file.setChecked(True)
    cw.script_path.setText(str(tmp_path / "missing.json"))
    assert not cw.start() and "script not found" in cw.status.text()
    cw.use_chat.setChecked(True)
    send(qtbot, window, "now there is a turn", max_new_tokens=4)
    cw.open_for_model()
    cw.set_selected([])
    cw.extra.setText("nonsense")
    assert not cw.start() and "unknown configuration" in cw.status.text()
    assert window.controller.busy == ""


def test_compare_in_another_environment(qtbot, window):
    import sys

    load(qtbot, window, "tiny-llama")
    send(qtbot, window, "First turn of the chat.", max_new_tokens=4)
    cw = open_compare(qtbot, window)
    cw.set_selected(["dynamic"])
    cw.repeat.setValue(1)
    cw.max_new.setValue(4)
    cw.env_on.setChecked(True)
    assert cw.env_python.isEnabled() and not cw.env_host.isEnabled()
    # Mistakes are one line in the window, before anything starts.
    cw.env_python.setText("")
    assert not cw.start() and "Python" in cw.status.text()
    cw.env_ssh.setChecked(True)
    assert cw.env_host.isEnabled() and not cw.start() and "ssh host" in cw.status.text()
    cw.env_local.setChecked(True)
    # The same interpreter as a second environment: every configuration in an engine child of each.
    cw.env_name.setText("again")
    cw.env_python.setText(sys.executable)
    with qtbot.waitSignal(cw.runFinished, timeout=RUN_TIMEOUT_MS) as blocker:
        assert cw.start()
    data = blocker.args[0]
    assert [e["name"] for e in data["environments"]] == ["here", "again"]
    assert all(e["transformers"] for e in data["environments"])
    assert [r[0] for r in cw.rows()] == ["dynamic@here", "dynamic@again"]
    (d,) = data["diff"]
    assert d["config"] == "dynamic" and d["same"] is True  # one Python twice: nothing parts
    assert data["command"][-4:-2] == ["--env", f"again={sys.executable}"]
    assert window.controller.busy == "" and window.chat.send_button.isEnabled()
