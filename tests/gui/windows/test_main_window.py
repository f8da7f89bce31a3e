"""The inspector window end to end, on a real engine and real tiny models (no mocks).

Every test loads through the window (``win.load`` → worker thread → core ``load_model``),
sends turns by typing into the input box and pressing Enter, and asserts on what the
panels show, which they render from the session's record.
"""

from __future__ import annotations

import numpy as np
import pytest
from PySide6 import QtCore, QtWidgets

from kvinspect.core.detect.events import CACHE_RECREATED, TURN_STOPPED, WINDOW_REACHED
from kvinspect.gui.panels.layer_table import COLUMNS
from tests.gui.helpers import LOAD_TIMEOUT_MS, TURN_TIMEOUT_MS, load, send, show_panel


def _events(win, kind):
    return [e for e in win.record.events if e.kind == kind]


def _tree_kinds(win):
    t = win.events.tree
    return [t.topLevelItem(i).text(3) for i in range(t.topLevelItemCount())]


def test_two_turns_stream_and_fill_every_panel(qtbot, window):
    info = load(qtbot, window, "tiny-gemma3")
    assert info.n_layers == 6 and window.windowTitle() == "kvinspect — tiny-gemma3"
    assert "S×5, F" in window.model_label.text()

    # Tokens stream: the transcript shows part of the reply before the turn is over.
    partial = []

    def watch():
        if window.controller.busy == "turn":
            partial.append(window.chat.plain_text())

    window.renderedTick.connect(watch)
    t1 = send(qtbot, window, "Hello! What does a KV cache store?", max_new_tokens=120)
    window.renderedTick.disconnect(watch)
    assert t1.status == "ok" and t1.new_tokens == 120
    final = window.chat.plain_text()
    assert t1.reply in final
    grown = {len(p) for p in partial}
    # (a tiny model makes its 120 tokens in about a second, and a dear frame paints twice a second)
    assert len(grown) >= 2, "the reply did not appear in pieces while generating"
    assert any(t1.reply[:5] in p and t1.reply not in p for p in partial), "no partial reply was ever shown"

    t2 = send(qtbot, window, "Why does a sliding-window layer stop growing?", max_new_tokens=40)
    assert t2.status == "ok" and t2.reused_tokens > 0 and t2.index == 1
    window.refresh(force=True)
    rec = window.record
    n = rec.n_steps
    assert n == t2.end_step > t1.end_step > 0

    # Per-turn lines in the transcript.
    text = window.chat.plain_text().replace("\xa0", " ")  # figures are kept whole with no-break spaces
    for word in ("turn 2", f"prompt {t2.prompt_tokens}", f"reused {t2.reused_tokens}",
                 f"prefilled {t2.prefill_tokens}", f"new {t2.new_tokens}", "TTFT", "tok/s"):
        assert word in text

    # Plots received the data: heatmap columns × 6 layers, curves up to the last step, a turn line per turn.
    p = window.plots
    assert p.series.n == n
    img = p.heat.img.image
    assert img is not None and img.shape[1] == 6 and img.shape[0] >= min(n, 50)
    assert int(img.max()) == int(rec.stored.max())
    x, y = p.tokens.stored.getData()
    assert len(x) > 0 and x.max() >= n - 2
    assert set(p.tokens.layer_curves) == {0, 5}  # default picks: first sliding and first full layer
    assert "cpu" in p.memory.stack and len(p.memory.stack["cpu"].getData()[0]) > 0
    assert len(p.memory.rss.getData()[0]) > 0
    assert p.turn_lines.positions() == [t1.first_step, t2.first_step]
    assert p.turn_lines.shown_labels() == ["turn 1", "turn 2"]

    # Layer table: one row per layer, live values equal to the record's last step.
    show_panel(qtbot, window, window.layers_dock)
    m = window.layers.model
    assert m.rowCount() == 6
    last = rec.layer_table_at(n - 1)
    assert [r["stored"] for r in m.rows] == [row["stored"] for row in last]
    assert [r["kind"] for r in m.rows] == ["sliding"] * 5 + ["full"]
    assert all(r["capacity"] for r in m.rows[:5]) and all(r["held_bytes"] for r in m.rows)

    # Checklist: the latest turn, pass/warn/fail per item.
    st = window.checklist.statuses()
    assert st and set(st.values()) <= {"pass", "warn", "fail"} and st["cache_object"] == "pass"

    # Hover text names layer, step, seen, stored and window.
    cell = p.describe_cell(n - 1, 0)
    for word in ("layer 0", "sliding", f"step {n - 1}", "seen", "stored 95", "window 96"):
        assert word in cell


