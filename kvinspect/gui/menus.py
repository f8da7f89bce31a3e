"""The window's menus and shortcuts. Actions call the window's public methods; nothing else here."""

from __future__ import annotations

from PySide6 import QtGui

from . import theme as th


def build_menus(win) -> None:
    """File, Chat, View, Help on ``win`` (a MainWindow); keeps the actions tests and users reach."""
    mb = win.menuBar()
    f = mb.addMenu("&File")
    f.addAction(win.load_action)
    win.new_chat_action = f.addAction("New chat", win.new_chat)
    win.new_chat_action.setShortcut(QtGui.QKeySequence("Ctrl+N"))
    f.addSeparator()
    # Trace actions (Save trace…, Open trace…, Export report…, Follow…) go in this section.
    win.trace_section = f.addSection("")
    win.screenshot_action = f.addAction("Save window screenshot…", win.save_screenshot_dialog)
    win.screenshot_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+S"))
    f.addSeparator()
    quit_action = f.addAction("Quit", win.close)
    quit_action.setShortcut(QtGui.QKeySequence.StandardKey.Quit)
    quit_action.setMenuRole(QtGui.QAction.MenuRole.QuitRole)
    win.file_menu = f

    c = mb.addMenu("&Chat")
    win.send_action = c.addAction("Send", win.chat.send)
    win.send_action.setShortcut(QtGui.QKeySequence("Ctrl+Return"))
    win.stop_action = c.addAction("Stop generating", win.stop)
    win.stop_action.setShortcut(QtGui.QKeySequence("Esc"))
    c.addSeparator()
    focus = c.addAction("Focus the message box", lambda: win.chat.input.setFocus())
    focus.setShortcut(QtGui.QKeySequence("Ctrl+K"))

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

    h = mb.addMenu("&Help")
    h.addAction("Reuse policies…", win.show_policies)
    about = h.addAction("About kvinspect", win.show_about)
    about.setMenuRole(QtGui.QAction.MenuRole.AboutRole)
