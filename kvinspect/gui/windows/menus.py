"""The window's menus and shortcuts, declared once as data: :data:`ACTIONS` (what each does, its keys and tip)
and :data:`MENUS` (where each sits). :func:`build_menus` makes them and returns the actions by key
(``win.commands["save"]``); each action's ``run`` takes the window it acts on and calls its public methods.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from PySide6 import QtGui

from kvinspect.gui.base import theme as th

SK = QtGui.QKeySequence.StandardKey


@dataclass(frozen=True)
class Action:
    """One menu command. ``std``: the platform's own keys for it (``keys`` where it has none); ``keys`` alone:
    a fixed shortcut; ``also``: a key added to the platform's."""

    text: str
    run: Callable
    std: QtGui.QKeySequence.StandardKey | None = None
    keys: str | None = None
    also: str | None = None
    tip: str = ""
    checkable: bool = False
    enabled: bool = True
    role: QtGui.QAction.MenuRole | None = None


_THEME_LABELS = {"system": "Follow the &system theme", "dark": "&Dark theme", "light": "&Light theme"}
_THEME_KEYS = {"dark": "Ctrl+Shift+D", "light": "Ctrl+Shift+L"}

ACTIONS: dict[str, Action] = {
    # File (Load is on the toolbar too)
    "load": Action("&Load model…", lambda w: w.open_picker(), keys="Ctrl+L",
                   tip="Pick a built-in, SmolLM2, a hub id, a folder or a .gguf file (Ctrl+L)"),
    "new_chat": Action("&New chat", lambda w: w.new_chat(), std=SK.New, keys="Ctrl+N"),
    "open": Action("&Open trace…", lambda w: w.open_trace(), std=SK.Open, keys="Ctrl+O",
                   tip="Show a saved trace read-only, with a replay slider (also: drop it on the window)"),
    "follow": Action("&Follow trace…", lambda w: w.follow_trace(), keys="Ctrl+Shift+O",
                     tip="Watch a trace another program is writing (kvinspect trace / observe), live"),
    "save": Action("Sa&ve trace…", lambda w: w.save_trace(), std=SK.Save, keys="Ctrl+S"),
    "export": Action("&Export report…", lambda w: w.export_report_dialog(), keys="Ctrl+E",
                     tip="A bug-report bundle: report.md, plots, summary, trace, reproduce command"),
    "back": Action("&Back to live session", lambda w: w.back_to_live(), enabled=False),
    "screenshot": Action("Save window screens&hot…", lambda w: w.save_screenshot_dialog(), keys="Ctrl+Shift+S"),
    # Some platforms bind Quit to the Exit key only (the generic scheme, offscreen): Ctrl+Q as well, off macOS.
    "quit": Action("&Quit", lambda w: w.close(), std=SK.Quit, keys="Ctrl+Q",
                   also=None if sys.platform == "darwin" else "Ctrl+Q", role=QtGui.QAction.MenuRole.QuitRole),
    # Edit
    "copy_turns": Action("Copy &turns as Markdown", lambda w: w.copy_turns(), keys="Ctrl+Shift+C"),
    "copy_layers": Action("Copy &layer table as Markdown (step shown)", lambda w: w.copy_layers()),
    "copy_event": Action("Copy selected &event as Markdown", lambda w: w.copy_event()),
    "find": Action("&Find in the conversation…", lambda w: w.show_find(), std=SK.Find, keys="Ctrl+F"),
    "find_next": Action("Find &next", lambda w: w.find_text(w.find_box.text()), std=SK.FindNext, keys="F3"),
    "find_previous": Action("Find &previous", lambda w: w.find_text(w.find_box.text(), back=True),
                            std=SK.FindPrevious, keys="Shift+F3"),
    # Chat
    "send": Action("&Send", lambda w: w.chat.send(), keys="Ctrl+Return"),
    "stop": Action("S&top generating", lambda w: w.stop(), keys="Esc"),
    "restart": Action("&Restart engine", lambda w: w.restart_engine(),
                      tip="Start a new model process and reload the model (a new chat); ends a hung one"),
    "focus_input": Action("&Focus the message box", lambda w: w.chat.input.setFocus(), keys="Ctrl+I"),
    # View
    **{f"theme_{name}": Action(_THEME_LABELS.get(name, name.capitalize() + " theme"),
                               lambda w, n=name: w.set_theme(n), keys=_THEME_KEYS.get(name), checkable=True)
       for name in th.CHOICES},
    "zoom_in": Action("Zoom &in (fewer steps)", lambda w: w.zoom_plots(0.5), std=SK.ZoomIn, keys="Ctrl++"),
    "zoom_out": Action("Zoom &out (more steps)", lambda w: w.zoom_plots(2.0), std=SK.ZoomOut, keys="Ctrl+-"),
    # No StandardKey for "actual size": Ctrl+0 is what browsers and editors use for the reset.
    "zoom_reset": Action("&Fit all steps / follow (reset zoom)", lambda w: w.plots.set_follow(True), keys="Ctrl+0"),
    "full_screen": Action("F&ull screen", lambda w: w.toggle_full_screen(), std=SK.FullScreen, keys="F11",
                          checkable=True),
    # Tools
    "compare": Action("&Compare configurations…", lambda w: w.open_compare(), keys="Ctrl+K", enabled=False,
                      tip="Run one conversation under several cache configurations with the loaded model"),
    # Help
    "policies": Action("Reuse &policies…", lambda w: w.show_policies()),
    "about": Action("&About kvinspect", lambda w: w.show_about(), role=QtGui.QAction.MenuRole.AboutRole),
}

