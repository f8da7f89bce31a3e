"""Child-process entry for headless images: ``python -m kvinspect.gui.render KIND INPUT OUTDIR FORMATS``.

Prints one JSON line ``{"files": [...], "notes": [...]}``; started by :func:`kvinspect.child_render.render_in_child`
(the renderer the CLI and the window give the report writers, see kvinspect.core.report.plots).
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    kind, input_path, out_dir = argv[:3]
    formats = tuple(f for f in (argv[3] if len(argv) > 3 else "png").split(",") if f)
    from PySide6 import QtWidgets  # noqa: F401  (binding first, then pyqtgraph)

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    mod = importlib.import_module(f"kvinspect.gui.render_{kind}")
    files, notes = mod.render(input_path, out_dir, formats)
    print(json.dumps({"files": [str(f) for f in files], "notes": list(notes)}))
    del app
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
