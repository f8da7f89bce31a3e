"""A lane's legend as one scene item: every entry's sample and label painted in one call.

pyqtgraph's ``LegendItem`` is a grid layout of two scene items per entry (a sample and a
``LabelItem`` holding a text item): about 60 items across the two lanes, each a cached blit
on every frame, ~10 % of a live frame (docs/redraw.md). This item keeps that look, the same
grid (9-px margins, 20-px samples, the spacings the lanes asked for) with each label's size
measured as pyqtgraph's text item measures it, but it is one pixmap, repainted only when an
entry, a pen, a visibility or the theme changes.

Clicking a sample hides or shows its curve, and dragging moves the legend, as pyqtgraph's did.
"""

from __future__ import annotations

import pyqtgraph as pg
from pyqtgraph.icons import invisibleEye
from PySide6 import QtCore, QtGui

from kvinspect.gui.graphics.view_span import CACHE

MARGIN = 9  # QGraphicsGridLayout's default contents margins, which pyqtgraph's legend kept
SAMPLE = 20
TEXT_MARGIN = 4  # QTextDocument's margin around a LabelItem's text


class _Entry:
    __slots__ = ("item", "name", "text", "size")

    def __init__(self, item, name: str, text: QtGui.QStaticText, size: QtCore.QSizeF):
        self.item, self.name, self.text, self.size = item, name, text, size


