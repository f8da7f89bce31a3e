"""Help → About: versions of kvinspect, Python, Qt, torch and transformers, and the trace shown."""

from __future__ import annotations

import html

from PySide6 import QtCore, QtWidgets


def show_about(parent, trace_path: str | None = None) -> None:
    from kvinspect.core.env import versions

    v = versions()
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>&nbsp;{html.escape(str(val))}</td></tr>" for k, val in v.items())
    trace = f"<p>Trace of this session: <tt>{html.escape(trace_path)}</tt></p>" if trace_path else ""
    QtWidgets.QMessageBox.about(
        parent, "About kvinspect",
        f"<h3>kvinspect {html.escape(v.get('kvinspect', ''))}</h3><p>A live inspector for the KV cache of "
        f"Hugging Face transformers models.</p><table>{rows}<tr><td>Qt</td><td>&nbsp;{QtCore.qVersion()}</td></tr>"
        f"</table>{trace}")
