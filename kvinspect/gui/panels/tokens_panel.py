"""The Tokens dock: the conversation as its tokens, each one's background saying where it stands.

Renders from ``(record, step)`` like every panel, through :func:`kvinspect.core.tokens.states.token_view`
(numpy over the record; no per-token-per-layer work). The canvas lays the cells out like
wrapped text once per (view, width): widths come from one font-metrics call per distinct
piece, line breaks from ``searchsorted`` over the cumulative widths. Painting touches only
the rows in the viewport, so 100k tokens paint as fast as 100 (``benchmarks/tokens_view.py``).
Under each token a thin band per layer group (kind and window) is filled where that group
still holds the position, with a bracket where its span begins and ends.
"""

from __future__ import annotations

import html

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.tokens.states import (
    CROPPED,
    DUPLICATE,
    DUPLICATED,
    EVICTED,
    GENERATED,
    HELD,
    NOT_CACHED,
    PENDING,
    REPLACEMENT,
    STATE_TEXT,
    WINDOWED_OUT,
    TokenView,
    token_view,
)
from kvinspect.core.tokens.text import display_piece, ranges
from kvinspect.gui.base import theme as th

#: Backgrounds per state: meaning colours at an alpha that keeps the theme's text readable on both.
STATE_COLORS = {
    HELD: ("#2DA44E", 90),
    WINDOWED_OUT: ("#F28C28", 110),
    EVICTED: ("#8A8F98", 120),
    NOT_CACHED: ("#E5484D", 95),
    CROPPED: ("#8A8F98", 0),
    PENDING: ("#3D9BE9", 0),
}
DUP_COLOR = "#FF6FB5"
REPLACEMENT_COLOR = "#3DC2EC"
LABEL_COLOR = "#E3A008"
PAD = 3  # pixels around a piece
GAP = 1  # between cells
BAND_H = 3


def _color(hexa: str, alpha: int = 255) -> QtGui.QColor:
    c = QtGui.QColor(hexa)
    c.setAlpha(alpha)
    return c