def test_window_reached_is_highlighted_and_points_at_the_spot(qtbot, window):
    load(qtbot, window, "tiny-mistral")  # all layers sliding, window 64
    send(qtbot, window, "Tell me about windows.", max_new_tokens=80)
    window.refresh(force=True)
    ev = _events(window, WINDOW_REACHED)
    assert len(ev) == 1 and ev[0].layers == [0, 1, 2, 3]
    p = window.plots
    # A shaded region from the step the layers stopped growing, over exactly those layers.
    rects = p.heat.regions.rects
    assert len(rects) == 1
    r = rects[0]
    assert r.left() == ev[0].step and r.top() == 0 and r.bottom() == 4 and r.right() >= window.record.n_steps - 1
    # A marker in the event lane, and a row in the events panel.
    xs = [pt.pos().x() for pt in p.markers.points()]
    assert ev[0].step in xs
    assert WINDOW_REACHED in _tree_kinds(window)
    # Selecting the row moves the cursor there and shows the explanation and advice.
    window.plots.set_follow(False)
    window.plots.heat.plot.setXRange(0, 10, padding=0)  # the spot is out of view
    window.events.select(window.record.events.index(ev[0]))
    assert all(c.isVisible() and c.value() == ev[0].step for c in p.cursor)
    lo, hi = p.heat.plot.getViewBox().viewRange()[0]
    assert lo <= ev[0].step <= hi
    detail = window.events.detail.toPlainText()
    assert "stopped growing" in detail and "What to do" in detail


def test_recreate_policy_shows_cache_recreated_marker(qtbot, window):
    load(qtbot, window, "tiny-llama")
    send(qtbot, window, "First question?", max_new_tokens=16, policy="recreate")
    window.refresh(force=True)
    # Nothing to flag yet, and the panel says so rather than staying blank.
    assert "No events in 1 turn." in window.events.detail.toPlainText()
    t2 = send(qtbot, window, "Second question?", max_new_tokens=16, policy="recreate")
    window.refresh(force=True)
    assert "cache_recreated" in window.events.detail.toPlainText()  # the latest problem is previewed
    ev = _events(window, CACHE_RECREATED)
    assert len(ev) == 1 and ev[0].step == t2.first_step
    assert window.plots.recreate_lines.positions() == [t2.first_step]
    x, _ = window.plots.recreate_lines.curves[2].getData()  # the same line on every lane
    assert list(x) == [t2.first_step, t2.first_step]
    assert CACHE_RECREATED in _tree_kinds(window)
    assert window.checklist.statuses()["cache_object"] == "fail"
    assert "cache_recreated" in window.chat.plain_text()  # flagged on the turn line too
    # Switching back to the right way in the same session: the next turn reuses the cache.
    t3 = send(qtbot, window, "Third question?", max_new_tokens=16, policy="reuse")
    assert t3.policy == "reuse" and t3.reused_tokens > 0
    assert len(_events(window, CACHE_RECREATED)) == 1


def test_stop_mid_generation_keeps_the_cache_consistent(qtbot, window):
    load(qtbot, window, "tiny-llama")
    chat = window.chat
    chat.max_new.setValue(20_000)
    chat.input.setPlainText("Go on forever.")
    assert not chat.stop_button.isEnabled()
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS) as blocker:
        qtbot.keyClick(chat.input, QtCore.Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: window.record.n_steps > 20 and chat.stop_button.isEnabled(), timeout=60_000)
        qtbot.mouseClick(chat.stop_button, QtCore.Qt.MouseButton.LeftButton)
    turn = blocker.args[0]
    assert turn.status == "stopped" and 0 < turn.new_tokens < 20_000
    assert _events(window, TURN_STOPPED)
    assert "stopped" in window.chat.plain_text()
    assert not chat.stop_button.isEnabled() and chat.send_button.isEnabled()
    t2 = send(qtbot, window, "And now?", max_new_tokens=8)
    assert t2.status == "ok" and t2.reused_tokens > 0
    assert window.checklist.statuses()["length"] == "pass"  # cache length matches the conversation


