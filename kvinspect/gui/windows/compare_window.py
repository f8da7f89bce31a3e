"""Tools → Compare configurations… (Ctrl+K): ``kvinspect compare`` for the window's loaded model.

The comparison runs :func:`kvinspect.core.compare.run.run_compare` in the window's engine, the
process that owns the model (:meth:`SessionController.compare`): while it runs the controller is
busy, so the chat cannot use the model at the same time, and the chat session's observer is idle
between turns, so nothing of the comparison lands in the chat's record. What comes back is the
``compare.json`` document (after every run, and at the end), never a Python object.
Progress comes after every turn, the table after every finished run, the plots
(:func:`.render_compare.build_figures`, in the window's theme) at the end. Cancel stops the turn
in progress at its next token; what finished is kept. Export writes the same files as the CLI
(``compare.md``, ``compare.json``, plots, every run's trace) with
:func:`kvinspect.core.compare.report.write_report_doc`, off the GUI thread.
"""

from __future__ import annotations

import gc
import html
import shutil
from pathlib import Path

from PySide6 import QtCore, QtWidgets

from kvinspect.core.compare.configs import CONFIG_HELP, NAMED
from kvinspect.core.errors import KvInspectError, ScriptError
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.accessibility import fill_missing
from kvinspect.gui.base.accessibility import name as _name
from kvinspect.gui.base.background_jobs import BackgroundTask
from kvinspect.gui.engine_link.engine_requests import CompareRequest
from kvinspect.gui.windows.compare_results import CompareResults, compare_dir

#: The loaded model's own environment, when another is compared with it.
HERE = "here"

DEFAULT_CHECKED = ("dynamic", "static", "nocache")