class TokenCanvas(QtWidgets.QAbstractScrollArea):
    """The wrapped cells of one :class:`TokenView`; draws only the rows in view."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.view: TokenView | None = None
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._font = QtGui.QFont(self.font())
        self._fm = QtGui.QFontMetrics(self._font)
        self._small = QtGui.QFont(self._font)
        self._small.setPointSizeF(max(6.0, self._font.pointSizeF() * 0.8))
        self._sfm = QtGui.QFontMetrics(self._small)
        self._width_of: dict[int, int] = {}  # token id -> pixel width of its piece
        self._texts: dict[int, str] = {}
        self._layout_key: tuple | None = None
        self._x = np.zeros(0, np.int64)  # per cell: left edge of the piece in its row
        self._w = np.zeros(0, np.int64)
        self._image_label: dict[int, str] = {}  # an image block's first cell -> its label
        self._row = np.zeros(0, np.int64)
        self._row_start = np.zeros(1, np.int64)  # first cell of each row (+ the end)
        self._pre = np.zeros(0, np.int64)  # per cell: width of the marks drawn before it
        self.painted_cells = 0  # cells drawn by the last paint (tests, benchmark)

    # -- data -------------------------------------------------------------------------------------
    def set_view(self, view: TokenView | None) -> None:
        self.view = view
        self._layout_key = None
        self._relayout()
        self.viewport().update()

    def row_height(self) -> int:
        n_bands = len(self.view.bands) if self.view is not None else 0
        return self._fm.height() + 2 * PAD + n_bands * (BAND_H + 1) + 4

    def text_of(self, tid: int) -> str:
        t = self._texts.get(tid)
        if t is None:
            t = self._texts[tid] = display_piece(self.view.pieces.get(tid) if self.view else None, tid)
        return t

    def _relayout(self) -> None:
        v = self.view
        width = max(self.viewport().width() - 2 * PAD, 40)
        key = (id(v), width)
        if key == self._layout_key:
            return
        self._layout_key = key
        if v is None or not len(v):
            self._x = self._w = self._row = self._pre = np.zeros(0, np.int64)
            self._row_start = np.zeros(1, np.int64)
            self._update_scroll(0)
            return
        uniq, inv = np.unique(v.ids, return_inverse=True)
        widths = np.array([self._piece_width(int(t)) for t in uniq], np.int64)
        w = widths[inv] + 2 * PAD
        gap = np.full(len(v), GAP, np.int64)
        self._image_label: dict[int, str] = {}
        for cell, (n, label) in v.media.items():  # an image's span as one block: its placeholders are one picture
            self._image_label[cell] = f"[{label}]"
            w[cell] = self._fm.horizontalAdvance(f"[{label}]") + 2 * PAD
            w[cell + 1:cell + n] = 0
            gap[cell + 1:cell + n] = 0
        pre = np.zeros(len(v), np.int64)
        tof = v.turn_of
        starts = np.flatnonzero(np.concatenate([[True], tof[1:] != tof[:-1]]) & (tof >= 0))
        pre[starts] += self._sfm.horizontalAdvance("T00") + 4
        for cell, label in v.labels.items():
            pre[cell] += self._sfm.horizontalAdvance(label) + 8
        total = w + pre + gap
        cum = np.concatenate([[0], np.cumsum(total)])
        rows = [0]
        i, n = 0, len(v)
        while i < n:  # one searchsorted per row, not one step per cell
            j = int(np.searchsorted(cum, cum[i] + width, "right")) - 1
            j = max(j, i + 1)
            rows.append(min(j, n))
            i = j
        self._row_start = np.array(rows, np.int64)
        row = np.zeros(n, np.int64)
        row[self._row_start[1:-1]] = 1
        self._row = np.cumsum(row)
        self._x = cum[:-1] - cum[self._row_start[self._row]] + pre + PAD
        self._w, self._pre = w, pre
        self._update_scroll(len(rows) - 1)

    def _piece_width(self, tid: int) -> int:
        w = self._width_of.get(tid)
        if w is None:
            w = self._width_of[tid] = self._fm.horizontalAdvance(self.text_of(tid))
        return w

    def _update_scroll(self, n_rows: int) -> None:
        sb = self.verticalScrollBar()
        total = n_rows * self.row_height()
        sb.setRange(0, max(0, total - self.viewport().height()))
        sb.setPageStep(self.viewport().height())
        sb.setSingleStep(self.row_height())

    def scroll_to_cell(self, cell: int) -> None:
        if not 0 <= cell < len(self._row):
            return
        y = int(self._row[cell]) * self.row_height()
        sb = self.verticalScrollBar()
        if not sb.value() <= y < sb.value() + self.viewport().height() - self.row_height():
            sb.setValue(max(0, y - self.viewport().height() // 3))
        self.viewport().update()

    def cell_rect(self, cell: int) -> QtCore.QRect:
        """Where a cell's piece is drawn, in viewport coordinates."""
        y = int(self._row[cell]) * self.row_height() - self.verticalScrollBar().value() + 2
        return QtCore.QRect(int(self._x[cell]), y, int(self._w[cell]), self._fm.height() + 2 * PAD)

    def cell_at(self, point: QtCore.QPoint) -> int | None:
        if self.view is None or not len(self._row):
            return None
        rh = self.row_height()
        r = (point.y() + self.verticalScrollBar().value()) // rh
        if not 0 <= r < len(self._row_start) - 1:
            return None
        a, b = int(self._row_start[r]), int(self._row_start[r + 1])
        xs = self._x[a:b]
        k = int(np.searchsorted(xs, point.x(), "right")) - 1
        if k < 0 or point.x() > xs[k] + self._w[a + k]:
            return None
        return a + k

    # -- Qt -----------------------------------------------------------------------------------------
    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self._relayout()
        # The rows are the same at the same width, but a new height moves the scroll range's end.
        self._update_scroll(len(self._row_start) - 1)

    def paintEvent(self, e) -> None:
        p = QtGui.QPainter(self.viewport())
        pal = self.palette()
        p.fillRect(self.viewport().rect(), pal.color(QtGui.QPalette.ColorRole.Base))
        v = self.view
        self.painted_cells = 0
        if v is None or not len(v):
            p.setPen(pal.color(QtGui.QPalette.ColorRole.PlaceholderText))
            msg = (v.note if v is not None and v.note else "no tokens yet")
            p.drawText(self.viewport().rect().adjusted(8, 8, -8, -8),
                       QtCore.Qt.AlignmentFlag.AlignLeft | QtCore.Qt.TextFlag.TextWordWrap, msg)
            p.end()
            return
        rh = self.row_height()
        top = self.verticalScrollBar().value()
        r0 = max(0, top // rh)
        r1 = min(len(self._row_start) - 1, (top + self.viewport().height()) // rh + 1)
        text = pal.color(QtGui.QPalette.ColorRole.Text)
        dim = pal.color(QtGui.QPalette.ColorRole.PlaceholderText)
        th_h = self._fm.height() + 2 * PAD
        band_cols = [_color(th.kind_color(b.kind)) for b in v.bands]
        for r in range(r0, r1):
            y = r * rh - top + 2
            a, b = int(self._row_start[r]), int(self._row_start[r + 1])
            for c in range(a, b):
                self._paint_cell(p, c, int(self._x[c]), y, th_h, text, dim, band_cols)
            self.painted_cells += b - a
        p.end()

    def _paint_cell(self, p: QtGui.QPainter, c: int, x: int, y: int, h: int, text, dim, band_cols) -> None:
        v = self.view
        st, fl = int(v.state[c]), int(v.flags[c])
        w = int(self._w[c])
        if not w:
            return  # inside an image's block
        pre = int(self._pre[c])
        if pre:
            self._paint_marks(p, c, x - pre, y, h)
        rect = QtCore.QRect(x, y, w, h)
        hexa, alpha = STATE_COLORS[st]
        if alpha:
            p.fillRect(rect, _color(hexa, alpha))
        if fl & (DUPLICATE | DUPLICATED):
            p.fillRect(rect, _color(DUP_COLOR, 110 if fl & DUPLICATE else 45))
            pen = QtGui.QPen(_color(DUP_COLOR), 2 if fl & DUPLICATE else 1)
            if fl & DUPLICATED:
                pen.setStyle(QtCore.Qt.PenStyle.DashLine)
            p.setPen(pen)
            p.setBrush(QtCore.Qt.BrushStyle.NoBrush)
            p.drawRect(rect.adjusted(0, 0, -1, -1))
        if st == PENDING:
            p.setPen(QtGui.QPen(_color(hexa), 1, QtCore.Qt.PenStyle.DotLine))
            p.drawRect(rect.adjusted(0, 0, -1, -1))
        p.setFont(self._font)
        p.setPen(dim if st == CROPPED else text)
        p.drawText(rect, QtCore.Qt.AlignmentFlag.AlignCenter,
                   self._image_label.get(c) or self.text_of(int(v.ids[c])))
        if st == CROPPED:
            p.setPen(QtGui.QPen(_color("#E5484D"), 1.5))
            p.drawLine(x + 1, y + h // 2, x + w - 1, y + h // 2)
        if fl & REPLACEMENT:
            p.fillRect(QtCore.QRect(x, y + h - 2, w, 2), _color(REPLACEMENT_COLOR))
        if fl & GENERATED and st not in (CROPPED, PENDING):
            p.fillRect(QtCore.QRect(x, y, w, 1), _color("#FFFFFF", 60))
        pos = int(v.pos[c])
        by = y + h + 2
        positional = st not in (CROPPED, NOT_CACHED, PENDING)
        for k, band in enumerate(v.bands):
            if positional and band.start <= pos < band.end:
                p.fillRect(QtCore.QRect(x, by, w + GAP, BAND_H), band_cols[k])
                if pos in (band.start, band.end - 1):  # the span's bracket: a tick at its ends
                    tx = x if pos == band.start else x + w - 1
                    p.fillRect(QtCore.QRect(tx, by - 2, 2, BAND_H + 3), band_cols[k].darker(130))
            by += BAND_H + 1

    def _paint_marks(self, p: QtGui.QPainter, c: int, x: int, y: int, h: int) -> None:
        v = self.view
        p.setFont(self._small)
        tu = int(v.turn_of[c])
        if c == 0 or int(v.turn_of[c - 1]) != tu:
            tw = self._sfm.horizontalAdvance("T00")
            p.setPen(self.palette().color(QtGui.QPalette.ColorRole.PlaceholderText))
            p.drawText(QtCore.QRect(x, y, tw, h), QtCore.Qt.AlignmentFlag.AlignCenter, f"T{tu + 1}")
            x += tw + 4
        label = v.labels.get(c)
        if label:
            lw = self._sfm.horizontalAdvance(label) + 6
            p.fillRect(QtCore.QRect(x, y, lw, h), _color(LABEL_COLOR, 200))
            p.setPen(QtGui.QColor("#1B1B1B"))
            p.drawText(QtCore.QRect(x, y, lw, h), QtCore.Qt.AlignmentFlag.AlignCenter, label)

    def viewportEvent(self, e) -> bool:
        if e.type() == QtCore.QEvent.Type.ToolTip:
            c = self.cell_at(e.pos())
            if c is None:
                QtWidgets.QToolTip.hideText()
            else:
                QtWidgets.QToolTip.showText(e.globalPos(), tooltip(self.view, c), self.viewport())
            return True
        return super().viewportEvent(e)


def tooltip(view: TokenView, c: int) -> str:
    """Position, id, decoded piece, turn, state and the layers holding the token."""
    tid = int(view.ids[c])
    st = int(view.state[c])
    fl = int(view.flags[c])
    piece = view.pieces.get(tid)
    held = view.layers_holding(c)
    where = {CROPPED: "was at position", NOT_CACHED: "position in the sequence", PENDING: "next position"}
    lines = [f"<b>{where.get(st, 'position')} {int(view.pos[c])}</b> · id {tid if tid >= 0 else 'unknown'}",
             f"piece: <code>{html.escape(repr(piece) if piece is not None else '(not recorded)')}</code>",
             f"turn {int(view.turn_of[c]) + 1 if view.turn_of[c] >= 0 else '?'}"
             f"{' · reply' if fl & GENERATED else ' · prompt'}",
             html.escape(STATE_TEXT[st])]
    if fl & DUPLICATE:
        lines.append("fed twice: this is the duplicate")
    elif fl & DUPLICATED:
        lines.append("fed twice: this is the first copy")
    if fl & REPLACEMENT:
        lines.append("fed where cropped tokens were")
    if st not in (CROPPED, NOT_CACHED, PENDING):
        n_tok = int((view.starts >= 0).sum())
        lines.append(f"held by {len(held)} of {n_tok} layers: {ranges(held) or 'none'}")
    image = view.media.get(c)
    if image is not None:
        last = c + image[0] - 1
        lines.insert(1, f"{html.escape(image[1])}: positions {int(view.pos[c])}–{int(view.pos[last])}; "
                        f"its last token held by {len(view.layers_holding(last))} layers")
    return "<br>".join(lines)


class TokensPanel(QtWidgets.QWidget):
    """Summary line, legend and the token canvas; ``render(record, step)`` like every panel."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.record = None
        self.view: TokenView | None = None
        self._key: tuple | None = None
        self.summary = QtWidgets.QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.legend = QtWidgets.QLabel(legend_html())
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.canvas = TokenCanvas()
        box = QtWidgets.QVBoxLayout(self)
        box.setContentsMargins(4, 4, 4, 4)
        box.setSpacing(3)
        box.addWidget(self.summary)
        box.addWidget(self.legend)
        box.addWidget(self.canvas, 1)
        self._follow_end = True
        self._pin: tuple[int, tuple] | None = None
        self._pending: tuple | None = None

    def showEvent(self, e) -> None:
        super().showEvent(e)
        if self._pending is not None:
            self.render(*self._pending)

    def render(self, record, step: int | None = None) -> None:
        if record is None:
            self.record, self._key, self.view = None, None, None
            self.canvas.set_view(None)
            self.summary.setText("")
            return
        if not self.isVisible():  # a hidden tab costs nothing; showing it renders what was asked last
            self._pending = (record, step)
            return
        self._pending = None
        if self._pin is not None:
            pinned, ctx = self._pin
            if ctx != (id(record), step, record.n_steps):
                self._pin = None  # the slider moved or new steps came: follow them again
            else:
                step = pinned
        turns = record.turns
        if step is None and turns and turns[-1].status == "running" and turns[-1].ids is None:
            # A live turn's ids come with its end: until then the view (the previous turn's end) is fixed,
            # so the data rate costs nothing here.
            key: tuple = (id(record), "running", len(turns), len(record.events))
        else:
            key = (id(record), record.version, step)
        if key == self._key:
            return
        self.record, self._key = record, key
        self.view = token_view(record, step)
        self.canvas.set_view(self.view)
        self.summary.setText(summary_html(self.view, len(record.turns)))
        if len(self.view) and self._follow_end:
            self.canvas.scroll_to_cell(len(self.view) - 1)

    def pin(self, record, viewing_step: int | None, step: int, position: int | None = None) -> None:
        """Show ``step`` (an event's) until the slider moves or new steps arrive; scroll to ``position``."""
        self._pin = None
        self.render(record, step)
        self._pin = (step, (id(record), viewing_step, record.n_steps))
        self.show_position(position)

    def show_position(self, position: int | None) -> None:
        """Scroll to a cache position (an event's), or to the end."""
        v = self.view
        if v is None or not len(v):
            return
        cell = v.cell_at(position) if position is not None else None
        self.canvas.scroll_to_cell(len(v) - 1 if cell is None else cell)


def summary_html(view: TokenView, n_turns: int) -> str:
    cached = view.cache_len
    parts = [f"<b>step {view.step}</b> · turn {view.turn + 1} of {n_turns} · {cached:,} positions in the cache"]
    for b in view.bands:
        w = f" {b.window}" if b.window else ""
        span = f"{b.start:,}–{b.end - 1:,}" if b.end > b.start else "nothing"
        parts.append(f"<span style='color:{th.kind_color(b.kind)}'>■</span> {html.escape(b.kind)}{w} ×{len(b.layers)} "
                     f"(layers {ranges(b.layers)}): {span}")
    if view.recurrent:
        parts.append(f"recurrent state (layers {ranges(view.recurrent)}): summarises all {cached:,} tokens, "
                     "no positions")
    if view.note:
        parts.append(f"<i>{html.escape(view.note)}</i>")
    return "<br>".join(parts)


#: Short legend words per state (the tooltip and docs/tokens.md say it in full).
LEGEND_WORDS = {
    HELD: "all layers",
    WINDOWED_OUT: "only full layers (out of the window)",
    EVICTED: "no layer",
    NOT_CACHED: "never cached",
    CROPPED: "cropped",
    PENDING: "not fed yet",
}


def legend_html() -> str:
    items = []
    for st, words in LEGEND_WORDS.items():
        hexa, alpha = STATE_COLORS[st]
        if st == CROPPED:
            sw = "<s style='color:#E5484D'>&nbsp;ab&nbsp;</s>"
        elif st == PENDING:
            sw = f"<span style='color:{hexa}'>┆ab┆</span>"
        else:
            sw = f"<span style='background-color:rgba({QtGui.QColor(hexa).red()},{QtGui.QColor(hexa).green()},"
            sw += f"{QtGui.QColor(hexa).blue()},{alpha / 255:.2f})'>&nbsp;ab&nbsp;</span>"
        items.append(f"<span title='{html.escape(STATE_TEXT[st])}'>{sw}&nbsp;{html.escape(words)}</span>")
    items.append("<span style='background-color:rgba(255,111,181,0.45)'>&nbsp;ab&nbsp;</span>&nbsp;fed twice")
    items.append(f"<span style='color:{REPLACEMENT_COLOR}'>▁</span>&nbsp;replaced cropped")
    return "<small>" + " &nbsp; ".join(items) + "</small>"
