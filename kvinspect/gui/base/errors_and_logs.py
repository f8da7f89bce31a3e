"""Errors and logs for the window: never a silent crash, never a traceback for a user's mistake.

* :class:`ErrorReporter` shows one-line messages in non-modal dialogs (the window keeps
  running, and tests are never blocked by a modal ``exec()``); in scripted runs with
  ``--exit-when-done`` it prints ``kvinspect: error: …`` instead.
* :func:`install_excepthook` routes uncaught exceptions (GUI thread and Python threads) to
  the log with their traceback and to a dialog, instead of letting PySide abort.
* :func:`configure_logging` adds a rotating log file in the user data folder (not when
  ``KVINSPECT_EPHEMERAL`` is set, as in the tests) and routes Qt's own messages into Python logging.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import threading
import traceback

from PySide6 import QtCore, QtWidgets

from kvinspect.core.errors import exc_line
from kvinspect.core.paths import data_dir, ephemeral

log = logging.getLogger("kvinspect.gui")

_QT_NOISE = ("propagateSizeHints", "QFont::setPointSizeF", "XDG_RUNTIME_DIR")


def log_path():
    return data_dir() / "logs" / "kvinspect.log"


def configure_logging() -> str | None:
    """Add the rotating log file (unless :func:`~kvinspect.core.paths.ephemeral`) and the Qt message handler.

    Returns the file.
    """
    root = logging.getLogger()
    path = None
    if not ephemeral() and not any(getattr(h, "_kvinspect", False) for h in root.handlers):
        try:
            p = log_path()
            p.parent.mkdir(parents=True, exist_ok=True)
            h = _FallbackFileHandler(p, maxBytes=2_000_000, backupCount=3, encoding="utf-8")
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            h.setLevel(logging.INFO)
            h._kvinspect = True
            root.addHandler(h)
            if root.level > logging.INFO or root.level == logging.NOTSET:
                # The file wants INFO; stderr handlers keep their own (higher) level.
                for other in root.handlers:
                    if other is not h and other.level == logging.NOTSET:
                        other.setLevel(root.level or logging.WARNING)
                root.setLevel(logging.INFO)
            path = str(p)
        except OSError as exc:
            log.warning("no log file: %s", exc)
    QtCore.qInstallMessageHandler(_qt_message)
    return path


class _FallbackFileHandler(logging.handlers.RotatingFileHandler):
    """The log file; when it cannot be written (a full disk), one line on stderr and stderr from then on.

    The default ``handleError`` prints a traceback for every record that fails.
    """

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        import sys

        exc = sys.exc_info()[1]
        root = logging.getLogger()
        root.removeHandler(self)
        why = getattr(exc, "strerror", None) or (exc_line(exc) if exc is not None else "write failed")
        print(f"kvinspect: the log file {self.baseFilename} cannot be written ({why}); logging to stderr",
              file=sys.stderr, flush=True)
        if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
                   for h in root.handlers):
            fallback = logging.StreamHandler()
            fallback.setLevel(logging.WARNING)
            fallback.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            root.addHandler(fallback)
        try:
            self.close()
        except OSError:
            pass


def _qt_message(mode, context, message: str) -> None:
    if any(n in message for n in _QT_NOISE):
        return
    level = {QtCore.QtMsgType.QtDebugMsg: logging.DEBUG, QtCore.QtMsgType.QtInfoMsg: logging.INFO,
             QtCore.QtMsgType.QtWarningMsg: logging.WARNING}.get(mode, logging.ERROR)
    logging.getLogger("qt").log(level, "%s", message)


class ErrorReporter(QtCore.QObject):
    """Shows errors without blocking. ``interactive=False`` prints them (scripted runs)."""

    shown = QtCore.Signal(str, str)  # title, message

    def __init__(self, parent_window: QtWidgets.QWidget | None = None):
        super().__init__(parent_window)
        self.window = parent_window
        self.interactive = True
        self.messages: list[str] = []
        self.boxes: list[QtWidgets.QMessageBox] = []

    def report(self, title: str, message: str, details: str | None = None) -> None:
        message = " ".join(str(message).split("\n")).strip() or title
        self.messages.append(message)
        if not self.interactive:
            print(f"kvinspect: error: {message}", file=sys.stderr, flush=True)
            self.shown.emit(title, message)
            return
        if any(b.isVisible() and b.text() == message for b in self.boxes):
            return  # the same message is already on screen
        box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Icon.Warning, title, message,
                                    QtWidgets.QMessageBox.StandardButton.Ok, self.window)
        box.setWindowModality(QtCore.Qt.WindowModality.NonModal)
        box.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        if details:
            box.setDetailedText(details)
        box.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda *_: self.boxes.remove(box) if box in self.boxes else None)
        self.boxes.append(box)
        box.show()
        self.shown.emit(title, message)

    @QtCore.Slot()
    def report_later(self) -> None:
        """Show what other threads queued in ``_pending`` (dialogs only on the GUI thread)."""
        while _pending:
            msg, text = _pending.pop(0)
            self.report("kvinspect: unexpected error", msg, details=text)

    def close_all(self) -> None:
        for b in list(self.boxes):
            b.close()
        self.boxes.clear()


_reporter: ErrorReporter | None = None


def install_excepthook(reporter: ErrorReporter) -> None:
    """Uncaught exceptions: logged with traceback, shown as one line; the window keeps running."""
    global _reporter
    _reporter = reporter
    sys.excepthook = _hook
    threading.excepthook = lambda args: _hook(args.exc_type, args.exc_value, args.exc_traceback)


def _hook(exc_type, exc, tb) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        QtWidgets.QApplication.quit()
        return
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    log.error("uncaught exception:\n%s", text)
    msg = f"Unexpected error: {exc_line(exc) if exc is not None else exc_type.__name__}. The window keeps running"
    msg += "." if ephemeral() else f"; details are in {log_path()}."
    app = QtWidgets.QApplication.instance()
    if _reporter is None or app is None:
        sys.__excepthook__(exc_type, exc, tb)
    elif QtCore.QThread.currentThread() is app.thread():
        _reporter.report("kvinspect: unexpected error", msg, details=text)
    else:  # another thread: the dialog is made on the GUI thread
        _pending.append((msg, text))
        QtCore.QMetaObject.invokeMethod(_reporter, "report_later", QtCore.Qt.ConnectionType.QueuedConnection)


_pending: list[tuple[str, str]] = []

