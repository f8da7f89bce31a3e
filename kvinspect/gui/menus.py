"""The window's menus and shortcuts. Actions call the window's public methods; nothing else here."""

from __future__ import annotations

from PySide6 import QtGui

from . import theme as th


def build_menus(win) -> None:
    """File, Edit, Chat, View, Tools, Help on ``win`` (a MainWindow); keeps the actions tests and users reach."""
    mb = win.menuBar()
    f = mb.addMenu("&File")
    f.addAction(win.load_action)
    win.new_chat_action = f.addAction("New chat", win.new_chat)
    win.new_chat_action.setShortcut(QtGui.QKeySequence("Ctrl+N"))
    f.addSeparator()
    win.open_action = f.addAction("Open trace…", lambda: win.open_trace())
    win.open_action.setShortcut(QtGui.QKeySequence("Ctrl+O"))
    win.open_action.setToolTip("Show a saved trace read-only, with a replay slider (also: drop it on the window)")
    win.autosave_menu = f.addMenu("Open autosaved session")
    win.autosave_menu.setToolTip("Every session is written as it runs: after a crash, the last one is here")
    win.autosave_menu.aboutToShow.connect(lambda: fill_autosave_menu(win))
    win.follow_action = f.addAction("Follow trace…", lambda: win.follow_trace())
    win.follow_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+O"))
    win.follow_action.setToolTip("Watch a trace another program is writing (kvinspect trace / observe), live")
    win.save_action = f.addAction("Save trace…", lambda: win.save_trace())
    win.save_action.setShortcut(QtGui.QKeySequence("Ctrl+S"))
    win.export_action = f.addAction("Export report…", win.export_report_dialog)
    win.export_action.setShortcut(QtGui.QKeySequence("Ctrl+E"))
    win.export_action.setToolTip("A bug-report bundle: report.md, plots, summary, trace, reproduce command")
    win.back_action = f.addAction("Back to live session", win.back_to_live)
    win.back_action.setEnabled(False)
    f.addSeparator()
    win.screenshot_action = f.addAction("Save window screenshot…", win.save_screenshot_dialog)
    win.screenshot_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+S"))
    f.addSeparator()
    quit_action = f.addAction("Quit", win.close)
    quit_action.setShortcut(QtGui.QKeySequence.StandardKey.Quit)
    quit_action.setMenuRole(QtGui.QAction.MenuRole.QuitRole)
    win.file_menu = f

    e = mb.addMenu("&Edit")
    win.copy_turns_action = e.addAction("Copy turns as Markdown", win.copy_turns)
    win.copy_turns_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+C"))
    win.copy_layers_action = e.addAction("Copy layer table as Markdown (step shown)", win.copy_layers)
    win.copy_event_action = e.addAction("Copy selected event as Markdown", lambda: win.copy_event())
    win.edit_menu = e

    c = mb.addMenu("&Chat")
    win.send_action = c.addAction("Send", win.chat.send)
    win.send_action.setShortcut(QtGui.QKeySequence("Ctrl+Return"))
    win.stop_action = c.addAction("Stop generating", win.stop)
    win.stop_action.setShortcut(QtGui.QKeySequence("Esc"))
    win.restart_action = c.addAction("Restart engine", win.restart_engine)
    win.restart_action.setToolTip("Start a new model process and reload the model (a new chat); ends a hung one")
    c.addSeparator()
    focus = c.addAction("Focus the message box", lambda: win.chat.input.setFocus())
    focus.setShortcut(QtGui.QKeySequence("Ctrl+I"))

    v = mb.addMenu("&View")
    themes = QtGui.QActionGroup(win)
    win.theme_actions = {}
    for name in th.THEMES:
        a = v.addAction(f"{name.capitalize()} theme", lambda n=name: win.set_theme(n))
        a.setCheckable(True)
        themes.addAction(a)
        win.theme_actions[name] = a
    win.theme_actions["dark"].setShortcut(QtGui.QKeySequence("Ctrl+Shift+D"))
    win.theme_actions["light"].setShortcut(QtGui.QKeySequence("Ctrl+Shift+L"))
    v.addSeparator()
    fit = v.addAction("Fit all steps / follow", lambda: win.plots.set_follow(True))
    fit.setShortcut(QtGui.QKeySequence("Ctrl+0"))
    v.addSeparator()
    for d in (win.chat_dock, win.events_dock, win.check_dock, win.layers_dock):
        v.addAction(d.toggleViewAction())

    t = mb.addMenu("&Tools")
    win.compare_action = t.addAction("Compare configurations…", win.open_compare)
    win.compare_action.setShortcut(QtGui.QKeySequence("Ctrl+K"))
    win.compare_action.setToolTip("Run one conversation under several cache configurations with the loaded model")
    win.compare_action.setEnabled(False)

    h = mb.addMenu("&Help")
    h.addAction("Reuse policies…", win.show_policies)
    about = h.addAction("About kvinspect", win.show_about)
    about.setMenuRole(QtGui.QAction.MenuRole.AboutRole)


def fill_autosave_menu(win, limit: int = 15) -> list:
    """The newest autosaved sessions (``core.autosave``), each opening read-only; returns the actions."""
    from datetime import datetime

    from ..core.trace.autosave import list_autosaves
    from ..core.units import fmt_bytes

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