#: Where each action sits: a key of ACTIONS, ``"-"`` (a separator), ``"menu:KEY"`` (a submenu filled when
#: shown, see SUBMENUS) or ``"docks"`` (the docks' own show/hide actions).
MENUS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("file", "&File", ("load", "new_chat", "-", "open", "menu:recent", "menu:autosave", "follow", "save", "export",
                       "back", "-", "screenshot", "-", "quit")),
    ("edit", "&Edit", ("copy_turns", "copy_layers", "copy_event", "-", "find", "find_next", "find_previous")),
    ("chat", "&Chat", ("send", "stop", "restart", "-", "focus_input")),
    ("view", "&View", (*(f"theme_{n}" for n in th.CHOICES), "-", "zoom_in", "zoom_out", "zoom_reset", "full_screen",
                       "-", "docks")),
    ("tools", "&Tools", ("compare",)),
    ("help", "&Help", ("policies", "about")),
)

#: The submenus filled each time they are shown: title, tip, and what fills them from the window.
SUBMENUS: dict[str, tuple[str, str, Callable]] = {
    "recent": ("Open &recent", "The traces opened or saved last, newest first",
               lambda m, w: fill_recent_menu(m, w.settings.recent_traces, w.open_trace, w.clear_recent_traces)),
    "autosave": ("Open auto&saved session", "Every session is written as it runs: after a crash, the last one is here",
                 lambda m, w: fill_autosave_menu(m, w.info.trace_path if w.info is not None else None, w.open_trace)),
}


def _shortcuts(spec: Action) -> list[QtGui.QKeySequence]:
    if spec.std is None:
        return [QtGui.QKeySequence(spec.keys)] if spec.keys else []
    keys = list(QtGui.QKeySequence.keyBindings(spec.std))  # the platform's own keys (all of them)
    if not keys and spec.keys:
        keys = [QtGui.QKeySequence(spec.keys)]
    if spec.also and QtGui.QKeySequence(spec.also) not in keys:
        keys.append(QtGui.QKeySequence(spec.also))
    return keys


