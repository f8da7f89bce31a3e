"""Desktop conventions: standard shortcuts, mnemonics, accessible names, the system theme, recent traces."""

from __future__ import annotations

import pytest
from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.settings import Settings, load_settings, save_settings
from tests.conftest import load_cached
from tests.gui.helpers import headless_run, open_trace

SK = QtGui.QKeySequence.StandardKey


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    turns = ["Hello there, what does the cache hold?", "and now?"]
    return headless_run(tmp_path_factory.mktemp("run"), "tiny-llama", turns, max_new_tokens=24)


def test_standard_shortcuts_are_the_platforms(window):
    wanted = {"open": SK.Open, "save": SK.Save, "quit": SK.Quit, "find": SK.Find,
              "find_next": SK.FindNext, "zoom_in": SK.ZoomIn, "zoom_out": SK.ZoomOut,
              "full_screen": SK.FullScreen, "new_chat": SK.New}
    for attr, key in wanted.items():
        action = window.commands[attr]
        platform = QtGui.QKeySequence.keyBindings(key)
        assert action.shortcuts(), attr
        if platform:  # where the platform names keys for it, those first
            assert action.shortcuts()[:len(platform)] == platform, attr
    assert "Ctrl+Q" in [k.toString() for k in window.commands["quit"].shortcuts()]
    assert window.commands["zoom_reset"].shortcut().toString() == "Ctrl+0"
    # No two actions of the window share a key: an ambiguous shortcut fires neither.
    seen: dict[str, str] = {}
    for a in window.findChildren(QtGui.QAction):
        for k in a.shortcuts():
            assert seen.setdefault(k.toString(), a.text()) == a.text(), (k.toString(), a.text(), seen[k.toString()])


def test_zoom_and_full_screen_act_on_the_window(qtbot, window, run_dir):
    open_trace(qtbot, window, run_dir)
    vb = window.plots.heat.plot.getViewBox()
    (a, b), _ = vb.viewRange()
    window.commands["zoom_in"].trigger()
    (a1, b1), _ = vb.viewRange()
    assert b1 - a1 == pytest.approx((b - a) / 2, rel=0.05) and not window.plots.follow
    window.commands["zoom_out"].trigger()
    window.commands["zoom_out"].trigger()
    (a2, b2), _ = vb.viewRange()
    assert b2 - a2 == pytest.approx((b - a) * 2, rel=0.05)
    window.commands["zoom_reset"].trigger()
    assert window.plots.follow
    window.commands["full_screen"].trigger()
    qtbot.waitUntil(lambda: window.isFullScreen())
    assert window.commands["full_screen"].isChecked()
    window.commands["full_screen"].trigger()
    qtbot.waitUntil(lambda: not window.isFullScreen())
    assert not window.commands["full_screen"].isChecked()


def test_find_selects_text_in_the_conversation(qtbot, window):
    window.chat.add_note("the cache keeps every token; the window keeps the last ones")
    window.commands["find"].trigger()
    qtbot.waitUntil(lambda: window.find_box.isVisible())
    assert window.find_box.hasFocus() or not window.isActiveWindow()
    assert window.find_text("keeps")
    first = window.chat.transcript.textCursor().selectionStart()
    assert window.chat.transcript.textCursor().selectedText() == "keeps"
    window.find_box.setText("keeps")
    window.commands["find_next"].trigger()
    second = window.chat.transcript.textCursor().selectionStart()
    assert second > first
    window.commands["find_next"].trigger()  # wraps around to the first match
    assert window.chat.transcript.textCursor().selectionStart() == first
    assert not window.find_text("not in there at all")
    qtbot.keyClick(window.find_box, QtCore.Qt.Key.Key_Escape)
    assert not window.find_box.isVisible()


def _strip(text: str) -> str:
    return text.replace("&&", "")


def test_every_menu_and_item_has_a_mnemonic_unique_in_its_menu(window):
    def check(menu: QtWidgets.QMenu, where: str):
        letters = []
        for a in menu.actions():
            if a.isSeparator() or not a.text() or a in dock_toggles:
                continue
            text = _strip(a.text())
            assert "&" in text, f"{where} → {a.text()!r} has no mnemonic"
            letters.append(text[text.index("&") + 1].lower())
            if a.menu() is not None:
                check(a.menu(), f"{where} → {a.text()}")
        assert len(letters) == len(set(letters)), f"{where}: mnemonics repeat: {letters}"

    # The dock toggles are Qt's own actions, titled by the docks (Alt+letter there would be each title's first).
    dock_toggles = {d.toggleViewAction() for d in window.findChildren(QtWidgets.QDockWidget)}
    titles = [a.text() for a in window.menuBar().actions()]
    assert all("&" in t for t in titles)
    for a in window.menuBar().actions():
        check(a.menu(), a.text())


