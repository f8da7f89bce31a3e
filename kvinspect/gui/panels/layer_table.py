"""The per-layer table: live lengths and bytes at a step, plus the facts of the last turn's snapshot.

Seen, stored, device and bytes come from the record's step series (live, per forward
pass); capacity, dtype and held bytes need a full walk of the cache's tensors, which the
session does at the end of each turn, so they show the last finished turn's values.
Updating emits ``dataChanged`` rather than resetting the model, so sorting, selection and
scrolling survive the 5-10 updates a second.
"""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.units import fmt_bytes
from kvinspect.gui.base import theme as th

COLUMNS = (
    ("index", "layer", "Layer index"),
    ("kind", "kind", "What the cache layer does (full, sliding, chunked; state: a recurrent/conv state, no tokens; "
                     "shared: reads another layer's K/V; indexed: K/V plus indexer keys; static-/quantized storage)"),
    ("window", "window", "Sliding window or attention chunk, in tokens"),
    ("seen", "seen", "Tokens the layer has seen"),
    ("stored", "stored", "K/V rows the layer holds now"),
    ("batch", "rows", "K/V rows of the layer (beams, batched prompts): seen and stored are per row; end of the last "
                      "turn. Shown when a cache holds more than one"),
    ("capacity", "capacity", "Rows it can hold (static caches, windows); – unbounded. At the end of the last turn"),
    ("device", "device", "Where the layer's keys are now"),
    ("dtype", "dtype", "K/V dtype (end of the last turn)"),
    ("bytes", "bytes", "Bytes of the layer's K/V tensors now"),
    ("held_bytes", "held", "Bytes of the storages those tensors keep alive (views can pin more); end of the last turn"),
    ("reads_from", "reads", "Shared layers: the layer whose K/V they read (they store none)"),
)
NUMERIC = {"index", "window", "seen", "stored", "batch", "capacity", "bytes", "held_bytes"}
SORT_ROLE = QtCore.Qt.ItemDataRole.UserRole


class LayerModel(QtCore.QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []

    # parent=None, not a QModelIndex() default (one object built at import, shared by every call):
    # Qt always passes an index; a Python caller may leave it out, meaning the (invalid) root.
    def rowCount(self, parent: QtCore.QModelIndex | None = None) -> int:
        return 0 if parent is not None and parent.isValid() else len(self.rows)

    def columnCount(self, parent: QtCore.QModelIndex | None = None) -> int:
        return 0 if parent is not None and parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=QtCore.Qt.ItemDataRole.DisplayRole):
        if orientation == QtCore.Qt.Orientation.Horizontal:
            if role == QtCore.Qt.ItemDataRole.DisplayRole:
                return COLUMNS[section][1]
            if role == QtCore.Qt.ItemDataRole.ToolTipRole:
                return COLUMNS[section][2]
        return None

    def data(self, index, role=QtCore.Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        key = COLUMNS[index.column()][0]
        v = row.get(key)
        if role == QtCore.Qt.ItemDataRole.DisplayRole:
            if v is None or v == "":
                return "–"
            if key in ("bytes", "held_bytes"):
                return fmt_bytes(v)
            if isinstance(v, int) and key != "index":
                return f"{v:,}"
            return str(v)
        if role == SORT_ROLE:
            if key in NUMERIC:
                return -1 if v is None else int(v)
            return "" if v is None else str(v)
        if role == QtCore.Qt.ItemDataRole.TextAlignmentRole and key in NUMERIC:
            return int(QtCore.Qt.AlignmentFlag.AlignRight | QtCore.Qt.AlignmentFlag.AlignVCenter)
        if role == QtCore.Qt.ItemDataRole.ForegroundRole and key == "kind":
            return QtGui.QBrush(QtGui.QColor(th.kind_color(v)))
        if role == QtCore.Qt.ItemDataRole.ForegroundRole and key == "stored":
            seen, stored = row.get("seen"), row.get("stored")
            if seen is not None and stored is not None and stored < seen:
                return QtGui.QBrush(QtGui.QColor(th.KIND_COLORS["sliding"]))  # stalled at its window
        return None

    def set_rows(self, rows: list[dict]) -> None:
        if len(rows) != len(self.rows):
            self.beginResetModel()
            self.rows = rows
            self.endResetModel()
            return
        if rows != self.rows:
            self.rows = rows
            self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(COLUMNS) - 1))


