"""Edit → Find (the platform's Find key): a search box for the conversation, in the model toolbar."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets


class FindBox(QtWidgets.QLineEdit):
    """Enter finds the next match; Esc hides the box (before the window's Esc = Stop generating sees it)."""

    dismissed = QtCore.Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setPlaceholderText("find in the conversation")
        self.setClearButtonEnabled(True)
        self.setMaximumWidth(260)

    def event(self, e: QtCore.QEvent) -> bool:
        if e.type() == QtCore.QEvent.Type.ShortcutOverride and e.key() == QtCore.Qt.Key.Key_Escape:
            e.accept()  # Esc is this box's own here, not the window's shortcut
            return True
        return super().event(e)

    def keyPressEvent(self, e: QtGui.QKeyEvent) -> None:
        if e.key() == QtCore.Qt.Key.Key_Escape:
            self.dismissed.emit()
            return
        super().keyPressEvent(e)


def find_in(view: QtWidgets.QTextBrowser, text: str, back: bool = False) -> bool:
    """Select the next (``back``: previous) ``text`` in ``view``, wrapping around once; False if absent."""
    if not text:
        return False
    flags = QtGui.QTextDocument.FindFlag.FindBackward if back else QtGui.QTextDocument.FindFlag(0)
    if view.find(text, flags):
        return True
    cur = view.textCursor()
    cur.movePosition(QtGui.QTextCursor.MoveOperation.End if back else QtGui.QTextCursor.MoveOperation.Start)
    view.setTextCursor(cur)
    return view.find(text, flags)
