"""The main window (foundation stub; the inspector panels come with the window issue)."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets


class MainWindow(QtWidgets.QMainWindow):
    def __init__(self, args=None, parent=None):
        super().__init__(parent)
        self.setWindowTitle("kvinspect")
        self.resize(1200, 760)
        label = QtWidgets.QLabel("kvinspect: load a model to inspect its KV cache")
        label.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
        self.setCentralWidget(label)
