"""The per-turn checklist: pass/warn/fail for each check of the chosen turn."""

from __future__ import annotations

import html

from PySide6 import QtWidgets

from kvinspect.gui.base import theme as th
from kvinspect.gui.panels.events_panel import badge


class ChecklistPanel(QtWidgets.QWidget):
    """The diagnosis checklist of one turn (the latest unless another is picked): pass/warn/fail."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.record = None
        self._key = None
        self._pinned: int | None = None  # a turn the user picked; None follows the latest
        self.turn_box = QtWidgets.QComboBox()
        self.turn_box.setSizeAdjustPolicy(QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.turn_box.activated.connect(self._on_pick)
        self.summary = QtWidgets.QLabel()
        self.view = QtWidgets.QTextBrowser()
        self.view.setPlaceholderText("The checklist appears after the first turn.")
        head = QtWidgets.QHBoxLayout()
        head.addWidget(QtWidgets.QLabel("Turn"))
        head.addWidget(self.turn_box)
        head.addWidget(self.summary, 1)
        box = QtWidgets.QVBoxLayout(self)
        box.setContentsMargins(0, 2, 0, 0)
        box.addLayout(head)
        box.addWidget(self.view, 1)

    def show_turn(self, index: int | None) -> None:
        self._pinned = index
        self._key = None
        self.render(self.record)

    def render(self, record, step: int | None = None) -> None:
        self.record = record
        if record is None:
            self.turn_box.clear()
            self.view.clear()
            self.summary.clear()
            self._key = None
            return
        with record.lock:
            # A checklist is made when its turn ends: in a replay, only turns finished by the step have one.
            turns = [t for t in record.turns if t.checklist and (step is None or t.end_step - 1 <= step)]
        key = (id(record), tuple((t.index, len(t.checklist), t.status) for t in turns), self._pinned)
        if key == self._key:
            return
        self._key = key
        self.turn_box.blockSignals(True)
        self.turn_box.clear()
        for t in turns:
            worst = _worst(t.checklist)
            self.turn_box.addItem(f"{t.index + 1} ({t.policy}, {worst})", t.index)
        self.turn_box.blockSignals(False)
        if not turns:
            self.view.clear()
            self.summary.clear()
            return
        pick = next((t for t in turns if t.index == self._pinned), turns[-1])
        self.turn_box.setCurrentIndex(turns.index(pick))
        self.view.setHtml(checklist_html(pick))
        counts = {s: sum(1 for c in pick.checklist if c["status"] == s) for s in ("pass", "warn", "fail")}
        self.summary.setText("  ".join(badge(f"{n} {s.upper()}", th.STATUS_COLORS[s]) for s, n in counts.items() if n))

    def _on_pick(self, row: int) -> None:
        idx = self.turn_box.itemData(row)
        last = self.turn_box.itemData(self.turn_box.count() - 1)
        self.show_turn(None if idx == last else idx)

    def statuses(self) -> dict[str, str]:
        """key → status of the turn shown (for tests and scripted checks)."""
        if self.record is None or not self.record.turns:
            return {}
        idx = self.turn_box.currentData()
        turn = next((t for t in self.record.turns if t.index == idx), None)
        return {c["key"]: c["status"] for c in turn.checklist} if turn else {}


def _worst(items: list[dict]) -> str:
    st = {c["status"] for c in items}
    return "fail" if "fail" in st else "warn" if "warn" in st else "pass"


def checklist_html(turn) -> str:
    rows = []
    for c in turn.checklist:
        color = th.status_color(c["status"])
        rows.append(
            # nowrap: the badge column takes the width of its widest badge (WARN broke as "WAR/N").
            f"<tr><td valign='top' nowrap style='white-space:nowrap'>{badge(c['status'].upper(), color)}</td>"
            f"<td valign='top'><b>{html.escape(c['title'])}</b><br>{html.escape(c['evidence'])}</td></tr>")
    head = (f"<p>Turn {turn.index + 1} · policy <b>{html.escape(turn.policy)}</b> · cache "
            f"<b>{html.escape(turn.cache_impl)}</b> · {html.escape(turn.status)}</p>")
    return head + "<table cellspacing='0' cellpadding='4' width='100%'>" + "".join(rows) + "</table>"
