"""A line of status-bar text (or any label that changes many times a second without laying the window out again.

A ``QLabel`` asks its layout for a new geometry on every ``setText``, even when its size stays the
same. In the status bar that lays out the status bar and then the main window (its docks' separators
and title bars repaint, and the Fusion style loads their icons again). At every paint of a stream
that was most of the window's own painting. :class:`StatusText` repaints only itself, and asks for
a new geometry only when a text is wider than any it showed before: it only widens, so the texts
beside it do not move back and forth as digits change.
"""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

MARGIN = 4  # px either side, as a QLabel in a status bar reads


class StatusText(QtWidgets.QWidget):
    """``text()`` / ``setText()`` like a ``QLabel``; one line, right-aligned unless ``align`` says."""

    def __init__(self, parent: QtWidgets.QWidget | None = None,
                 align: QtCore.Qt.AlignmentFlag = QtCore.Qt.AlignmentFlag.AlignRight, margin: int = MARGIN):
        super().__init__(parent)
        self._align = int(align | QtCore.Qt.AlignmentFlag.AlignVCenter)
        self._margin = margin
        self._text = ""
        self._width = 0  # the widest text shown so far, in px
        self.setSizePolicy(QtWidgets.QSizePolicy.Policy.Preferred, QtWidgets.QSizePolicy.Policy.Preferred)
        # Opaque: a new text repaints this widget, not the status bar and the main window behind it.
        self.setAttribute(QtCore.Qt.WidgetAttribute.WA_OpaquePaintEvent, True)

    def text(self) -> str:
        return self._text

    def setText(self, text: str) -> None:  # noqa: N802 - QLabel's name
        if text == self._text:
            return
        self._text = text
        self.setAccessibleName(text)
        width = self.fontMetrics().horizontalAdvance(text)
        if width > self._width:
            self._width = width
            self.updateGeometry()
        self.update()

    def fit(self) -> None:
        """Narrow to the text shown (it only widens otherwise): at rest, as a new label of that text would be."""
        width = self.fontMetrics().horizontalAdvance(self._text)
        if width != self._width:
            self._width = width
            self.updateGeometry()

    def sizeHint(self) -> QtCore.QSize:  # noqa: N802 - Qt's name
        fm = self.fontMetrics()
        return QtCore.QSize(self._width + 2 * self._margin, fm.height() + 2)

    def minimumSizeHint(self) -> QtCore.QSize:  # noqa: N802 - Qt's name
        return self.sizeHint()

    def changeEvent(self, e: QtCore.QEvent) -> None:  # noqa: N802 - Qt's name
        if e.type() == QtCore.QEvent.Type.FontChange:
            self._width = self.fontMetrics().horizontalAdvance(self._text)
            self.updateGeometry()
        super().changeEvent(e)

    def paintEvent(self, e: QtGui.QPaintEvent) -> None:  # noqa: N802 - Qt's name
        p = QtGui.QPainter(self)
        p.fillRect(e.rect(), self.palette().color(self.backgroundRole()))
        if not self._text:
            return
        p.setPen(self.palette().color(QtGui.QPalette.ColorRole.WindowText))
        p.drawText(self.rect().adjusted(self._margin, 0, -self._margin, 0), self._align, self._text)
