"""Headless plot images for reports and comparisons, rendered by the GUI's own plotting code.

The core and the CLI never import Qt (a test enforces it), so images are made in a child
process: ``python -m kvinspect.gui.render KIND INPUT OUTDIR`` on Qt's offscreen platform.
Each KIND is a module ``kvinspect.gui.render_<kind>`` with ``render(input_path, out_dir,
formats) -> (files, notes)``. Where Qt or pyqtgraph is missing (a GPU server without the GUI
stack), the images are skipped with a note instead of failing the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PlotResult:
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def render(kind: str, input_path: str | os.PathLike, out_dir: str | os.PathLike,
           formats: tuple[str, ...] = ("png", "svg"), timeout: float = 180.0) -> PlotResult:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["QT_QPA_PLATFORM"] = "offscreen"
    cmd = [sys.executable, "-m", "kvinspect.gui.render", kind, str(input_path), str(out), ",".join(formats)]
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
