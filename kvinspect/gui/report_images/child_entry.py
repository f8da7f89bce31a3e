"""Child-process entry for headless images: ``python -m kvinspect.gui.report_images.child_entry KIND INPUT OUTDIR FORMATS``.

``KIND`` may name several renderers joined by ``+`` (``trace+tokens``): one child, one Qt start-up,
for all the images of a bundle.

Prints one JSON line ``{"files": [...], "notes": [...]}``; started by :func:`kvinspect.child_render.render_in_child`
(the renderer the CLI and the window give the report writers, see kvinspect.core.report.renderer).
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
    files: list = []
    notes: list = []
    for one in kind.split("+"):
        mod = importlib.import_module(f"kvinspect.gui.report_images.{one}_figures")
        f, n = mod.render(input_path, out_dir, formats)
        files += f
        notes += n
    print(json.dumps({"files": [str(f) for f in files], "notes": list(notes)}))
    del app
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