def test_every_control_and_plot_has_an_accessible_name_and_description(qtbot, window, run_dir):
    from kvinspect.gui.base.accessibility import is_control

    open_trace(qtbot, window, run_dir)  # the replay bar's controls too
    picker = window.open_picker()
    for root in (window, picker):
        controls = [w for w in root.findChildren(QtWidgets.QWidget) if is_control(w)]
        assert len(controls) > 10
        for w in controls:
            what = f"{type(w).__name__} {w.objectName()!r} {getattr(w, 'text', lambda: '')()!r}"
            assert w.accessibleName().strip(), f"no accessible name: {what}"
            assert w.accessibleDescription().strip(), f"no accessible description: {what}"
    assert window.plots.view.accessibleName() == "Cache plots"
    assert "heatmap" in window.plots.view.accessibleDescription()
    assert window.chat.input.accessibleName() == "Message"
    assert window.layers.view.accessibleName() == "Layer table"
    picker.close()


def test_follow_the_system_theme_is_the_default(qtbot, window, monkeypatch):
    from kvinspect.gui.base import theme as th

    assert Settings().theme == "system"
    assert window.settings.theme == "system" and window.commands["theme_system"].isChecked()
    monkeypatch.setattr(th, "system_scheme", lambda: "light")
    QtGui.QGuiApplication.styleHints().colorSchemeChanged.emit(QtCore.Qt.ColorScheme.Light)
    assert window.plots._theme.name == "light" and window.settings.theme == "system"
    assert QtWidgets.QApplication.palette().color(QtGui.QPalette.ColorRole.Window).name() == th.LIGHT.window.lower()
    window.commands["theme_dark"].trigger()  # a pinned theme ignores the desktop
    QtGui.QGuiApplication.styleHints().colorSchemeChanged.emit(QtCore.Qt.ColorScheme.Light)
    assert window.plots._theme.name == "dark" and window.settings.theme == "dark"
    window.commands["theme_system"].trigger()
    assert window.plots._theme.name == "light" and window.settings.theme == "system"
    window.set_theme("dark")


def test_recent_traces_menu_opens_and_is_remembered(qtbot, window, run_dir, tmp_path):
    from kvinspect.gui.windows.menus import fill_submenu

    assert fill_submenu(window, "recent") == []  # nothing yet: one disabled line
    assert not window.menus["recent"].actions()[0].isEnabled()
    open_trace(qtbot, window, run_dir)
    trace = str((run_dir / "trace.jsonl").resolve())
    assert window.settings.recent_traces == [trace]
    gone = str(tmp_path / "moved" / "trace.jsonl")
    window.settings.recent_traces.append(gone)
    actions = fill_submenu(window, "recent")
    assert [a.toolTip() for a in actions] == [trace]  # a trace that no longer exists is not offered
    window.back_to_live()
    with qtbot.waitSignal(window.viewer.opened, timeout=60_000) as blocker:
        actions[0].trigger()
    assert blocker.args[0] == trace
    # Kept across runs, newest first, once each, at most RECENT_TRACES_MAX.
    s = Settings()
    for i in range(15):
        s.remember_trace(tmp_path / f"t{i}.jsonl")
    s.remember_trace(tmp_path / "t3.jsonl")
    p = save_settings(s, tmp_path / "settings.json")
    again = load_settings(p).recent_traces
    assert len(again) == 10 and again[0].endswith("t3.jsonl") and again[1].endswith("t14.jsonl")
    assert len(set(again)) == 10
    window.clear_recent_traces()
    assert fill_submenu(window, "recent") == []


# -- the other windows and dialogs: every control and plot named, mnemonics that reach a control ----------------
def _assert_named(root: QtWidgets.QWidget, at_least: int) -> list[QtWidgets.QWidget]:
    """Every control under ``root`` (accessibility.CONTROLS, plots included) has a name and a description."""
    from kvinspect.gui.base.accessibility import is_control

    controls = [w for w in root.findChildren(QtWidgets.QWidget) if is_control(w)]
    assert len(controls) >= at_least, [type(w).__name__ for w in controls]
    for w in controls:
        what = f"{type(w).__name__} {w.objectName()!r} {getattr(w, 'text', lambda: '')()!r}"
        assert w.accessibleName().strip(), f"no accessible name: {what}"
        assert w.accessibleDescription().strip(), f"no accessible description: {what}"
    return controls


def _mnemonics(root: QtWidgets.QWidget) -> list[tuple[QtWidgets.QWidget, str]]:
    """(widget, letter) for each button and plain-text label under ``root`` whose text has a mnemonic."""
    out = []
    for w in root.findChildren(QtWidgets.QWidget):
        if not isinstance(w, (QtWidgets.QAbstractButton, QtWidgets.QLabel)) or w.objectName().startswith("qt_"):
            continue
        text = _strip(w.text())
        if "&" in text and not (isinstance(w, QtWidgets.QLabel) and w.textFormat() == QtCore.Qt.TextFormat.RichText):
            out.append((w, text[text.index("&") + 1].lower()))
    return out


