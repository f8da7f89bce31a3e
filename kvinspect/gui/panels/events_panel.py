"""The events list: what the detectors found, where, and what to do; a row jumps the plots to it."""

from __future__ import annotations

import html

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.detect.events import _ranges
from kvinspect.gui.base import theme as th

COLS = ("", "turn", "step", "kind", "layers", "message")
NUMERIC = {1, 2}


def _dot(color: str, size: int = 10) -> QtGui.QIcon:
    pm = QtGui.QPixmap(size, size)
    pm.fill(QtCore.Qt.GlobalColor.transparent)
    p = QtGui.QPainter(pm)
    p.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    p.setBrush(QtGui.QColor(color))
    p.setPen(QtCore.Qt.PenStyle.NoPen)
    p.drawEllipse(1, 1, size - 2, size - 2)
    p.end()
    return QtGui.QIcon(pm)


class _Item(QtWidgets.QTreeWidgetItem):
    def __lt__(self, other) -> bool:
        col = self.treeWidget().sortColumn() if self.treeWidget() else 0
        a, b = self.data(col, QtCore.Qt.ItemDataRole.UserRole), other.data(col, QtCore.Qt.ItemDataRole.UserRole)
        if a is not None and b is not None:
            return a < b
        return super().__lt__(other)


def badge(text: str, bg: str) -> str:
    return (f"<span style='background-color:{bg}; color:{th.badge_text_color(bg)}; font-weight:bold'>"
            f"&nbsp;{html.escape(text)}&nbsp;</span>")


