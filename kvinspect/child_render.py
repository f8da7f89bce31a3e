"""The renderer the CLI and the window hand to the core's report writers: a child process.

:func:`render_in_child` is a :class:`kvinspect.core.report.renderer.Renderer`. It runs
``python -m kvinspect.gui.report_images.child_entry KIND INPUT OUTDIR FORMATS`` on Qt's offscreen platform, so
that the caller never imports Qt (``kvinspect report`` and ``compare`` stay headless) and the
window's export, which runs off the GUI thread, never draws widgets there. Each KIND is a
module ``kvinspect.gui.report_images.<kind>_figures`` with ``render(input_path, out_dir, formats) -> (files,
notes)``; the child prints one JSON line with both. Where Qt or pyqtgraph is missing (a GPU
server without the GUI stack), or the child fails, the images are skipped with a note instead
of failing the report.

It lives outside :mod:`kvinspect.core` (which knows no GUI module), :mod:`kvinspect.commands`
(which the window never imports) and :mod:`kvinspect.gui` (which headless commands never import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvinspect.core.report.renderer import PlotResult

#: The child's entry module (``python -m``).
RENDER_MODULE = "kvinspect.gui.report_images.child_entry"


def render_in_child(kind: str, input_path: str | os.PathLike, out_dir: str | os.PathLike,
                    formats: tuple[str, ...] = ("png", "svg"), timeout: float = 180.0) -> PlotResult:
    """Render ``kind`` images of ``input_path`` into ``out_dir`` in a child process; never raises for the child."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["QT_QPA_PLATFORM"] = "offscreen"
    cmd = [sys.executable, "-m", RENDER_MODULE, kind, str(input_path), str(out), ",".join(formats)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return PlotResult(notes=[f"plots skipped: the renderer did not finish ({type(exc).__name__})"])
    last = (r.stdout.strip().splitlines() or [""])[-1]
    try:
        data = json.loads(last)
    except json.JSONDecodeError:
        err = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        why = err[-1] if err else f"renderer exited {r.returncode}"
        if "No module named 'PySide6'" in why or "No module named 'pyqtgraph'" in why:
            why = "PySide6/pyqtgraph are not installed here"
        return PlotResult(notes=[f"plots skipped: {why}"])
    return PlotResult(files=[Path(f) for f in data.get("files", [])], notes=list(data.get("notes", [])))