def _assert_mnemonics(root: QtWidgets.QWidget, at_least: int) -> None:
    """Alt+letter: each mnemonic is one control's (no two share a letter) and a label's reaches its control."""
    letters: dict[str, str] = {}
    for w, letter in _mnemonics(root):
        assert letters.setdefault(letter, w.text()) == w.text(), f"Alt+{letter}: {w.text()!r} and {letters[letter]!r}"
        if isinstance(w, QtWidgets.QLabel):
            assert w.buddy() is not None, f"label {w.text()!r} has a mnemonic but no control to go to"
    assert len(letters) >= at_least, letters


def test_follow_dialog_is_named(qtbot, window):
    window.follow_trace()
    dlg = window.follow_dialog
    qtbot.waitExposed(dlg)
    controls = _assert_named(dlg, 5)  # path, File…, Folder…, Follow, Cancel
    assert dlg.path in controls and dlg.path.accessibleName() == "Trace to follow"
    assert "folder" in dlg.path.accessibleDescription()
    _assert_mnemonics(dlg, 4)
    dlg.close()


def test_export_dialog_is_named(qtbot, window, run_dir):
    open_trace(qtbot, window, run_dir)
    dlg = window.export_report_dialog()
    assert dlg is not None
    qtbot.waitExposed(dlg)
    controls = _assert_named(dlg, 8)
    assert dlg.progress in controls and dlg.progress.accessibleName() == "Export progress"
    assert dlg.folder.accessibleName() == "Report folder"
    assert "token counts" in dlg.redact.accessibleDescription()
    _assert_mnemonics(dlg, 6)
    dlg.close()


def test_viewer_bar_is_named_on_its_own(qtbot, window):
    from kvinspect.gui.panels.viewer_bar import ViewerBar

    bar = ViewerBar()
    qtbot.addWidget(bar)
    bar.set_mode("follow")  # Stop following and Latest shown too
    controls = _assert_named(bar, 6)
    assert {w.accessibleName() for w in controls} >= {"Replay step", "Replay step number", "Replay turn",
                                                      "Latest step", "Stop following", "Back to live session"}
    _assert_mnemonics(bar, 5)
    # The bar lives in the main window, whose menu titles own their letters: the bar's are others.
    menus = {_strip(a.text()).split("&", 1)[1][0].lower() for a in window.menuBar().actions()}
    in_window = _mnemonics(window.viewer.bar)
    assert len(in_window) == 5
    assert not [w.text() for w, letter in in_window if letter in menus]
    _assert_mnemonics(window, 5)  # nothing else in the window takes the bar's letters


def test_policies_box_is_named(qtbot, window):
    from kvinspect.gui.dialogs.policies_box import show_policies

    box = show_policies(window)
    qtbot.waitExposed(box)
    # Its one control is Qt's own (in qt_msgbox_buttonbox, which the walk skips): checked by hand.
    ok = box.button(QtWidgets.QMessageBox.StandardButton.Ok)
    assert ok.accessibleName() == "OK" and ok.accessibleDescription().strip()
    assert box.accessibleName() == "Reuse policies" and box.accessibleDescription().strip()
    box.close()


@pytest.fixture(scope="module")
def compare_doc(tmp_path_factory):
    from kvinspect.core.compare.configs import parse_configs
    from kvinspect.core.compare.report import build_report
    from kvinspect.core.compare.run import ComparePlan, run_compare

    out = tmp_path_factory.mktemp("cmp")
    script = ChatScript(turns=["hello there", "and again"], settings=GenerationSettings(max_new_tokens=2))
    plan = ComparePlan(configs=parse_configs("dynamic,nocache"), script=script, repeat=1)
    return build_report(run_compare(load_cached("tiny-llama"), plan, out))


def test_compare_window_controls_and_plots_are_named(qtbot, window, compare_doc):
    import pyqtgraph as pg

    from kvinspect.gui.base import theme as th

    cw = window.open_compare()  # no model loaded: the window opens and says so
    qtbot.addWidget(cw)
    qtbot.waitExposed(cw)
    cw.results.show_table(compare_doc)
    cw.results.show_figures(compare_doc, th.DARK)
    assert cw.tabs.count() >= 2
    for i in range(cw.tabs.count()):  # each figure's tab shown in turn, as a user would
        cw.tabs.setCurrentIndex(i)
    controls = _assert_named(cw, 20)
    plots = [w for w in controls if isinstance(w, pg.GraphicsView)]
    assert len(plots) == cw.tabs.count()
    assert plots[0].accessibleName() == "Latency per turn plot" and "time to first token" in \
        plots[0].accessibleDescription()
    assert cw.table.accessibleName() == "Comparison table"
    assert cw.checks["dynamic"].accessibleName() == "Configuration dynamic"
    assert cw.capacity.accessibleName() == "Static capacity" and cw.progress in controls
    _assert_mnemonics(cw, 9)
    cw.close()