class CompareWindow(QtWidgets.QWidget):
    """A top-level window owned by the main window; one comparison at a time."""

    runFinished = QtCore.Signal(object)  # the compare.json document (also after a Cancel)
    exported = QtCore.Signal(object)  # core.compare_report.CompareFiles

    def __init__(self, win):
        super().__init__(win, QtCore.Qt.WindowType.Window)
        self.setObjectName("compare-window")
        self.win = win
        self.ctrl = win.controller
        self.result = None  # the finished comparison: its compare.json document, as the engine sent it
        self.data: dict | None = None
        self.out_dir: Path | None = None
        self.running = False
        self.reasons: dict[str, str | None] = {}
        self.pending: set[str] = set()
        self._checked_spec: str | None = None
        self._check_wanted = False
        self._export_task: BackgroundTask | None = None
        self.export_dir: Path | None = None
        self._theme = th.get(win.settings.theme)
        self.setWindowTitle("Compare cache configurations")
        self._build()
        c = self.ctrl
        c.configChecked.connect(self._on_checked)
        c.compareProgress.connect(self._on_progress)
        c.compareUpdated.connect(self._on_updated)
        c.compareFinished.connect(self._on_finished)
        c.failed.connect(self._on_failed)
        c.busyChanged.connect(self._on_busy)
        c.modelLoaded.connect(lambda *_: self.isVisible() and self.open_for_model())
        self.resize(1280, 800)

    # -- layout ---------------------------------------------------------------------------------
    def _build(self) -> None:
        self.model_label = QtWidgets.QLabel()
        self.model_label.setWordWrap(True)
        self.model_label.setTextFormat(QtCore.Qt.TextFormat.RichText)

        cfg_box = QtWidgets.QGroupBox("Configurations")
        grid = QtWidgets.QGridLayout(cfg_box)
        grid.setVerticalSpacing(2)
        self.checks: dict[str, QtWidgets.QCheckBox] = {}
        self.notes: dict[str, QtWidgets.QLabel] = {}
        for i, name in enumerate(NAMED):
            cb = QtWidgets.QCheckBox(name)
            cb.setToolTip(CONFIG_HELP.get(name, name))
            cb.setChecked(name in DEFAULT_CHECKED)
            _name(cb, f"Configuration {name}", CONFIG_HELP.get(name, name))
            note = QtWidgets.QLabel()
            note.setWordWrap(True)
            note.setTextFormat(QtCore.Qt.TextFormat.RichText)
            note.setSizePolicy(QtWidgets.QSizePolicy.Policy.Ignored, QtWidgets.QSizePolicy.Policy.Preferred)
            grid.addWidget(cb, 2 * i, 0)
            grid.addWidget(note, 2 * i + 1, 0)
            self.checks[name], self.notes[name] = cb, note
        from kvinspect.core.session.policies import POLICIES

        self.extra = QtWidgets.QLineEdit()
        self.extra.setPlaceholderText("also: recreate, refeed, recreate:static …")
        self.extra.setToolTip("More configurations, comma-separated: a policy (" + ", ".join(POLICIES[1:])
                              + ") measures that mistake on a dynamic cache; POLICY:IMPL picks the cache too")
        grid.addWidget(self.extra, 2 * len(NAMED), 0)
        _name(self.extra, "More configurations", self.extra.toolTip())

        conv = QtWidgets.QGroupBox("Conversation")
        form = QtWidgets.QGridLayout(conv)
        self.use_chat = QtWidgets.QRadioButton("This &chat's user turns")
        self.use_file = QtWidgets.QRadioButton("Sc&ript file")
        self.use_chat.setChecked(True)
        self.script_path = QtWidgets.QLineEdit()
        self.script_path.setPlaceholderText("chat script .json (see docs/trace-format.md)")
        browse = QtWidgets.QPushButton("…")
        browse.setFixedWidth(32)
        browse.clicked.connect(self._browse_script)
        self.script_path.textEdited.connect(lambda *_: self.use_file.setChecked(True))
        self.repeat = QtWidgets.QSpinBox(minimum=1, maximum=50, value=3)
        self.repeat.setToolTip("Measured repeats per configuration; configurations are interleaved between repeats")
        self.max_new = QtWidgets.QSpinBox(minimum=1, maximum=8192, value=32)
        self.max_new.setToolTip("max_new_tokens of every turn")
        self.capacity = QtWidgets.QSpinBox(minimum=0, maximum=1_000_000, value=0, singleStep=256)
        self.capacity.setSpecialValueText("default")
        self.capacity.setToolTip("Rows of a static cache (default: min(max_position_embeddings, 2048))")
        form.addWidget(self.use_chat, 0, 0, 1, 3)
        form.addWidget(self.use_file, 1, 0)
        form.addWidget(self.script_path, 1, 1)
        form.addWidget(browse, 1, 2)
        labels = {}
        for text, buddy in (("R&epeats", self.repeat), ("&Max new tokens", self.max_new),
                            ("&Static capacity", self.capacity)):
            labels[text] = QtWidgets.QLabel(text)
            labels[text].setBuddy(buddy)
        form.addWidget(labels["R&epeats"], 2, 0)
        form.addWidget(self.repeat, 2, 1, 1, 2)
        form.addWidget(labels["&Max new tokens"], 3, 0)
        form.addWidget(self.max_new, 3, 1, 1, 2)
        form.addWidget(labels["&Static capacity"], 4, 0)
        form.addWidget(self.capacity, 4, 1, 1, 2)
        form.setColumnStretch(1, 1)

        env_box = self._build_envs()

        self.run_button = QtWidgets.QPushButton("R&un comparison")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.start)
        self.cancel_button = QtWidgets.QPushButton("C&ancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status = QtWidgets.QLabel()
        self.status.setWordWrap(True)
        self.status.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.status.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        self.export_button = QtWidgets.QPushButton("E&xport…")
        self.export_button.setToolTip("compare.md, compare.json, plots and every run's trace, into a folder")
        self.export_button.setEnabled(False)
        self.export_button.clicked.connect(lambda: self.export())
        self.open_button = QtWidgets.QPushButton("&Open folder")
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self._open_folder)
        run_row = QtWidgets.QHBoxLayout()
        run_row.addWidget(self.run_button, 1)
        run_row.addWidget(self.cancel_button)
        out_row = QtWidgets.QHBoxLayout()
        out_row.addWidget(self.export_button, 1)
        out_row.addWidget(self.open_button)

        setup = QtWidgets.QWidget()
        sbox = QtWidgets.QVBoxLayout(setup)
        sbox.setContentsMargins(6, 6, 6, 6)
        sbox.addWidget(self.model_label)
        sbox.addWidget(cfg_box)
        sbox.addWidget(conv)
        sbox.addWidget(env_box)
        sbox.addLayout(run_row)
        sbox.addWidget(self.progress)
        sbox.addWidget(self.status)
        sbox.addStretch(1)
        sbox.addLayout(out_row)
        scroll = QtWidgets.QScrollArea()
        scroll.setWidget(setup)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(310)
        scroll.setMaximumWidth(380)

        self.results = CompareResults()
        # The tests and the screenshots script reach these directly.
        self.summary, self.table, self.tabs = self.results.summary, self.results.table, self.results.tabs
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        split.addWidget(scroll)
        split.addWidget(self.results)
        split.setStretchFactor(1, 1)
        box = QtWidgets.QVBoxLayout(self)
        box.setContentsMargins(4, 4, 4, 4)
        box.addWidget(split)
        self._describe(browse)

    def _build_envs(self) -> QtWidgets.QGroupBox:
        """Where else to run it: another Python (another transformers version) or an ssh host, as the model
        picker's "Run on". Each environment's configurations then run in their own engine children."""
        box = QtWidgets.QGroupBox("Environments")
        box.setToolTip("Compare the same conversation in another environment too: each configuration runs in "
                       "its own engine there and here, and the report says where their caches part")
        grid = QtWidgets.QGridLayout(box)
        self.env_on = QtWidgets.QCheckBox("Also run in another e&nvironment")
        self.env_name = QtWidgets.QLineEdit("other")
        self.env_name.setToolTip("A short name for it (letters, digits, . _ -): report columns and run folders")
        self.env_local = QtWidgets.QRadioButton("this machine")
        self.env_ssh = QtWidgets.QRadioButton("ssh host")
        self.env_local.setChecked(True)
        group = QtWidgets.QButtonGroup(box)
        group.addButton(self.env_local)
        group.addButton(self.env_ssh)
        self.env_host = QtWidgets.QLineEdit()
        self.env_host.setPlaceholderText("user@host or an ssh config alias")
        self.env_python = QtWidgets.QLineEdit()
        self.env_python.setPlaceholderText("another venv's bin/python")
        self.env_python.setToolTip("The Python of the other environment, with kvinspect installed (for example a "
                                   "venv with another transformers version); on an ssh host, empty is python3")
        grid.addWidget(self.env_on, 0, 0, 1, 3)
        grid.addWidget(QtWidgets.QLabel("Name"), 1, 0)
        grid.addWidget(self.env_name, 1, 1, 1, 2)
        grid.addWidget(QtWidgets.QLabel("Run on"), 2, 0)
        grid.addWidget(self.env_local, 2, 1)
        grid.addWidget(self.env_ssh, 2, 2)
        grid.addWidget(self.env_host, 3, 1, 1, 2)
        grid.addWidget(QtWidgets.QLabel("Python"), 4, 0)
        grid.addWidget(self.env_python, 4, 1, 1, 2)
        grid.setColumnStretch(1, 1)
        for w in (self.env_name, self.env_local, self.env_ssh, self.env_host, self.env_python):
            self.env_on.toggled.connect(w.setEnabled)
            w.setEnabled(False)
        self.env_ssh.toggled.connect(lambda on: self.env_host.setEnabled(on and self.env_on.isChecked()))
        self.env_on.toggled.connect(lambda on: self.env_host.setEnabled(on and self.env_ssh.isChecked()))
        _name(self.env_on, "Also run in another environment", box.toolTip())
        _name(self.env_name, "Environment name", self.env_name.toolTip())
        _name(self.env_host, "Environment ssh host", "An ssh destination for the other environment")
        _name(self.env_python, "Environment Python", self.env_python.toolTip())
        return box

    def environments(self) -> list[dict]:
        """The environments the controls describe (empty: this engine alone); KvInspectError for a mistake."""
        if not self.env_on.isChecked():
            return []
        name = self.env_name.text().strip()
        python = self.env_python.text().strip() or None
        host = self.env_host.text().strip() if self.env_ssh.isChecked() else None
        if not name or name == HERE:
            raise ScriptError(f"give the other environment a name other than {HERE!r}")
        if self.env_ssh.isChecked() and not host:
            raise ScriptError("give the other environment's ssh host")
        if not host and not python:
            raise ScriptError("give the other environment's Python (for example another venv's bin/python)")
        return [{"name": HERE, "python": None, "host": None}, {"name": name, "python": python, "host": host}]

    def _describe(self, browse: QtWidgets.QPushButton) -> None:
        _name(self.use_chat, "Use this chat's user turns", "Replay the user turns of the main window's chat "
              "(its system prompt and settings too)")
        _name(self.use_file, "Use a script file", "Replay the turns of a chat script .json")
        _name(self.script_path, "Script file", "The chat script .json to replay (see docs/trace-format.md)")
        _name(browse, "Choose a script file", "Pick the chat script .json to replay")
        _name(self.repeat, "Repeats", self.repeat.toolTip())
        _name(self.max_new, "Max new tokens", "max_new_tokens of every turn")
        _name(self.capacity, "Static capacity", self.capacity.toolTip() + "; 0 is the default")
        _name(self.run_button, "Run comparison", "Run every picked configuration on the loaded model; the chat "
              "pauses while it runs")
        _name(self.cancel_button, "Cancel", "Stop the turn in progress at its next token; what finished is kept")
        _name(self.progress, "Comparison progress", "Turns run of all the comparison's turns")
        _name(self.export_button, "Export", self.export_button.toolTip())
        _name(self.open_button, "Open folder", "Open the exported comparison's folder in the file manager")
        self.setAccessibleName("Compare cache configurations")
        self.setAccessibleDescription("Run the loaded model's conversation with several cache configurations "
                                      "and compare latency, memory and replies")
        fill_missing(self)  # a control added later is never silent

    # -- opening --------------------------------------------------------------------------------
    def open_for_model(self) -> None:
        """Show the window for the model loaded now; check which configurations can run (once per model)."""
        info = self.win.info
        if info is None:
            self.model_label.setText("<b>No model loaded.</b> Load one in the main window first (Ctrl+L).")
        else:
            self.model_label.setText(f"<b>{html.escape(info.name)}</b> · {html.escape(info.cls)} · {info.n_layers} "
                                     f"layers · {html.escape(info.device)} · {html.escape(info.dtype)}")
            self.setWindowTitle(f"Compare cache configurations — {info.name}")
            if info.spec != self._checked_spec:
                self._checked_spec = info.spec
                self.reasons.clear()
                self.pending = set(NAMED)
                self._check_wanted = True
        turns = self._chat_turns()
        self.use_chat.setText(f"This &chat's user turns ({len(turns)})")
        self.use_chat.setAccessibleName(f"Use this chat's user turns ({len(turns)})")
        if not turns and not self.script_path.text():
            self.use_chat.setChecked(True)
        self.max_new.setValue(min(self.win.chat.max_new.value(), 8192))
        self._request_check()
        self._refresh_checks()
        self._update_buttons()
        self.show()
        self.raise_()
        self.activateWindow()

    def _browse_script(self) -> None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Chat script", self.script_path.text() or str(Path.cwd()),
                                                        "chat scripts (*.json);;All files (*)")
        if path:
            self.script_path.setText(path)
            self.use_file.setChecked(True)

    def _request_check(self) -> None:
        if self._check_wanted and self.win.info is not None and self.ctrl.check_configs(list(NAMED)):
            self._check_wanted = False

    def _chat_turns(self) -> list[str]:
        info = self.win.info
        if info is None or info.record is None:
            return []
        with info.record.lock:
            return [t.user for t in info.record.turns if t.user.strip()]

    def _refresh_checks(self) -> None:
        dim = self._theme.dim_text
        for name, cb in self.checks.items():
            note = self.notes[name]
            if name in self.pending:
                note.setText(f"<span style='color:{dim}'>checking…</span>")
                cb.setEnabled(False)
            elif self.reasons.get(name):
                note.setText(f"<span style='color:{th.STATUS_COLORS['warn']}'>not here: "
                             f"{html.escape(self.reasons[name])}</span>")
                cb.setEnabled(False)
                cb.setChecked(False)
            else:
                note.setText(f"<span style='color:{dim}'>{html.escape(CONFIG_HELP.get(name, ''))}</span>")
                cb.setEnabled(not self.running)
            note.setToolTip(note.text())

    def _on_checked(self, name: str, reason) -> None:
        self.pending.discard(name)
        self.reasons[name] = reason
        self._refresh_checks()

    def _on_busy(self, busy: bool) -> None:
        if not busy:
            self._request_check()  # asked while a turn was running
        self._update_buttons()

    def _update_buttons(self) -> None:
        idle = not self.ctrl.busy
        self.run_button.setEnabled(self.win.info is not None and idle and not self.running)
        self.cancel_button.setEnabled(self.running)
        has = self.result is not None and not self.running
        self.export_button.setEnabled(has and not (self._export_task and self._export_task.running))
        for w in (self.extra, self.use_chat, self.use_file, self.script_path, self.repeat, self.max_new,
                  self.capacity):
            w.setEnabled(not self.running)

    # -- running --------------------------------------------------------------------------------
    def selected(self) -> list[str]:
        names = [n for n, cb in self.checks.items() if cb.isChecked() and cb.isEnabled()]
        extra = [x.strip() for x in self.extra.text().split(",") if x.strip()]
        return names + extra

    def set_selected(self, names: list[str]) -> None:
        """Tick exactly ``names`` among the known configurations (tests, scripted screenshots)."""
        for n, cb in self.checks.items():
            cb.setChecked(n in names)

    def build_plan(self):
        """The ComparePlan the controls describe; raises KvInspectError (one line) for a mistake."""
        from kvinspect.core.compare.configs import parse_configs
        from kvinspect.core.compare.plan import ComparePlan
        from kvinspect.core.session.script import ChatScript, load_script

        if self.pending & {n for n, cb in self.checks.items() if cb.isChecked()}:
            raise ScriptError("still checking which configurations can run here; a moment")
        names = self.selected()
        if not names:
            raise ScriptError("pick at least one configuration")
        configs = parse_configs(",".join(names))
        chat = self.win.chat
        if self.use_file.isChecked():
            path = self.script_path.text().strip()
            if not path:
                raise ScriptError("give a script file, or use this chat's user turns")
            script = load_script(path)
            name = Path(path).name
        else:
            turns = self._chat_turns()
            if not turns:
                raise ScriptError("this chat has no turns yet: chat first, or pick a script file")
            system = chat.system.toPlainText().strip() or None
            script = ChatScript(turns=turns, system=system, settings=chat.settings())
            name = None
        opts = self.ctrl.session_options
        plan = ComparePlan(configs=configs, script=script, repeat=self.repeat.value(),
                           max_new_tokens=self.max_new.value(), max_cache_len=self.capacity.value() or None,
                           chat_template=getattr(opts, "chat_template", None),
                           chat_template_name=getattr(opts, "chat_template_name", None), script_name=name)
        return plan.validate()

    def start(self) -> bool:
        """Run the comparison the controls describe (the Run button)."""
        if self.running:
            return False
        info = self.win.info
        try:
            if info is None:
                raise ScriptError("load a model first (Ctrl+L in the main window)")
            plan = self.build_plan()
            envs = self.environments()
        except KvInspectError as exc:
            self._say(str(exc), error=True)
            return False
        out = compare_dir(info.name)
        out.mkdir(parents=True, exist_ok=True)
        plan.script.save(out / "script.json")  # the command below reruns it from the folder
        plan.command = self._command(info, plan, envs)
        gc.collect()  # the window's garbage goes now, not in the middle of the progress updates
        if not self.ctrl.compare(CompareRequest(plan, str(out), envs)):
            self._say("the model is busy (a turn or a load): try again when it is done", error=True)
            return False
        self.out_dir, self.result, self.data, self.export_dir = out, None, None, None
        self.running = True
        self.progress.setRange(0, 0)
        self._say(f"running {', '.join(c.name for c in plan.configs)} × {plan.repeat}…")
        self.results.clear()
        self.open_button.setEnabled(False)
        self._refresh_checks()
        self._update_buttons()
        self.win.statusBar().showMessage("comparing configurations… the chat waits until it is done", 8000)
        return True

    @staticmethod
    def _command(info, plan, envs: list[dict] | None = None) -> list[str]:
        cmd = ["kvinspect", "compare", "--model", info.spec, "--device", info.device, "--dtype", info.dtype,
               "--script", "script.json", "--configs", ",".join(c.name for c in plan.configs),
               "--repeat", str(plan.repeat), "--max-new-tokens", str(plan.settings.max_new_tokens)]
        if plan.max_cache_len:
            cmd += ["--max-cache-len", str(plan.max_cache_len)]
        if plan.chat_template_name:
            cmd += ["--chat-template", plan.chat_template_name]
        for e in envs or []:
            where = f"ssh:{e['host']}:{e['python'] or 'python3'}" if e.get("host") else (e.get("python") or "python")
            cmd += ["--env", f"{e['name']}={where}"]
        return cmd + ["--out", "compare-rerun"]

    def cancel(self) -> None:
        """Stop at the next token; every finished run is kept and shown."""
        if self.running:
            self.ctrl.cancel()
            self._say("cancelling at the next token…")

    def _on_progress(self, done: int, total: int, message: str) -> None:
        if not self.running:
            return
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.status.setText(f"{done}/{total} turns · {html.escape(message)}")

    def _on_updated(self, data: dict) -> None:
        if self.running:
            self.results.show_table(data)

    def _on_finished(self, data: dict) -> None:
        self.running = False
        self.result, self.data = data, data
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if not data.get("cancelled") else 0)
        self.results.show_table(data)
        self.results.show_summary(data)
        self.results.show_figures(data, self._theme)
        ran = sum(1 for c in data["configs"] if c["status"] == "ran")
        self._say(("Cancelled: " if data.get("cancelled") else "Done: ")
                  + f"{ran} configuration(s) measured in {data['wall_s']:.1f} s. Runs are in "
                  f"<tt>{html.escape(str(self.out_dir))}</tt>; Export… writes compare.md, compare.json and plots.")
        self._refresh_checks()
        self._update_buttons()
        self.win.statusBar().showMessage("comparison " + ("cancelled" if data.get("cancelled") else "done"), 6000)
        self.runFinished.emit(data)

    def _on_failed(self, task: str, message: str) -> None:
        if task != "compare":
            return
        self.running = False
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self._say(message, error=True)
        self._refresh_checks()
        self._update_buttons()

    def rows(self) -> list[list[str]]:
        """The table as shown (tests)."""
        return self.results.rows()

    def apply_theme(self, t: th.Theme) -> None:
        self._theme = t
        self._refresh_checks()
        if self.data is not None and not self.running:
            self.results.show_figures(self.data, self._theme)

    def _say(self, text: str, error: bool = False) -> None:
        body = html.escape(text) if error else text
        self.status.setText(f"<span style='color:{th.STATUS_COLORS['fail']}'>{body}</span>" if error else body)

    # -- export ---------------------------------------------------------------------------------
    def export(self, dest: str | None = None) -> BackgroundTask | None:
        """compare.md, compare.json, plots and the runs into ``dest`` (asked for when None), off this thread."""
        from kvinspect.child_render import render_in_child
        from kvinspect.core.compare.report import write_report_doc

        if self.result is None or self.running:
            return None
        if dest is None:
            dest = QtWidgets.QFileDialog.getExistingDirectory(self, "Folder for the comparison", str(Path.home()))
            if not dest:
                return None
        out = Path(dest).expanduser()
        data, src = self.result, self.out_dir

        def job():
            try:
                # Off the GUI thread: a child draws the plots.
                files = write_report_doc(data, out, src_dir=src, renderer=render_in_child)
                if src is not None and (src / "script.json").is_file() and not (out / "script.json").exists():
                    shutil.copyfile(src / "script.json", out / "script.json")
                return files
            except OSError as exc:
                raise KvInspectError(f"cannot write the comparison to {out}: {exc.strerror or exc}") from None

        task = BackgroundTask(job, "export-compare", parent=self)
        task.done.connect(self._on_exported)
        task.failed.connect(lambda msg: self._say(msg, error=True))
        task.failed.connect(lambda *_: self._update_buttons())
        self._export_task = task.start()
        self.export_dir = out
        self._say(f"exporting to <tt>{html.escape(str(out))}</tt> (rendering the plots)…")
        self._update_buttons()
        return task

    def _on_exported(self, files) -> None:
        names = [files.markdown.name, files.json.name] + [f"plots/{p.name}" for p in files.plots]
        notes = "".join(f"<br><i>{html.escape(n)}</i>" for n in files.notes)
        self._say(f"Exported to <tt>{html.escape(str(self.export_dir))}</tt>: {html.escape(', '.join(names))}, "
                  f"runs/{notes}")
        self.open_button.setEnabled(True)
        self._update_buttons()
        self.exported.emit(files)

    def _open_folder(self) -> None:
        from kvinspect.gui.base.save_export_copy import open_folder

        if self.export_dir is not None:
            open_folder(self.export_dir)

    def closeEvent(self, e) -> None:
        # Closing the window ends the comparison: otherwise the chat would stay paused with nothing on screen
        # saying why. What finished is kept and shown when the window opens again.
        self.cancel()
        if self._export_task is not None:
            self._export_task.wait()
        super().closeEvent(e)
