"""The window's menus and shortcuts. Actions call the window's public methods; nothing else here."""

from __future__ import annotations

import sys

from PySide6 import QtGui

from kvinspect.gui.base import theme as th


def _std(action: QtGui.QAction, key: QtGui.QKeySequence.StandardKey, fallback: str | None = None,
         also: str | None = None) -> None:
    """The platform's own keys for ``key`` (all of them); ``fallback`` where it has none; ``also`` added to them."""
    keys = list(QtGui.QKeySequence.keyBindings(key))
    if not keys and fallback:
        keys = [QtGui.QKeySequence(fallback)]
    if also and QtGui.QKeySequence(also) not in keys:
        keys.append(QtGui.QKeySequence(also))
    action.setShortcuts(keys)


def build_menus(win) -> None:
    """File, Edit, Chat, View, Tools, Help on ``win`` (a MainWindow); keeps the actions tests and users reach.

    Every menu and item has a mnemonic (Alt+F, then the underlined letter); standard commands use
    ``QKeySequence.StandardKey``, so each platform gets its own keys (docs/gui.md lists them).
    """
    SK = QtGui.QKeySequence.StandardKey
    mb = win.menuBar()
    f = mb.addMenu("&File")
    f.addAction(win.load_action)
    win.new_chat_action = f.addAction("&New chat", win.new_chat)
    _std(win.new_chat_action, SK.New, "Ctrl+N")
    f.addSeparator()
    win.open_action = f.addAction("&Open trace…", lambda: win.open_trace())
    _std(win.open_action, SK.Open, "Ctrl+O")
    win.open_action.setToolTip("Show a saved trace read-only, with a replay slider (also: drop it on the window)")
    win.recent_menu = f.addMenu("Open &recent")
    win.recent_menu.setToolTip("The traces opened or saved last, newest first")
    win.recent_menu.aboutToShow.connect(lambda: fill_recent_menu(win))
    win.autosave_menu = f.addMenu("Open auto&saved session")
    win.autosave_menu.setToolTip("Every session is written as it runs: after a crash, the last one is here")
    win.autosave_menu.aboutToShow.connect(lambda: fill_autosave_menu(win))
    win.follow_action = f.addAction("&Follow trace…", lambda: win.follow_trace())
    win.follow_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+O"))
    win.follow_action.setToolTip("Watch a trace another program is writing (kvinspect trace / observe), live")
    win.save_action = f.addAction("Sa&ve trace…", lambda: win.save_trace())
    _std(win.save_action, SK.Save, "Ctrl+S")
    win.export_action = f.addAction("&Export report…", win.export_report_dialog)
    win.export_action.setShortcut(QtGui.QKeySequence("Ctrl+E"))
    win.export_action.setToolTip("A bug-report bundle: report.md, plots, summary, trace, reproduce command")
    win.back_action = f.addAction("&Back to live session", win.back_to_live)
    win.back_action.setEnabled(False)
    f.addSeparator()
    win.screenshot_action = f.addAction("Save window screens&hot…", win.save_screenshot_dialog)
    win.screenshot_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+S"))
    f.addSeparator()
    win.quit_action = f.addAction("&Quit", win.close)
    # Some platforms bind Quit to the Exit key only (the generic scheme, offscreen): Ctrl+Q as well, off macOS.
    _std(win.quit_action, SK.Quit, "Ctrl+Q", also=None if sys.platform == "darwin" else "Ctrl+Q")
    win.quit_action.setMenuRole(QtGui.QAction.MenuRole.QuitRole)
    win.file_menu = f

    e = mb.addMenu("&Edit")
    win.copy_turns_action = e.addAction("Copy &turns as Markdown", win.copy_turns)
    win.copy_turns_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+C"))
    win.copy_layers_action = e.addAction("Copy &layer table as Markdown (step shown)", win.copy_layers)
    win.copy_event_action = e.addAction("Copy selected &event as Markdown", lambda: win.copy_event())
    e.addSeparator()
    win.find_action = e.addAction("&Find in the conversation…", win.show_find)
    _std(win.find_action, SK.Find, "Ctrl+F")
    win.find_next_action = e.addAction("Find &next", lambda: win.find_text(win.find_box.text()))
    _std(win.find_next_action, SK.FindNext, "F3")
    win.find_previous_action = e.addAction("Find &previous", lambda: win.find_text(win.find_box.text(), back=True))
    _std(win.find_previous_action, SK.FindPrevious, "Shift+F3")
    win.edit_menu = e

    c = mb.addMenu("&Chat")
    win.send_action = c.addAction("&Send", win.chat.send)
    win.send_action.setShortcut(QtGui.QKeySequence("Ctrl+Return"))
    win.stop_action = c.addAction("S&top generating", win.stop)
    win.stop_action.setShortcut(QtGui.QKeySequence("Esc"))
    win.restart_action = c.addAction("&Restart engine", win.restart_engine)
    win.restart_action.setToolTip("Start a new model process and reload the model (a new chat); ends a hung one")
    c.addSeparator()
    focus = c.addAction("&Focus the message box", lambda: win.chat.input.setFocus())
    focus.setShortcut(QtGui.QKeySequence("Ctrl+I"))

    v = win.view_menu = mb.addMenu("&View")
    themes = QtGui.QActionGroup(win)
    win.theme_actions = {}
    labels = {"system": "Follow the &system theme", "dark": "&Dark theme", "light": "&Light theme"}
    for name in th.CHOICES:
        a = v.addAction(labels.get(name, name.capitalize() + " theme"), lambda n=name: win.set_theme(n))
        a.setCheckable(True)
        themes.addAction(a)
        win.theme_actions[name] = a
    win.theme_actions["dark"].setShortcut(QtGui.QKeySequence("Ctrl+Shift+D"))
    win.theme_actions["light"].setShortcut(QtGui.QKeySequence("Ctrl+Shift+L"))
    v.addSeparator()
    win.zoom_in_action = v.addAction("Zoom &in (fewer steps)", lambda: win.zoom_plots(0.5))
    _std(win.zoom_in_action, SK.ZoomIn, "Ctrl++")
    win.zoom_out_action = v.addAction("Zoom &out (more steps)", lambda: win.zoom_plots(2.0))
    _std(win.zoom_out_action, SK.ZoomOut, "Ctrl+-")
    # No StandardKey for "actual size": Ctrl+0 is what browsers and editors use for the reset.
    win.zoom_reset_action = v.addAction("&Fit all steps / follow (reset zoom)", lambda: win.plots.set_follow(True))
    win.zoom_reset_action.setShortcut(QtGui.QKeySequence("Ctrl+0"))
    win.full_screen_action = v.addAction("F&ull screen", win.toggle_full_screen)
    win.full_screen_action.setCheckable(True)
    _std(win.full_screen_action, SK.FullScreen, "F11")
    v.addSeparator()
    for d in (win.chat_dock, win.events_dock, win.check_dock, win.layers_dock):
        v.addAction(d.toggleViewAction())

    t = mb.addMenu("&Tools")
    win.compare_action = t.addAction("&Compare configurations…", win.open_compare)
    win.compare_action.setShortcut(QtGui.QKeySequence("Ctrl+K"))
    win.compare_action.setToolTip("Run one conversation under several cache configurations with the loaded model")
    win.compare_action.setEnabled(False)

    h = mb.addMenu("&Help")
    h.addAction("Reuse &policies…", win.show_policies)
    about = h.addAction("&About kvinspect", win.show_about)
    about.setMenuRole(QtGui.QAction.MenuRole.AboutRole)


