"""The Compare window's results: the per-configuration table and the figures, from a compare.json document.

Pure helpers (:func:`table_rows`, :func:`compare_dir`) and :class:`CompareResults`, the right-hand
side of the window: a summary line, the table (one row per configuration: TTFT, conversation
latency, decode rate, prefill per turn, peak KV and memory, failures) and one tab per figure of
:func:`.render_compare.build_figures`, drawn in the window's theme.
"""

from __future__ import annotations

import html
import shutil
from datetime import datetime
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.paths import data_dir
from kvinspect.core.units import fmt_bytes
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.accessibility import name as _name

KEEP_RUNS = 10  # comparison folders kept under data_dir()/compare (each run's traces live there)
COLUMNS = ("configuration", "status", "TTFT", "conversation", "decode tok/s", "prefill / turn", "peak KV",
           "peak memory", "same replies", "failed / why")
SAME_COL, FAIL_COL = 8, 9
FIGURE_TITLES = {"latency_per_turn": "Latency per turn", "memory_per_turn": "Memory per turn",
                 "stress": "Stress", "prompt_lengths": "Prompt lengths", "cache": "Where they part"}
#: What a screen reader says about each figure's plot (its accessible description).
FIGURE_DESCRIPTIONS = {
    "latency_per_turn": "Per configuration and turn: time to first token and turn latency, median with "
                        "min–max bars over repeats; x marks a failed turn",
    "memory_per_turn": "Per configuration and turn: peak bytes of the K/V tensors and peak memory",
    "stress": "Per configuration: tokens in the conversation after each turn of a long conversation, until it "
              "fails (x) or reaches the last turn",
    "prompt_lengths": "Per configuration, by prompt length: time to first token, turn latency and decode tokens "
                      "per second",
    "cache": "Per layer kind: the stored K/V rows at every step of both compared sides (two environments, or two "
             "configurations), overlaid",
}


def compare_dir(model_name: str) -> Path:
    """A new folder for a comparison's runs; older ones beyond :data:`KEEP_RUNS` are removed."""
    root = data_dir() / "compare"
    root.mkdir(parents=True, exist_ok=True)
    old = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True)
    for p in old[KEEP_RUNS - 1:]:
        shutil.rmtree(p, ignore_errors=True)
    slug = "".join(c if c.isalnum() or c in "._-" else "-" for c in Path(model_name).name)[:40] or "model"
    base = root / f"{datetime.now():%Y%m%d-%H%M%S}-{slug}"
    out, n = base, 2
    while out.exists():
        out, n = Path(f"{base}-{n}"), n + 1
    return out


def _spread(st: dict | None, fmt) -> str:
    """``median [min–max]`` with the unit written once when the three share it (``4.5 ms [3.6–5.3]``)."""
    if not st:
        return "–"
    med, lo, hi = fmt(st["median"]), fmt(st["min"]), fmt(st["max"])
    if st["n"] == 1 or lo == hi:
        return med
    unit = med.rsplit(" ", 1)[1] if " " in med else ""
    if unit and lo.endswith(" " + unit) and hi.endswith(" " + unit):
        lo, hi = lo[: -len(unit) - 1], hi[: -len(unit) - 1]
    return f"{med} [{lo}–{hi}]"


def table_rows(data: dict) -> list[list[str]]:
    """One row per configuration of a compare.json document, as the window's table shows it."""
    from kvinspect.core.compare.markdown import fmt_rate, fmt_s

    rows = []
    same = same_replies(data.get("correctness"))
    for c in data.get("configs") or []:
        sm = c.get("summary")
        if c["status"] != "ran" or not sm:
            why = c.get("reason") or ("waiting to run" if c["status"] == "ran" else "")
            status = c["status"] if c["status"] != "ran" else "pending"
            rows.append([c["name"], status, "–", "–", "–", "–", "–", "–", "–", why])
            continue
        prefill = ", ".join("–" if x is None else str(x) for x in sm["prefill_tokens_per_turn"]) or "–"
        fails = sm["turns_failed"]
        reasons = "; ".join(f["reason"] for f in sm["failures"])
        rows.append([
            c["name"], f"ran ×{sm['repeats']}", _spread(sm["ttft_s"], fmt_s), _spread(sm["conversation_s"], fmt_s),
            _spread(sm["decode_tokens_per_s"], fmt_rate), prefill,
            "–" if sm["peak_kv_bytes"] is None else fmt_bytes(sm["peak_kv_bytes"]),
            "–" if sm["peak_memory_bytes"] is None else fmt_bytes(sm["peak_memory_bytes"]),
            same.get(c["name"], "–"),
            (f"{fails}/{sm['turns_total']}: {reasons}" if fails else f"0/{sm['turns_total']}"),
        ])
    return rows


def same_replies(doc: dict | None) -> dict[str, str]:
    """Per configuration, the "same replies" cell: ``baseline``, ``3/3``, ``1/3 · turn 2 @ token 4``, or why not."""
    if not doc or doc.get("skip") or not doc.get("baseline"):
        return {}  # sampling, or nothing ran: "–" (compare.md says why)
    out = {doc["baseline"]: "baseline"}
    for c in doc.get("configs") or []:
        if c.get("skip"):
            out[c["name"]] = "not compared"
            continue
        cell = f"{c['same_turns']}/{c['compared_turns']}"
        diff = next((t for t in c["turns"] if t["same"] is False), None)
        if diff is not None:
            cell += f" · turn {diff['turn'] + 1} @ token {diff['first_diff']}"
        out[c["name"]] = cell
    return out


