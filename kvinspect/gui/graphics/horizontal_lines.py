"""Horizontal lines in a lane's view box (a window's size in the tokens lane), drawn as one item."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from kvinspect.gui.graphics.view_span import ViewSpan


class HLinesItem(ViewSpan):
    """Horizontal reference lines across the view, each labelled just above its left end.

    The tokens lane's window sizes. pyqtgraph's ``InfiniteLine`` with a label recomputes its
    bounds and re-places the label's text item on every view change: one such line was
    0.4–0.8 ms of a zoom's frame (docs/redraw.md). Lines and labels are drawn here in device
    pixels, as pyqtgraph drew them: the pen's dashes at its width, from the right edge; the
    text in the default font 2 % of the width in.
    """

    LABEL_AT = 0.02  # of the view's width
    TEXT_MARGIN = 4  # QGraphicsTextItem's document margin, kept so labels sit where they did

    def __init__(self):
        super().__init__()
        self._lines: list[tuple[float, float, QtGui.QPen, QtGui.QColor, QtGui.QStaticText, float]] = []
        self._font = QtGui.QFont()
        self._metrics = QtGui.QFontMetricsF(self._font)

    def set_lines(self, lines: list[tuple[float, str, str, float, QtCore.Qt.PenStyle]]) -> None:
        """``(y, colour, label, pen width, pen style)`` per line."""
        self._lines = []
        for y, color, label, width, style in lines:
            pen = QtGui.QPen(pg.mkColor(color))
            pen.setStyle(style)
            if style not in (QtCore.Qt.PenStyle.SolidLine, QtCore.Qt.PenStyle.NoPen):
                # One device pixel wide (a thin line takes Qt's fast path), dashes as long as at ``width``.
                pen.setDashPattern([v * width for v in pen.dashPattern()])
            pen.setWidthF(1.0)
            pen.setCosmetic(True)
            text = QtGui.QStaticText(label)
            text.setTextFormat(QtCore.Qt.TextFormat.PlainText)
            text.prepare(QtGui.QTransform(), self._font)
            self._lines.append((float(y), float(width), pen, pg.mkColor(color), text, self._metrics.height()))
        self.update()

    def labels(self) -> list[str]:
        return [t.text() for *_, t, _ in self._lines]

    def paint(self, p, *args) -> None:
        if not self._lines:
            return
        t = p.transform()
        dev = t.mapRect(self.boundingRect())
        p.save()
        p.resetTransform()
        p.setFont(self._font)
        for y, width, pen, color, text, text_h in self._lines:
            py = t.map(QtCore.QPointF(0.0, y)).y()
            if not dev.top() - 1 <= py <= dev.bottom() + 1:
                continue
            p.setPen(pen)
            # The rows a ``width``-px band around the line covers (pixel centres inside it), as
            # Qt fills a wide line without antialiasing: one or two 1-px lines.
            for k in range(math.ceil(py - width / 2 - 0.5), math.floor(py + width / 2 - 0.5) + 1):
                p.drawLine(QtCore.QPointF(dev.right(), k + 0.5), QtCore.QPointF(dev.left(), k + 0.5))
            p.setPen(color)
            x = dev.left() + self.LABEL_AT * dev.width() + self.TEXT_MARGIN
            p.drawStaticText(QtCore.QPointF(x, py - self.TEXT_MARGIN - text_h), text)
        p.restore()
