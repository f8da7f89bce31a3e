"""What the window tests share: drive a window as a user would, open a trace, write one headless, start the CLI.

Fixtures live in tests/gui/conftest.py (the window, the engine fork server); these are plain functions.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests import helpers as shared
from tests.helpers import ROOT, cli_env

LOAD_TIMEOUT_MS = 120_000
TURN_TIMEOUT_MS = 120_000


def load(qtbot, win, spec: str, **kw):
    """Load ``spec`` through the window (the real engine path) and return the ModelInfo."""
    with qtbot.waitSignal(win.controller.modelLoaded, timeout=LOAD_TIMEOUT_MS) as blocker:
        assert win.load(spec, device="cpu", **kw)
    return blocker.args[0]


def send(qtbot, win, text: str, max_new_tokens: int | None = None, policy: str | None = None, timeout=TURN_TIMEOUT_MS):
    """Type ``text`` into the input box and press Enter, as a user would; return the TurnRecord."""
    from PySide6 import QtCore

    chat = win.chat
    if max_new_tokens is not None:
        chat.max_new.setValue(max_new_tokens)
    if policy is not None:
        chat.set_choice(chat.policy, policy)
    chat.input.setPlainText(text)
    with qtbot.waitSignal(win.controller.turnFinished, timeout=timeout) as blocker:
        qtbot.keyClick(chat.input, QtCore.Qt.Key.Key_Return)
    return blocker.args[0]


def open_trace(qtbot, win, path, timeout=60_000) -> None:
    """Open a trace file or run folder in the window (read off the GUI thread) and wait until it is drawn."""
    with qtbot.waitSignal(win.viewer.opened, timeout=timeout):
        assert win.open_trace(str(path)) is not None
    win.refresh(force=True)


def headless_run(out: Path, spec: str, turns: list[str], max_new_tokens: int) -> Path:
    """A chat script run headless (``kvinspect run``'s core) on ``spec`` into ``out``; returns ``out``."""
    from kvinspect.core.session.runner import run_script
    from kvinspect.core.session.script import ChatScript, GenerationSettings
    from tests.conftest import load_cached

    run_script(load_cached(spec), ChatScript(turns=turns, settings=GenerationSettings(max_new_tokens=max_new_tokens)),
               out)
    return out


def run_cli(args: list[str], tmp_path: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``python -m kvinspect ARGS`` to its end, in its own config and data folders, from the repository root."""
    return shared.run_cli(args, cwd=ROOT, timeout=timeout, env=cli_env(tmp_path, **env))


def plots_showing(qtbot, rec, size: tuple[int, int] = (1000, 600), theme=None):
    """A new plots widget of ``size`` (the redraw benchmark's by default), in ``theme`` if given,
    shown and exposed, that has drawn ``rec``."""
    from kvinspect.gui.lanes.lanes_widget import PlotsWidget

    w = PlotsWidget()
    qtbot.addWidget(w)
    w.resize(*size)
    if theme is not None:
        w.apply_theme(theme)
    w.show()
    qtbot.waitExposed(w)
    w.render(rec, force=True)
    return w


def show_panel(qtbot, win, dock) -> None:
    """Raise ``dock``'s tab, as a user would to read it, and wait until its panel has rendered the record.

    A panel behind another tab costs nothing: it is rendered when shown, at the window's next paint.
    """
    from kvinspect.gui.base.paint_clock import on_screen

    dock.raise_()
    panel = dock.widget()
    qtbot.waitUntil(lambda: on_screen(panel), timeout=5000)
    win.clock.flush()
    qtbot.waitUntil(lambda: panel not in win._stale, timeout=5000)