def compact_titles(widget) -> None:
    """The figures are laid out for a 1500 px export; in a window half as wide, smaller titles fit."""
    import pyqtgraph as pg

    for item in widget.ci.items:
        if isinstance(item, pg.PlotItem) and item.titleLabel.text:
            # A label's width is a minimum of the layout: a long title would push the plots out of the tab.
            head, sep, rest = item.titleLabel.text.partition(" (")
            text = f"{head}<br><span style='font-size:8pt'>({rest}</span>" if sep else head
            item.setTitle(text, size="9pt")


TIPS = ("cache configuration", "measured repeats (or why it did not run)",
        "time to first token: median [min–max] over measured turns",
        "whole-conversation latency: median [min–max] over complete repeats",
        "decode tokens per second: median [min–max]", "prompt tokens prefilled per turn (median per turn)",
        "largest K/V bytes during a turn", "peak device memory (process RSS on CPU: an upper bound)",
        "greedy replies equal to the baseline's, token for token (turns equal / compared; the first difference)",
        "failed turns / turns, and their one-line reasons")


class CompareResults(QtWidgets.QSplitter):
    """Summary + table over the figures' tabs; ``show(data)`` after every run, ``show_figures`` at the end."""

    def __init__(self, parent=None):
        super().__init__(QtCore.Qt.Orientation.Vertical, parent)
        self.figures: list[tuple[str, QtWidgets.QWidget]] = []
        self.summary = QtWidgets.QLabel("Pick configurations and press <b>Run comparison</b>. The chat pauses "
                                        "while it runs (one model, one thread).")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.table = QtWidgets.QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        for col, tip in enumerate(TIPS):
            self.table.horizontalHeaderItem(col).setToolTip(tip)
        _name(self.table, "Comparison table", "One row per configuration: status, time to first token, "
             "conversation latency, decode rate, prefill per turn, peak KV and memory, same replies, failures")
        self.tabs = QtWidgets.QTabWidget()
        _name(self.tabs, "Comparison plots", "One tab per figure of the finished comparison")
        top = QtWidgets.QWidget()
        tbox = QtWidgets.QVBoxLayout(top)
        tbox.setContentsMargins(0, 0, 0, 0)
        tbox.addWidget(self.summary)
        tbox.addWidget(self.table, 1)
        self.addWidget(top)
        self.addWidget(self.tabs)
        self.setStretchFactor(0, 0)
        self.setStretchFactor(1, 1)
        self.setChildrenCollapsible(False)
        self.setSizes([210, 590])  # the table needs a few rows; the plots want the height

    def rows(self) -> list[list[str]]:
        """The table as shown (tests)."""
        return [[self.table.item(r, c).text() for c in range(self.table.columnCount())]
                for r in range(self.table.rowCount())]

    def clear(self) -> None:
        self.table.setRowCount(0)
        self.clear_figures()

    def show_table(self, data: dict) -> None:
        rows = table_rows(data)
        mem = data.get("memory_label") or "peak memory"
        head = self.table.horizontalHeaderItem(7)
        head.setText("peak memory" if data.get("memory_kind") != "rss" else "peak RSS")
        head.setToolTip(f"peak memory: {mem}")
        self.table.setRowCount(len(rows))
        warn, fail = th.STATUS_COLORS["warn"], th.STATUS_COLORS["fail"]
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QtWidgets.QTableWidgetItem(text)
                item.setToolTip(text)
                if 2 <= c <= 7:
                    item.setTextAlignment(QtCore.Qt.AlignmentFlag.AlignRight | QtCore.Qt.AlignmentFlag.AlignVCenter)
                if c == 1 and text in ("skipped", "failed"):
                    item.setForeground(_brush(warn if text == "skipped" else fail))
                if c == SAME_COL and " @ token " in text:
                    item.setForeground(_brush(fail))
                if c == FAIL_COL and not text.startswith("0/") and text:
                    item.setForeground(_brush(fail if "/" in text else warn))
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        for c in range(self.table.columnCount() - 1):  # long failure reasons stay in the tooltip
            self.table.setColumnWidth(c, min(self.table.columnWidth(c) + 6, 200))

    def show_summary(self, data: dict) -> None:
        m = data["model"]
        plan = data["plan"]
        s = plan["settings"]
        base = data.get("baseline")
        bits = [f"<b>{html.escape(str(m['name']))}</b> on {html.escape(str(data['device']))}",
                f"{plan['repeat']} repeat(s), interleaved", f"max_new_tokens {s['max_new_tokens']}",
                f"memory: {html.escape(data['memory_label'])}"]
        if base:
            bits.append(f"baseline {html.escape(base)}")
        cancelled = " <b>· cancelled: only what finished is shown</b>" if data.get("cancelled") else ""
        self.summary.setText(" · ".join(bits) + cancelled)

    def clear_figures(self) -> None:
        self.tabs.clear()
        for _, w in self.figures:
            w.deleteLater()
        self.figures = []

    def show_figures(self, data: dict, t: th.Theme) -> None:
        from kvinspect.gui.report_images.compare_figures import build_figures

        self.clear_figures()
        self.figures = build_figures(data, background=t.plot_bg, foreground=t.plot_fg)
        for name, w in self.figures:
            compact_titles(w)
            title = FIGURE_TITLES.get(name, name)
            _name(w, f"{title} plot", FIGURE_DESCRIPTIONS.get(name, title))
            self.tabs.addTab(w, FIGURE_TITLES.get(name, name))


def _brush(color: str) -> QtGui.QBrush:
    return QtGui.QBrush(QtGui.QColor(color))