class LaneLegend(pg.GraphicsObject):
    """Entries (a curve and its name) in rows of ``columns``, anchored at ``offset`` in ``plot``'s view box."""

    def __init__(self, plot: pg.PlotItem, offset=(4, 2), columns: int = 6, text_pt: float = 8.0,
                 hor_spacing: float = 14, ver_spacing: float = -6):
        super().__init__()
        self.columns, self.hspace, self.vspace = max(int(columns), 1), float(hor_spacing), float(ver_spacing)
        self._font = QtGui.QFont()
        self._font.setPointSizeF(text_pt)
        self._text_color = pg.mkColor(pg.getConfigOption("foreground"))
        self._brush = QtGui.QBrush(QtCore.Qt.BrushStyle.NoBrush)
        self.entries: list[_Entry] = []
        self._samples: list[QtCore.QRectF] = []  # each entry's sample box, in item coordinates
        self._labels: list[QtCore.QPointF] = []  # each entry's text origin
        self._bounds = QtCore.QRectF()
        self.setParentItem(plot.getViewBox())  # not its child group: the view's range does not move it
        self.setPos(*offset)
        self.setFlag(self.GraphicsItemFlag.ItemIgnoresTransformations)
        self.setCacheMode(CACHE)

    # -- entries --------------------------------------------------------------------------
    def addItem(self, item, name: str) -> None:
        doc = QtGui.QTextDocument()  # what LabelItem's text item lays out: its size is the cell's
        doc.setDefaultFont(self._font)
        doc.setDocumentMargin(TEXT_MARGIN)
        doc.setPlainText(name)
        text = QtGui.QStaticText(name)
        text.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        text.prepare(QtGui.QTransform(), self._font)
        self.entries.append(_Entry(item, name, text, QtCore.QSizeF(doc.idealWidth(),  # (margins included)
                                                                    doc.size().height())))
        for signal in self._signals(item):
            signal.connect(self.update)
        self._layout()

    def removeItem(self, item_or_name) -> None:
        """Remove the first entry for that item (or with that name); nothing when there is none."""
        for i, e in enumerate(self.entries):
            if e.item is item_or_name or e.name == item_or_name:
                for signal in self._signals(e.item):
                    try:
                        signal.disconnect(self.update)
                    except (RuntimeError, TypeError):  # (never connected: PySide raises either)
                        pass
                del self.entries[i]
                self._layout()
                return

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @staticmethod
    def _signals(item) -> list:
        """What repaints an entry: its curve's visibility and pen (``Curve.sigStyleChanged``)."""
        return [s for s in (getattr(item, "visibleChanged", None), getattr(item, "sigStyleChanged", None)) if s is not None]

    def set_style(self, text_color, brush) -> None:
        """Label colour and the background (see-through, so what passes under stays visible)."""
        self._text_color = pg.mkColor(text_color)
        self._brush = pg.mkBrush(brush)
        self.update()

    # -- layout ---------------------------------------------------------------------------
    def _layout(self) -> None:
        """pyqtgraph's grid: rows of ``columns`` (sample, label) cells; a label column is as wide as
        its widest label; rows as tall as their tallest cell; the box is the grid plus margins."""
        n = len(self.entries)
        self.prepareGeometryChange()
        self._samples, self._labels = [], []
        if not n:
            self._bounds = QtCore.QRectF()
            self.update()
            return
        cols = min(n, self.columns)
        rows = [self.entries[r: r + cols] for r in range(0, n, cols)]
        widths = [max(row[c].size.width() for row in rows if c < len(row)) for c in range(cols)]
        heights = [max([SAMPLE] + [e.size.height() for e in row]) for row in rows]
        y = float(MARGIN)
        for row, h in zip(rows, heights):
            x = float(MARGIN)
            for c, e in enumerate(row):
                self._samples.append(QtCore.QRectF(x, y + (h - SAMPLE) / 2, SAMPLE, SAMPLE))
                x += SAMPLE + self.hspace
                self._labels.append(QtCore.QPointF(x + TEXT_MARGIN, y + (h - e.size.height()) / 2 + TEXT_MARGIN))
                x += widths[c] + self.hspace
            y += h + self.vspace
        width = 2 * MARGIN + cols * SAMPLE + sum(widths) + (2 * cols - 1) * self.hspace
        height = 2 * MARGIN + sum(heights) + (len(rows) - 1) * self.vspace
        self._bounds = QtCore.QRectF(0, 0, width, height)
        self.update()

    def boundingRect(self) -> QtCore.QRectF:
        return QtCore.QRectF(self._bounds)

    def sample_rect(self, name: str) -> QtCore.QRectF | None:
        """Where an entry's sample is drawn (item coordinates), None when there is no such entry."""
        for e, r in zip(self.entries, self._samples):
            if e.name == name:
                return QtCore.QRectF(r)
        return None

    # -- painting -------------------------------------------------------------------------
    def paint(self, p, *args) -> None:
        if not self.entries:
            return
        p.setPen(QtCore.Qt.PenStyle.NoPen)
        p.setBrush(self._brush)
        p.drawRect(self._bounds)
        for e, box in zip(self.entries, self._samples):
            self._paint_sample(p, e.item, box)
        p.setFont(self._font)
        p.setPen(self._text_color)
        for e, at in zip(self.entries, self._labels):
            p.drawStaticText(at, e.text)

    @staticmethod
    def _paint_sample(p: QtGui.QPainter, item, box: QtCore.QRectF) -> None:
        """What pyqtgraph's ItemSample draws: the pen across the box, a filled corner for a fill,
        and a crossed-out eye for a hidden curve."""
        x, y = box.x(), box.y()
        if not item.isVisible():
            p.drawPixmap(QtCore.QPointF(x + 1, y + 1), invisibleEye.qicon.pixmap(18, 18))
            return
        opts = getattr(item, "opts", {})
        p.setPen(pg.mkPen(opts.get("pen")))
        p.drawLine(QtCore.QPointF(x, y + 11), QtCore.QPointF(x + SAMPLE, y + 11))
        if opts.get("fillLevel") is not None and opts.get("fillBrush") is not None:
            p.setBrush(pg.mkBrush(opts["fillBrush"]))
            p.drawPolygon(QtGui.QPolygonF([QtCore.QPointF(x + 2, y + 18), QtCore.QPointF(x + 18, y + 2),
                                           QtCore.QPointF(x + 18, y + 18)]))
            p.setBrush(QtCore.Qt.BrushStyle.NoBrush)

    # -- mouse: as pyqtgraph's legend ---------------------------------------------------------
    def mouseClickEvent(self, ev) -> None:
        if ev.button() != QtCore.Qt.MouseButton.LeftButton:
            return
        for e, box in zip(self.entries, self._samples):
            if box.contains(ev.pos()):
                e.item.setVisible(not e.item.isVisible())
                ev.accept()
                self.update()
                return

    def hoverEvent(self, ev) -> None:
        ev.acceptDrags(QtCore.Qt.MouseButton.LeftButton)

    def mouseDragEvent(self, ev) -> None:
        if ev.button() == QtCore.Qt.MouseButton.LeftButton:
            ev.accept()
            self.setPos(self.pos() + ev.pos() - ev.lastPos())