def test_bad_model_path_shows_one_line_and_window_stays_usable(qtbot, window, tmp_path):
    bad = str(tmp_path / "no-such-model")
    with qtbot.waitSignal(window.controller.failed, timeout=LOAD_TIMEOUT_MS) as blocker:
        window.load(bad)
    task, message = blocker.args
    assert task == "load" and "\n" not in message and "no such file or directory" in message
    boxes = [b for b in window.errors.boxes if b.isVisible()]
    assert len(boxes) == 1 and boxes[0].text() == message and not boxes[0].isModal()
    assert "Traceback" not in message
    assert window.commands["load"].isEnabled() and not window.progress.isVisible()
    # A broken file gets its own one-line reason too.
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x00garbage")
    with qtbot.waitSignal(window.controller.failed, timeout=LOAD_TIMEOUT_MS) as blocker:
        window.load(str(broken))
    assert "broken.gguf" in blocker.args[1] and "\n" not in blocker.args[1]
    window.errors.close_all()
    # Still usable: a good model loads and answers.
    load(qtbot, window, "tiny-llama")
    turn = send(qtbot, window, "Hi", max_new_tokens=4)
    assert turn.status == "ok"


def test_failed_load_keeps_the_previous_model(qtbot, window, tmp_path):
    load(qtbot, window, "tiny-llama")
    record = window.record
    with qtbot.waitSignal(window.controller.failed, timeout=LOAD_TIMEOUT_MS):
        window.load(str(tmp_path / "missing.gguf"))
    assert window.record is record and window.info.name == "tiny-llama"
    assert send(qtbot, window, "still there?", max_new_tokens=4).status == "ok"


def test_unavailable_cache_is_refused_with_one_line(qtbot, window):
    load(qtbot, window, "tiny-llama")
    window.chat.set_choice(window.chat.cache_impl, "offloaded")  # needs CUDA; this run is on CPU
    window.chat.input.setPlainText("hi")
    with qtbot.waitSignal(window.controller.failed, timeout=TURN_TIMEOUT_MS) as blocker:
        window.chat.send()
    assert blocker.args[0] == "turn" and "CUDA" in blocker.args[1] and "\n" not in blocker.args[1]
    assert window.record.turns == []  # nothing half-recorded
    window.errors.close_all()
    window.chat.set_choice(window.chat.cache_impl, "dynamic")
    assert send(qtbot, window, "hi", max_new_tokens=4).status == "ok"


def test_cancel_load(qtbot, window):
    with qtbot.waitSignal(window.controller.cancelled, timeout=LOAD_TIMEOUT_MS) as blocker:
        window.load("tiny-gemma2")
        qtbot.mouseClick(window.cancel_button, QtCore.Qt.MouseButton.LeftButton)
    assert blocker.args == ["load"]
    assert window.info is None and not window.cancel_button.isVisible()
    assert window.errors.messages == []  # a cancel is not an error


def test_enter_sends_shift_enter_newline(qtbot, window):
    load(qtbot, window, "tiny-llama")
    chat = window.chat
    chat.max_new.setValue(4)
    chat.input.setPlainText("line one")
    chat.input.moveCursor(chat.input.textCursor().MoveOperation.End)
    qtbot.keyClick(chat.input, QtCore.Qt.Key.Key_Return, QtCore.Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(chat.input, "line two")
    assert chat.input.toPlainText() == "line one\nline two"
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS) as blocker:
        qtbot.keyClick(chat.input, QtCore.Qt.Key.Key_Return)
    assert blocker.args[0].user == "line one\nline two"
    assert chat.input.toPlainText() == ""


def test_layer_table_sorts_and_picks(qtbot, window):
    load(qtbot, window, "tiny-gemma3")
    send(qtbot, window, "x" * 120, max_new_tokens=8)
    show_panel(qtbot, window, window.layers_dock)
    view = window.layers.view
    col = [c[0] for c in COLUMNS].index("stored")
    view.sortByColumn(col, QtCore.Qt.SortOrder.DescendingOrder)
    proxy = window.layers.proxy
    first = proxy.index(0, 0).data()
    assert first == "5"  # the full layer holds the most
    values = [proxy.index(r, col).data(QtCore.Qt.ItemDataRole.UserRole) for r in range(proxy.rowCount())]
    assert values == sorted(values, reverse=True)
    # Selecting rows picks those layers as curves.
    view.selectRow(0)
    assert window.plots.picked == [5]