def layer_rows(record, step: int | None = None) -> list[dict]:
    """One dict per layer at ``step`` (default: the latest), merged with the last snapshot before it."""
    with record.lock:
        n = record.n_steps
        at = n - 1 if step is None else min(step, n - 1)
        live = record.layer_table_at(at) if at >= 0 else []
        snap = None
        for t in reversed(record.turns):
            if t.layers and (step is None or t.end_step - 1 <= at):
                snap = t.layers
                break
        dtype = (record.header.get("model") or {}).get("dtype")
    info = record.header.get("layers") or []
    rows = []
    for i in range(record.n_layers):
        # Every column key present (None = not known yet, e.g. a followed trace before its first steps).
        base = dict.fromkeys(key for key, _, _ in COLUMNS)
        base.update(index=i, kind=info[i].get("config_attention") if i < len(info) else None,
                    window=info[i].get("window") if i < len(info) else None, dtype=dtype)
        if snap is not None and i < len(snap):
            s = snap[i]
            base.update(kind=s.get("kind"), window=s.get("window"), capacity=s.get("capacity"),
                        dtype=s.get("dtype") or dtype, held_bytes=s.get("held_bytes"),
                        seen=s.get("seen"), stored=s.get("stored"), device=s.get("device"), bytes=s.get("bytes"),
                        reads_from=s.get("reads_from"), batch=s.get("batch"))
        if i < len(live):
            lv = live[i]
            base.update(seen=lv.get("seen"), stored=lv.get("stored"), device=lv.get("device"), bytes=lv.get("bytes"))
        rows.append(base)
    return rows


class LayerTable(QtWidgets.QWidget):
    """Sortable, live. ``render(record, step=None)``."""

    layersSelected = QtCore.Signal(list)
    copyRequested = QtCore.Signal()  # "Copy layer table as Markdown" (the step shown)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.record = None
        self._version = None
        self.model = LayerModel(self)
        self.proxy = QtCore.QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QtWidgets.QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(0, QtCore.Qt.SortOrder.AscendingOrder)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionBehavior(QtWidgets.QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.verticalHeader().setVisible(False)
        self.view.verticalHeader().setDefaultSectionSize(22)
        self.view.horizontalHeader().setStretchLastSection(True)
        self.view.horizontalHeader().setSectionResizeMode(QtWidgets.QHeaderView.ResizeMode.Interactive)
        for col, w in enumerate((50, 100, 64, 72, 64, 48, 72, 64, 70, 80)):
            self.view.setColumnWidth(col, w)
        self._batch_col = next(i for i, c in enumerate(COLUMNS) if c[0] == "batch")
        self.view.setColumnHidden(self._batch_col, True)
        self.view.selectionModel().selectionChanged.connect(self._on_select)
        self.view.setContextMenuPolicy(QtCore.Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._on_menu)
        box = QtWidgets.QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(self.view)

    def render(self, record, step: int | None = None) -> None:
        if record is None:
            self.record, self._version = None, None
            self.model.set_rows([])
            return
        key = (id(record), record.version, step)
        if key == self._version:
            return
        self.record, self._version = record, key
        rows = layer_rows(record, step)
        self.model.set_rows(rows)
        # Rows only where a cache holds several (beams, a batch): one everywhere else says nothing.
        self.view.setColumnHidden(self._batch_col, not any((r.get("batch") or 1) > 1 for r in rows))

    def _on_menu(self, pos) -> None:
        menu = QtWidgets.QMenu(self)
        menu.addAction("Copy layer table as Markdown", self.copyRequested.emit)
        menu.popup(self.view.viewport().mapToGlobal(pos))

    def _on_select(self, *args) -> None:
        rows = {self.proxy.mapToSource(i).row() for i in self.view.selectionModel().selectedRows()}
        self.layersSelected.emit(sorted(rows))
