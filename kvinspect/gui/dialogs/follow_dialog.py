"""File → Follow trace…: a trace file or a folder, which may not exist yet (a synced or mounted folder)."""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from kvinspect.gui.base.accessibility import fill_missing, name


class FollowDialog(QtWidgets.QDialog):
    """Non-modal; ``followRequested(path)`` when the user presses Follow."""

    followRequested = QtCore.Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Follow a trace")
        self.setModal(False)
        self.setMinimumWidth(560)
        intro = QtWidgets.QLabel(
            "Watch a trace while another program writes it: <tt>kvinspect trace --out DIR -- python "
            "script.py</tt>, <tt>kvinspect.observe(model, trace=DIR)</tt>, <tt>kvinspect run --out DIR</tt>, "
            "or another window's autosave. The folder may be on another machine (synced or mounted). Given a "
            "folder, the newest <tt>trace*.jsonl</tt> in it is followed, and a newer one that appears later "
            "is switched to.")
        intro.setWordWrap(True)
        self.path = QtWidgets.QLineEdit()
        self.path.setPlaceholderText("a trace .jsonl file, or the folder it is (or will be) written to")
        label = QtWidgets.QLabel("&Trace")
        label.setBuddy(self.path)
        file_button = QtWidgets.QPushButton("&File…")
        file_button.clicked.connect(self._pick_file)
        dir_button = QtWidgets.QPushButton("F&older…")
        dir_button.clicked.connect(self._pick_dir)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(label)
        row.addWidget(self.path, 1)
        row.addWidget(file_button)
        row.addWidget(dir_button)
        buttons = QtWidgets.QDialogButtonBox()
        self.follow_button = buttons.addButton("Fo&llow", QtWidgets.QDialogButtonBox.ButtonRole.AcceptRole)
        cancel = buttons.addButton(QtWidgets.QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._on_follow)
        buttons.rejected.connect(self.close)
        box = QtWidgets.QVBoxLayout(self)
        box.addWidget(intro)
        box.addLayout(row)
        box.addWidget(buttons)
        name(self.path, "Trace to follow", "A trace .jsonl file, or the folder it is (or will be) written to; "
             "given a folder, its newest trace*.jsonl is followed")
        name(file_button, "Choose a trace file", "Pick the trace .jsonl file to follow")
        name(dir_button, "Choose a folder", "Pick the folder a trace is (or will be) written to")
        name(self.follow_button, "Follow", "Start following the trace; the window shows it as it grows")
        self.setAccessibleName("Follow a trace")
        self.setAccessibleDescription("Watch a trace while another program writes it")
        name(cancel, "Cancel", "Close the dialog without following")
        fill_missing(self)  # a control added later is never silent

    def _pick_file(self) -> None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Trace to follow", self._start(),
                                                        "kvinspect traces (*.jsonl);;All files (*)")
        if path:
            self.path.setText(path)

    def _pick_dir(self) -> None:
        path = QtWidgets.QFileDialog.getExistingDirectory(self, "Folder to follow", self._start())
        if path:
            self.path.setText(path)

    def _start(self) -> str:
        text = self.path.text().strip()
        return str(Path(text).parent) if text else str(Path.cwd())

    def _on_follow(self) -> None:
        text = self.path.text().strip()
        if text:
            self.close()
            self.followRequested.emit(text)