def test_picker_lists_builtins_and_takes_paths(qtbot, window, tmp_path):
    from kvinspect.core.model.catalog import BUILTINS
    from kvinspect.gui.dialogs.model_picker import OTHER

    picker = window.open_picker()
    qtbot.waitExposed(picker)
    names = [picker.list.item(i).data(QtCore.Qt.ItemDataRole.UserRole) for i in range(picker.list.count())]
    assert names == [b.name for b in BUILTINS] + [OTHER]
    gemma = picker.list.item(names.index("tiny-gemma3")).text()
    assert "S×5, F" in gemma and "window 96" in gemma
    assert not picker.trust_warning.isVisible()
    picker.trust.setChecked(True)
    assert picker.trust_warning.isVisible() and "code" in picker.trust_warning.text()
    # A dropped .gguf file becomes the spec.
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    mime = QtCore.QMimeData()
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(gguf))])
    drop = QtGui_drop(picker, mime)
    picker.dropEvent(drop)
    req = picker.request()
    assert req.spec == str(gguf) and req.trust_remote_code is True
    picker.device.setCurrentText("cpu")
    picker.dtype.setCurrentText("float32")
    with qtbot.waitSignal(picker.loadRequested) as blocker:
        picker.list.setCurrentRow(names.index("tiny-llama"))
        picker.load_button.click()
    assert blocker.args[0].spec == "tiny-llama" and blocker.args[0].device == "cpu"
    qtbot.waitSignal(window.controller.modelLoaded, timeout=LOAD_TIMEOUT_MS).wait()


def QtGui_drop(widget, mime):
    from PySide6 import QtGui

    return QtGui.QDropEvent(QtCore.QPointF(5, 5), QtCore.Qt.DropAction.CopyAction, mime,
                            QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier)


def test_fetch_button_only_when_not_fetched(qtbot, window):
    from kvinspect.gui.dialogs.model_picker import ModelPicker

    absent = ModelPicker(window, is_fetched=lambda name: False)
    qtbot.addWidget(absent)
    absent.show()
    assert absent.fetch_button.isVisible() and "not fetched" in absent.fetch_label.text()
    absent.set_fetch_progress("extracting", 0.5)
    assert absent.fetch_progress.isVisible() and absent.fetch_progress.value() == 500
    present = ModelPicker(window, is_fetched=lambda name: True)
    qtbot.addWidget(present)
    present.show()
    assert not present.fetch_button.isVisible()


def test_menus_shortcuts_about_and_themes(qtbot, window, monkeypatch):
    titles = [a.text() for a in window.menuBar().actions()]
    assert titles == ["&File", "&Edit", "&Chat", "&View", "&Tools", "&Help"]
    file_items = [a.text().replace("&", "") for a in window.menus["file"].actions() if a.text()]  # without mnemonics
    assert file_items[0] == "Load model…" and "New chat" in file_items and file_items[-1] == "Quit"
    for item in ("Open trace…", "Follow trace…", "Save trace…", "Export report…", "Back to live session"):
        assert item in file_items
    assert window.commands["load"].shortcut().toString() == "Ctrl+L"
    assert window.commands["new_chat"].shortcut().toString() == "Ctrl+N"
    shortcuts = {"open": "Ctrl+O", "save": "Ctrl+S", "export": "Ctrl+E",
                 "compare": "Ctrl+K", "follow": "Ctrl+Shift+O"}
    for name, keys in shortcuts.items():
        assert window.commands[name].shortcut().toString() == keys
    assert not window.commands["compare"].isEnabled() and not window.commands["back"].isEnabled()  # no model, no trace
    shown = {}
    monkeypatch.setattr(QtWidgets.QMessageBox, "about", lambda parent, title, text: shown.update(text=text))
    window.show_about()
    for pkg in ("kvinspect", "transformers", "torch", "PySide6", "pyqtgraph", "Qt"):
        assert pkg in shown["text"]
    window.set_theme("light")
    pal = QtWidgets.QApplication.instance().palette()
    assert pal.window().color().lightness() > 200 and pal.text().color().lightness() < 80
    window.set_theme("dark")
    pal = QtWidgets.QApplication.instance().palette()
    assert pal.window().color().lightness() < 60 and pal.text().color().lightness() > 200
    assert window.commands["theme_dark"].isChecked()


def test_uncaught_exception_is_shown_not_fatal(qtbot, window):
    from kvinspect.gui.base import errors_and_logs

    errors_and_logs.install_excepthook(window.errors)
    try:
        try:
            raise RuntimeError("boom in a slot")
        except RuntimeError as exc:
            errors_and_logs._hook(type(exc), exc, exc.__traceback__)
    finally:
        import sys
        import threading

        sys.excepthook = sys.__excepthook__
        threading.excepthook = threading.__excepthook__
    assert any("RuntimeError: boom in a slot" in m for m in window.errors.messages)
    box = window.errors.boxes[-1]
    assert box.isVisible() and "Traceback" in box.detailedText() and "\n" not in box.text()
    assert window.isVisible()


