"""Bootstrap: make the QApplication, build the main window, run it."""

from __future__ import annotations

import sys

# PySide6 before pyqtgraph, so pyqtgraph binds to it rather than to a PyQt that may be installed.
from PySide6 import QtCore, QtGui, QtWidgets  # noqa: I001

from .. import __version__
from .resources import app_icon


def create(exec_app: bool = False, **window_kwargs):
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    app.setApplicationName("kvinspect")
    app.setOrganizationName("kvinspect")
    app.setApplicationVersion(__version__)
    app.setWindowIcon(app_icon())
    from .main_window import MainWindow

    win = MainWindow(**window_kwargs)
    win.show()
    if exec_app:
        app.exec()
    return app, win


def run_from_args(args) -> int:
    app, win = create(exec_app=False, args=args)
    return app.exec()


def main() -> int:
    from ..cli import main as cli_main

    return cli_main(["gui", *sys.argv[1:]])