class EventsPanel(QtWidgets.QWidget):
    """Every detector event; selecting one shows its explanation and advice and jumps the plots."""

    eventSelected = QtCore.Signal(int)  # index into record.events
    copyRequested = QtCore.Signal(int)  # "Copy as Markdown" on an event (index into record.events)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.record = None
        self._shown = -1
        self._step = None
        self._turns = -1
        self.tree = QtWidgets.QTreeWidget()
        self.tree.setHeaderLabels(list(COLS))
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSortingEnabled(True)
        self.tree.sortByColumn(2, QtCore.Qt.SortOrder.AscendingOrder)
        h = self.tree.header()
        h.setStretchLastSection(True)
        for col, w in ((0, 26), (1, 40), (2, 56), (3, 150), (4, 52)):
            h.resizeSection(col, w)
        self.tree.itemSelectionChanged.connect(self._on_selection)
        self.tree.setContextMenuPolicy(QtCore.Qt.ContextMenuPolicy.CustomContextMenu)
        self.tree.customContextMenuRequested.connect(self._on_menu)
        self.detail = QtWidgets.QTextBrowser()
        self.detail.setOpenExternalLinks(False)
        self.detail.setPlaceholderText("Select an event to see what happened, the numbers, and what to do.")
        self.copy_button = QtWidgets.QToolButton(text="Copy as Markdown")
        self.copy_button.setToolTip("Copy this event's explanation, numbers and versions as Markdown, "
                                    "for pasting into an issue")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(self._on_copy)
        detail = QtWidgets.QWidget()
        dbox = QtWidgets.QVBoxLayout(detail)
        dbox.setContentsMargins(0, 0, 0, 0)
        dbox.setSpacing(2)
        dbox.addWidget(self.detail, 1)
        dbox.addWidget(self.copy_button, 0, QtCore.Qt.AlignmentFlag.AlignRight)
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Vertical)
        split.addWidget(self.tree)
        split.addWidget(detail)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setChildrenCollapsible(False)
        box = QtWidgets.QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(split)

    def count(self) -> int:
        return self.tree.topLevelItemCount()

    def render(self, record, step: int | None = None) -> None:
        if record is not self.record or step != self._step:
            self.record, self._step, self._shown, self._turns = record, step, -1, -1
            self.tree.clear()
            self.detail.clear()
            self.copy_button.setEnabled(False)
        if record is None:
            return
        with record.lock:
            events = list(record.events)
            turns = sum(1 for t in record.turns if step is None or t.first_step <= step)
        if len(events) == self._shown and (events or turns == self._turns):
            return
        self._turns = turns
        self.tree.setSortingEnabled(False)
        for idx in range(max(self._shown, 0), len(events)):
            e = events[idx]
            if step is not None and e.step > step:
                continue
            it = _Item()
            sev = th.severity_color(e.severity)
            it.setIcon(0, _dot(sev))
            it.setToolTip(0, e.severity)
            it.setData(0, QtCore.Qt.ItemDataRole.UserRole, {"info": 0, "warn": 1, "error": 2}.get(e.severity, 1))
            it.setText(1, str(e.turn + 1))
            it.setData(1, QtCore.Qt.ItemDataRole.UserRole, e.turn)
            it.setText(2, f"{e.step:,}")
            it.setData(2, QtCore.Qt.ItemDataRole.UserRole, (e.step, idx))
            it.setText(3, e.kind)
            it.setForeground(3, QtGui.QBrush(QtGui.QColor(th.EVENT_MARKERS.get(e.kind, (None, sev))[1])))
            it.setText(4, _ranges(e.layers) if e.layers else "all")
            it.setText(5, e.message)
            it.setToolTip(5, e.message)
            it.setData(5, QtCore.Qt.ItemDataRole.UserRole + 1, idx)
            self.tree.addTopLevelItem(it)
        added = len(events) - max(self._shown, 0)
        self._shown = len(events)
        self.tree.setSortingEnabled(True)
        if added > 0 and not self.tree.selectedItems() and step is None:
            self.tree.scrollToBottom()  # live: keep the newest rows in view (sorted by step, ascending)
        if not self.tree.selectedItems():
            # Nothing picked yet: preview the latest problem (else the latest event) without jumping.
            shown = [e for e in events if step is None or e.step <= step]
            latest = next((e for e in reversed(shown) if e.is_problem), shown[-1] if shown else None)
            if latest is not None:
                self.detail.setHtml("<p style='color:gray'>Latest event — select a row to jump to it.</p>"
                                    + event_html(latest))
            else:
                self.detail.setHtml(_quiet_html(turns))

    def select(self, idx: int) -> None:
        """Select the row of event ``idx`` (e.g. clicked on the plot)."""
        for i in range(self.tree.topLevelItemCount()):
            it = self.tree.topLevelItem(i)
            if it.data(5, QtCore.Qt.ItemDataRole.UserRole + 1) == idx:
                self.tree.setCurrentItem(it)
                self.tree.scrollToItem(it)
                return

    def selected_index(self) -> int | None:
        items = self.tree.selectedItems()
        return items[0].data(5, QtCore.Qt.ItemDataRole.UserRole + 1) if items else None

    def _on_selection(self) -> None:
        idx = self.selected_index()
        self.copy_button.setEnabled(idx is not None)
        if idx is None or self.record is None:
            return
        e = self.record.events[idx]
        self.detail.setHtml(event_html(e))
        self.eventSelected.emit(idx)

    def _on_copy(self) -> None:
        idx = self.selected_index()
        if idx is not None:
            self.copyRequested.emit(idx)

    def _on_menu(self, pos) -> None:
        item = self.tree.itemAt(pos)
        if item is None:
            return
        idx = item.data(5, QtCore.Qt.ItemDataRole.UserRole + 1)
        menu = QtWidgets.QMenu(self)
        menu.addAction("Copy as Markdown", lambda: self.copyRequested.emit(idx))
        menu.popup(self.tree.viewport().mapToGlobal(pos))


def _quiet_html(turns: int) -> str:
    # An empty list is a finding too (the correct run's evidence), so say what was checked.
    if not turns:
        return ""
    return (f"<p><b>No events in {turns} turn{'s' if turns != 1 else ''}.</b> No detector fired: "
            "no cache recreated, no duplicated context, no prefix divergence, no disabled cache, "
            "no generation-config override, no unbounded window; no sliding window or chunk reached.</p>"
            "<p style='color:gray'>Events appear here when one does; select a row to jump to it.</p>")


def event_html(e) -> str:
    sev = th.severity_color(e.severity)
    where = f"turn {e.turn + 1}, step {e.step:,}"
    if e.layers:
        where += f", layers {_ranges(e.layers)}"
    out = [f"<p>{badge(e.severity.upper(), sev)} &nbsp;<b>{html.escape(e.kind)}</b> &nbsp; {where}</p>",
           f"<p>{html.escape(e.message)}</p>"]
    if e.advice:
        out.append(f"<p><b>What to do:</b> {html.escape(e.advice)}</p>")
    if e.data:
        rows = "".join(f"<tr><td><tt>{html.escape(str(k))}</tt></td><td>&nbsp;{html.escape(str(v))}</td></tr>"
                       for k, v in e.data.items())
        out.append(f"<table cellspacing='0'>{rows}</table>")
    return "".join(out)