def test_settings_are_remembered(qtbot, tmp_path, monkeypatch):
    from kvinspect.core.settings import load_settings
    from kvinspect.gui.app import create

    monkeypatch.setenv("KVINSPECT_CONFIG_DIR", str(tmp_path / "cfg"))
    _, win = create(persist=True)
    qtbot.addWidget(win)
    win.resize(1300, 820)
    win.set_theme("light")
    win.chat.set_choice(win.chat.policy, "refeed")
    win.chat.max_new.setValue(77)
    win.chat.system.setPlainText("be brief")
    win.close()
    s = load_settings()
    assert (s.theme, s.policy, s.max_new_tokens, s.system_prompt) == ("light", "refeed", 77, "be brief")
    assert (s.window.width, s.window.height) == (1300, 820) and s.window.state
    _, again = create(persist=False)
    qtbot.addWidget(again)
    assert again.chat.policy.currentText() == "refeed" and again.chat.max_new.value() == 77
    assert again.settings.theme == "light" and again.width() == 1300
    again.set_theme("dark")


@pytest.mark.smollm2
def test_smollm2_turn_in_the_window(qtbot, window, smollm2_fetched):
    info = load(qtbot, window, "smollm2")
    assert info.n_layers == 30
    turn = send(qtbot, window, "What is the capital of France?", max_new_tokens=12)
    assert turn.status == "ok" and turn.new_tokens > 0 and turn.reply.strip()
    window.refresh(force=True)
    assert turn.reply.strip()[:10] in window.chat.plain_text()
    assert window.plots.heat.img.image.shape[1] == 30
    show_panel(qtbot, window, window.layers_dock)
    assert window.layers.model.rowCount() == 30
    assert {r["kind"] for r in window.layers.model.rows} == {"full"}
    assert window.checklist.statuses()["length"] == "pass"
    assert np.all(window.record.stored[-1] == turn.prompt_tokens + turn.new_tokens - 1)


def test_new_chat_clears_the_conversation_not_the_record(qtbot, window):
    load(qtbot, window, "tiny-llama")
    t1 = send(qtbot, window, "First chat.", max_new_tokens=6)
    with qtbot.waitSignal(window.controller.busyChanged, timeout=TURN_TIMEOUT_MS,
                          check_params_cb=lambda busy: not busy):
        qtbot.mouseClick(window.chat.new_button, QtCore.Qt.MouseButton.LeftButton)
    assert "new chat" in window.chat.plain_text()
    t2 = send(qtbot, window, "Second chat.", max_new_tokens=6)
    assert t2.index == 1 and t2.reused_tokens == 0 and t2.prompt_tokens < t1.prompt_tokens + 20
    assert not _events(window, CACHE_RECREATED)  # a new chat's new cache is expected, not a mistake
    assert window.checklist.statuses()["cache_object"] == "pass"
    assert len(window.record.turns) == 2


def test_the_status_bar_shows_the_autosave_s_file_name_whole(qtbot, window):
    """The trace's path is elided at its start to the label's width: the file name, which names the
    session, is never the part cut off."""
    from pathlib import Path

    info = load(qtbot, window, "tiny-llama")
    label = window.trace_label
    text = label.text()
    assert info.trace_path and text.startswith("trace: ") and text.endswith(Path(info.trace_path).name)
    assert label.fontMetrics().horizontalAdvance(text) <= label.maximumWidth()
    assert label.toolTip() == info.trace_path
    long = "/" + "/".join(["a-rather-long-folder-name"] * 8) + "/20261206-013857-smollm2.jsonl"
    shown = window._trace_text(long)
    assert shown.endswith("20261206-013857-smollm2.jsonl") and "…" in shown
    assert label.fontMetrics().horizontalAdvance(shown) <= label.maximumWidth()


def test_a_turn_s_outcome_stays_in_the_status_bar_until_the_next_turn_is_sent(qtbot, window):
    """No timer takes it away (a message that times out repaints an idle window), and a screenshot taken
    later still shows how the last turn ended."""
    load(qtbot, window, "tiny-llama")
    bar = window.statusBar()
    t1 = send(qtbot, window, "Hello.", max_new_tokens=3)
    assert bar.currentMessage() == f"turn 1: {t1.status}"
    assert not any(t.isActive() for t in bar.findChildren(QtCore.QTimer))
    at_start = []
    window.controller.turnStarted.connect(lambda _i: at_start.append(bar.currentMessage()))
    t2 = send(qtbot, window, "Again.", max_new_tokens=3)
    assert at_start == [""] and bar.currentMessage() == f"turn 2: {t2.status}"