def make_action(win, key: str) -> QtGui.QAction:
    """The QAction of ``ACTIONS[key]``, acting on ``win``."""
    spec = ACTIONS[key]
    a = QtGui.QAction(spec.text, win)
    a.setShortcuts(_shortcuts(spec))
    if spec.tip:
        a.setToolTip(spec.tip)
    a.setCheckable(spec.checkable)
    a.setEnabled(spec.enabled)
    if spec.role is not None:
        a.setMenuRole(spec.role)
    a.triggered.connect(lambda _checked=False, run=spec.run: run(win))
    return a


def build_menus(win, made: dict[str, QtGui.QAction], docks) -> tuple[dict[str, QtGui.QAction], dict[str, object]]:
    """File, Edit, Chat, View, Tools, Help on ``win``'s menu bar, from :data:`MENUS`; returns (actions, menus) by key.

    Every menu and item has a mnemonic (Alt+F, then the underlined letter); standard commands use
    ``QKeySequence.StandardKey``, so each platform gets its own keys (docs/gui.md lists them). ``made``: actions
    the window already made (the toolbar's Load), placed here too.
    """
    actions: dict[str, QtGui.QAction] = dict(made)
    menus: dict[str, object] = {}
    themes = QtGui.QActionGroup(win)
    for key, title, items in MENUS:
        m = menus[key] = win.menuBar().addMenu(title)
        for item in items:
            if item == "-":
                m.addSeparator()
            elif item == "docks":
                for d in docks:
                    m.addAction(d.toggleViewAction())
            elif item.startswith("menu:"):
                name = item[5:]
                sub_title, tip, _ = SUBMENUS[name]
                sub = menus[name] = m.addMenu(sub_title)
                sub.setToolTip(tip)
                sub.aboutToShow.connect(lambda name=name: fill_submenu(win, name))
            else:
                a = actions[item] if item in actions else make_action(win, item)
                actions[item] = a
                if item.startswith("theme_"):
                    themes.addAction(a)
                m.addAction(a)
    return actions, menus


def fill_submenu(win, key: str) -> list:
    """Fill ``win``'s submenu ``key`` of :data:`SUBMENUS` now, as when it is shown; returns its entries' actions."""
    return SUBMENUS[key][2](win.menus[key], win)


def fill_recent_menu(m, paths: list[str], open_trace: Callable[[str], object], clear: Callable[[], object]) -> list:
    """File → Open recent: the remembered traces (``settings.recent_traces``) that still exist."""
    from pathlib import Path

    from kvinspect.gui.panels import model_line

    m.clear()
    actions = []
    for p in paths:
        if not Path(p).exists():
            continue  # moved or deleted since: not offered (kept in the list in case a drive comes back)
        shown = model_line.elide(p).replace("&", "&&")  # a literal & in a path, not a mnemonic
        label = f"&{len(actions) + 1} {shown}" if len(actions) < 9 else shown
        a = m.addAction(label, lambda p=p: open_trace(p))
        a.setToolTip(p)
        actions.append(a)
    if not actions:
        m.addAction("(no recent trace)").setEnabled(False)
    else:
        m.addSeparator()
        m.addAction("&Clear the list", clear)
    return actions


def fill_autosave_menu(m, own: str | None, open_trace: Callable[[str], object], limit: int = 15) -> list:
    """The newest autosaved sessions (``core.autosave``), each opening read-only; returns the actions.

    ``own``: this window's autosave, marked "this session"."""
    from datetime import datetime

    from kvinspect.core.trace.autosave import list_autosaves
    from kvinspect.core.units import fmt_bytes

    m.clear()
    actions = []
    for a in list_autosaves()[:limit]:
        state = "this session" if own and str(a.path) == own else (
            "closed" if a.closed else "not closed: crashed, killed or still running")
        label = f"{datetime.fromtimestamp(a.mtime):%Y-%m-%d %H:%M} · {a.name} · {fmt_bytes(a.size)} · {state}"
        actions.append(m.addAction(label, lambda p=str(a.path): open_trace(p)))
    if not actions:
        m.addAction("(no autosaved session yet)").setEnabled(False)
    return actions
