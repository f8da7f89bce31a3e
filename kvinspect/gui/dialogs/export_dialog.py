"""File → Export report… (Ctrl+E): where, redact or not, with the window's screenshot or not.

Non-modal: the window keeps running (and tests never block on ``exec()``). The bundle is
written off the GUI thread (the window's ``export_report``, :func:`kvinspect.gui.base.save_export_copy.export_report`); when it is done the dialog
lists what was written and offers to open the folder.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6 import QtCore, QtWidgets

from kvinspect.core.errors import KvInspectError
from kvinspect.gui.base import save_export_copy
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.accessibility import fill_missing, name


class ExportDialog(QtWidgets.QDialog):
    """``finished_export(result)`` when the bundle is written; ``failed_export(message)`` otherwise."""

    finished_export = QtCore.Signal(object)  # core.report.ReportResult
    failed_export = QtCore.Signal(str)

    def __init__(self, win):
        super().__init__(win)
        self.win = win
        self.task = None
        self.result = None
        self.setWindowTitle("Export report")
        self.setModal(False)
        self.setWindowModality(QtCore.Qt.WindowModality.NonModal)
        self.setMinimumWidth(560)

        self.what = QtWidgets.QLabel()
        self.what.setWordWrap(True)
        self.folder = QtWidgets.QLineEdit()
        self.folder.setToolTip("A new or empty folder, or an earlier report bundle (which is replaced)")
        browse = QtWidgets.QPushButton("&Browse…")
        browse.clicked.connect(self._browse)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        self.redact = QtWidgets.QCheckBox("&Redact conversation text")
        self.redact.setToolTip("Prompts, replies and the system prompt become token counts in every file "
                               "(report, summary, trace); lengths, bytes, events and checklists are kept")
        self.screenshot = QtWidgets.QCheckBox("Include a &screenshot of the window (window.png)")
        self.screenshot.setChecked(True)
        self.plots = QtWidgets.QCheckBox("Render the &plots (cache.png, memory.png and SVG twins, tokens.png)")
        self.plots.setChecked(True)
        self.redact.toggled.connect(self._on_redact)

        form = QtWidgets.QFormLayout()
        form.addRow("Export", self.what)
        folder_label = QtWidgets.QLabel("&Folder")
        folder_label.setBuddy(self.folder)
        form.addRow(folder_label, row)
        form.addRow("", self.redact)
        form.addRow("", self.screenshot)
        form.addRow("", self.plots)

        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setVisible(False)
        self.status = QtWidgets.QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        self.export_button = QtWidgets.QPushButton("&Export")
        self.export_button.setDefault(True)
        self.export_button.clicked.connect(self.start)
        self.open_button = QtWidgets.QPushButton("Open folder")
        self.open_button.setVisible(False)
        self.open_button.clicked.connect(lambda: self.result and save_export_copy.open_folder(self.result.out_dir))
        close = QtWidgets.QPushButton("&Close")
        close.clicked.connect(self.close)
        buttons = QtWidgets.QHBoxLayout()
        buttons.addWidget(self.open_button)
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(close)

        box = QtWidgets.QVBoxLayout(self)
        box.addLayout(form)
        box.addWidget(self.progress)
        box.addWidget(self.status)
        box.addStretch(1)
        box.addLayout(buttons)

        name(self.folder, "Report folder", "Where the bundle is written: a new or empty folder, or an earlier "
             "report bundle (which is replaced)")
        name(browse, "Choose the report folder", "Pick the folder the report is written to")
        name(self.redact, "Redact conversation text", "Prompts, replies and the system prompt become token counts "
             "in every file; lengths, bytes, events and checklists are kept")
        name(self.screenshot, "Include a screenshot", "Add window.png, a screenshot of the window (off by default "
             "when redacting: it shows the conversation)")
        name(self.plots, "Render the plots", "Add cache.png, memory.png, their SVG twins and tokens.png")
        name(self.progress, "Export progress", "Shown while the report is written")
        name(self.export_button, "Export", "Write the report bundle into the folder")
        name(self.open_button, "Open folder", "Open the written report's folder in the file manager")
        name(close, "Close", "Close the dialog")
        self.setAccessibleName("Export report")
        self.setAccessibleDescription("Write a report bundle of what the window shows: report.md, summary, trace, "
                                      "plots")
        fill_missing(self)  # a control added later is never silent

    def prepare(self) -> bool:
        """Describe what will be exported and propose a folder; False (and a dialog) when nothing can be."""
        try:
            src = self.win.current_source()
        except KvInspectError as exc:
            self.win.errors.report("Export report", str(exc))
            return False
        rec = src.record
        self.what.setText(f"<b>{html.escape(src.label)}</b> · {len(rec.turns)} turns · {rec.n_steps:,} steps"
                          + (f" · {len(rec.notes)} damage note(s)" if rec.notes else ""))
        if not self.running:
            self.folder.setText(str(save_export_copy.default_report_dir(src.name)))
            self.status.clear()
            self.open_button.setVisible(False)
        return True

    @property
    def running(self) -> bool:
        return self.task is not None and self.task.running

    def start(self) -> bool:
        """Export now (the Export button); the window's screenshot is grabbed first, on this thread."""
        if self.running:
            return False
        path = self.folder.text().strip()
        if not path:
            self.status.setText("Give a folder for the report.")
            return False
        try:
            self.task = self.win.export_report(path, redact=self.redact.isChecked(),
                                               screenshot=self.screenshot.isChecked(), plots=self.plots.isChecked())
        except KvInspectError as exc:
            self.status.setText(html.escape(str(exc)))
            self.failed_export.emit(str(exc))
            return False
        self.task.done.connect(self._on_done)
        self.task.failed.connect(self._on_failed)
        self.export_button.setEnabled(False)
        self.open_button.setVisible(False)
        self.progress.setVisible(True)
        plots = " and rendering the plots…" if self.plots.isChecked() else "…"
        self.status.setText("Writing report.md, summary, trace" + plots)
        return True

    def _on_done(self, res) -> None:
        self.result = res
        self.progress.setVisible(False)
        self.export_button.setEnabled(True)
        names = ", ".join(p.name for p in res.files)
        notes = "".join(f"<br><i>{html.escape(n)}</i>" for n in res.notes)
        self.status.setText(f"Wrote <b>{html.escape(str(res.out_dir))}</b>:<br>{html.escape(names)}{notes}")
        self.open_button.setVisible(True)
        self.win.statusBar().showMessage(f"report written to {res.out_dir}", 8000)
        self.finished_export.emit(res)

    def _on_failed(self, message: str) -> None:
        self.progress.setVisible(False)
        self.export_button.setEnabled(True)
        self.status.setText(f"<span style='color:{th.STATUS_COLORS['fail']}'>{html.escape(message)}</span>")
        self.failed_export.emit(message)

    def _on_redact(self, on: bool) -> None:
        # A window screenshot shows the conversation: a redacted bundle should not carry it by default.
        if on:
            self.screenshot.setChecked(False)

    def _browse(self) -> None:
        start = str(Path(self.folder.text()).parent) if self.folder.text() else str(Path.home())
        path = QtWidgets.QFileDialog.getExistingDirectory(self, "Folder for the report", start)
        if path:
            p = Path(path)
            # A busy folder (not an earlier bundle) gets a new subfolder rather than a refusal.
            if any(c for c in p.iterdir() if not c.name.startswith(".")) and not (p / "report.md").is_file():
                p = p / Path(self.folder.text()).name if self.folder.text() else p / "kvinspect-report"
            self.folder.setText(str(p))