def fill_recent_menu(win) -> list:
    """File → Open recent: the remembered traces (``settings.recent_traces``) that still exist."""
    from pathlib import Path

    from kvinspect.gui.panels import model_line

    m = win.recent_menu
    m.clear()
    actions = []
    for p in win.settings.recent_traces:
        if not Path(p).exists():
            continue  # moved or deleted since: not offered (kept in the list in case a drive comes back)
        shown = model_line.elide(p).replace("&", "&&")  # a literal & in a path, not a mnemonic
        label = f"&{len(actions) + 1} {shown}" if len(actions) < 9 else shown
        a = m.addAction(label, lambda p=p: win.open_trace(p))
        a.setToolTip(p)
        actions.append(a)
    if not actions:
        m.addAction("(no recent trace)").setEnabled(False)
    else:
        m.addSeparator()
        m.addAction("&Clear the list", win.clear_recent_traces)
    return actions


def fill_autosave_menu(win, limit: int = 15) -> list:
    """The newest autosaved sessions (``core.autosave``), each opening read-only; returns the actions."""
    from datetime import datetime

    from kvinspect.core.trace.autosave import list_autosaves
    from kvinspect.core.units import fmt_bytes

    m = win.autosave_menu
    m.clear()
    own = win.info.trace_path if win.info is not None else None
    actions = []
    for a in list_autosaves()[:limit]:
        state = "this session" if own and str(a.path) == own else (
            "closed" if a.closed else "not closed: crashed, killed or still running")
        label = f"{datetime.fromtimestamp(a.mtime):%Y-%m-%d %H:%M} · {a.name} · {fmt_bytes(a.size)} · {state}"
        actions.append(m.addAction(label, lambda p=str(a.path): win.open_trace(p)))
    if not actions:
        m.addAction("(no autosaved session yet)").setEnabled(False)
    return actions
