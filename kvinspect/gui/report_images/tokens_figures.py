"""``tokens.png`` for a report bundle: the Tokens panel at a trace's last step, drawn offscreen.

Run by :mod:`kvinspect.gui.report_images.child_entry` in a child process (``KIND`` = ``tokens``), like the cache and
memory figures; a trace without ids (v1, or a redacted copy) gets a note instead of an image.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6 import QtWidgets

from kvinspect.core.trace.tracefile import read_trace
from kvinspect.gui.base import theme as th
from kvinspect.gui.panels.tokens_panel import TokensPanel

SIZE = (1400, 900)


def render(input_path: str | os.PathLike, out_dir: str | os.PathLike,
           formats: tuple[str, ...] = ("png",)) -> tuple[list[Path], list[str]]:
    record = read_trace(input_path)
    app = QtWidgets.QApplication.instance()
    assert isinstance(app, QtWidgets.QApplication)
    before = app.palette()
    th.apply_palette(app, th.REPORT)  # report figures are drawn on white
    try:
        return _render(record, Path(out_dir))
    finally:
        app.setPalette(before)


def _render(record, out: Path) -> tuple[list[Path], list[str]]:
    out.mkdir(parents=True, exist_ok=True)
    panel = TokensPanel()
    panel.resize(*SIZE)
    panel.show()
    QtWidgets.QApplication.processEvents()
    panel.render(record)
    QtWidgets.QApplication.processEvents()
    if panel.view is None or not len(panel.view):
        why = panel.view.note if panel.view is not None and panel.view.note else "no tokens"
        return [], [f"tokens.png skipped: {why}"]
    path = out / "tokens.png"
    if not panel.grab().save(str(path)):
        return [], ["tokens.png skipped: the image could not be written"]
    panel.close()
    return [path], []
