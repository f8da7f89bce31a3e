"""The inspector window: chat on the left, live plots in the middle, events/checklist/layers below.

Every panel renders from ``(record, step)``: the live session's record with ``step=None``,
or a trace from a file (:mod:`kvinspect.gui.windows.trace_modes`: read-only, a replay slider sets ``step``; or a file
another process is writing, followed live). The controller (decoding the engine's stream) or the
follower's reader only appends to the record and marks the window dirty; the paint clock
(:mod:`kvinspect.gui.base.paint_clock`) then paints at the rate a person sees: the plots up to 10 times
a second while a model streams, the layer table, events, checklist and token view only when their
content changes (a turn or event, a moved slider), a hidden panel when it is shown. With nothing
dirty no timer runs. Every turn end, Stop and forced refresh paints every shown panel in full.

The model runs in its own process (:mod:`kvinspect.gui.engine_link.session_controller`, :mod:`kvinspect.engine`): a dead
engine leaves the window up with every finished turn, and Chat → Restart engine reloads the model. Evidence (save,
export, copy as Markdown) is in :mod:`kvinspect.gui.windows.trace_actions` and :mod:`kvinspect.gui.base.save_export_copy`; Tools → Compare in
:mod:`kvinspect.gui.windows.compare_window`.
"""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Iterator

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.settings import Settings, load_settings, save_settings
from kvinspect.core.units import fmt_count
from kvinspect.gui.base import gui_thread_gc
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.errors_and_logs import ErrorReporter
from kvinspect.gui.base.paint_clock import PaintClock, on_screen
from kvinspect.gui.base.screen_fit import fit_to_screens
from kvinspect.gui.base.status_text import StatusText
from kvinspect.gui.dialogs import about_dialog, policies_box
from kvinspect.gui.dialogs.model_picker import ModelPicker, dropped_path
from kvinspect.gui.engine_link.engine_requests import LoadRequest, ModelInfo, TurnRequest
from kvinspect.gui.engine_link.session_controller import SessionController
from kvinspect.gui.lanes.lanes_widget import PlotsWidget
from kvinspect.gui.panels import model_line
from kvinspect.gui.panels.chat_panel import ChatPanel
from kvinspect.gui.panels.checklist_panel import ChecklistPanel
from kvinspect.gui.panels.events_panel import EventsPanel
from kvinspect.gui.panels.find_box import FindBox, find_in
from kvinspect.gui.panels.layer_table import LayerTable
from kvinspect.gui.panels.tokens_panel import TokensPanel
from kvinspect.gui.windows.menus import build_menus, make_action
from kvinspect.gui.windows.trace_actions import TraceActions, is_trace_path
from kvinspect.gui.windows.trace_modes import TraceViewer

log = logging.getLogger(__name__)


class MainWindow(TraceActions, QtWidgets.QMainWindow):
    """Build with ``MainWindow(settings=..., session_options=...)``; ``load(spec)`` to start."""

    renderedTick = QtCore.Signal()  # after each paint of the clock

    def __init__(self, settings: Settings | None = None, session_options=None, autosave: bool = True,
                 persist: bool = True, parent=None, engine_cmd: list[str] | None = None, **_ignored):
        super().__init__(parent)
        self.setObjectName("kvinspect-main")
        self.settings = settings or load_settings()
        self.persist = persist  # False: never write the settings file (tests, screenshots)
        self.record = None
        self.step: int | None = None  # None: live (the latest step)
        self.info: ModelInfo | None = None
        self._closed = False
        self._panels_key = None  # what the panels last showed (turns, events, step): they repaint when it moves
        self._stale: set = set()  # panels skipped while hidden: rendered when shown
        self._pending_turn: TurnRequest | None = None
        self._last_request: LoadRequest | None = None
        self.errors = ErrorReporter(self)
        gui_thread_gc.acquire(QtWidgets.QApplication.instance())  # released in shutdown()
        self.controller = SessionController(session_options, autosave, engine_cmd=engine_cmd)
        self._restarting = False  # the next modelLoaded is a Restart engine: keep the transcript
        self.picker: ModelPicker | None = None
        self.evidence_jobs = 0  # saves/exports reading the record right now (no new turn meanwhile)
        self.tasks: list = []  # background jobs still running (joined at shutdown)
        self.export_dialog = None
        self.follow_dialog = None
        self.compare_window = None
        self.setWindowTitle("kvinspect")
        self.setAcceptDrops(True)
        self.setDockOptions(QtWidgets.QMainWindow.DockOption.AnimatedDocks
                            | QtWidgets.QMainWindow.DockOption.AllowTabbedDocks)
        self.clock = PaintClock(self._paint, paced=self._pace_engine, parent=self)
        self._build()
        self._connect()
        self._restore()

    # -- layout ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.plots = PlotsWidget()
        self.viewer = TraceViewer(self)
        central = QtWidgets.QWidget()
        cbox = QtWidgets.QVBoxLayout(central)
        cbox.setContentsMargins(0, 0, 0, 0)
        cbox.setSpacing(2)
        cbox.addWidget(self.viewer.bar)
        cbox.addWidget(self.plots, 1)
        self.setCentralWidget(central)
        self.chat = ChatPanel()
        self.events = EventsPanel()
        self.checklist = ChecklistPanel()
        self.layers = LayerTable()
        self.tokens = TokensPanel()
        self.chat_dock = self._dock("Chat", "chat", self.chat, QtCore.Qt.DockWidgetArea.LeftDockWidgetArea)
        self.events_dock = self._dock("Events", "events", self.events, QtCore.Qt.DockWidgetArea.BottomDockWidgetArea)
        self.check_dock = self._dock("Checklist", "checklist", self.checklist,
                                     QtCore.Qt.DockWidgetArea.BottomDockWidgetArea)
        self.layers_dock = self._dock("Layers", "layers", self.layers, QtCore.Qt.DockWidgetArea.BottomDockWidgetArea)
        self.setCorner(QtCore.Qt.Corner.BottomLeftCorner, QtCore.Qt.DockWidgetArea.LeftDockWidgetArea)
        self.splitDockWidget(self.events_dock, self.check_dock, QtCore.Qt.Orientation.Horizontal)
        self.tabifyDockWidget(self.check_dock, self.layers_dock)
        self.tokens_dock = self._dock("Tokens", "tokens", self.tokens, QtCore.Qt.DockWidgetArea.BottomDockWidgetArea)
        self.tabifyDockWidget(self.layers_dock, self.tokens_dock)
        self.check_dock.raise_()
        self.resizeDocks([self.chat_dock], [400], QtCore.Qt.Orientation.Horizontal)
        self.resizeDocks([self.events_dock, self.check_dock], [600, 400], QtCore.Qt.Orientation.Horizontal)
        self.resizeDocks([self.events_dock], [250], QtCore.Qt.Orientation.Vertical)

        # toolbar: the model and how to change it
        tb = self.addToolBar("Model")
        tb.setObjectName("model-toolbar")
        tb.setMovable(False)
        load = make_action(self, "load")
        tb.addAction(load)
        self.model_label = QtWidgets.QLabel("no model loaded")
        self.model_label.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.model_label.setContentsMargins(8, 0, 8, 0)
        tb.addWidget(self.model_label)
        # Edit → Find (Ctrl+F): a search box for the conversation, shown when asked for (Esc hides it).
        self.find_box = FindBox()
        self.find_box.returnPressed.connect(lambda: self.find_text(self.find_box.text()))
        self.find_box.dismissed.connect(self._hide_find)
        spacer = QtWidgets.QWidget()
        spacer.setSizePolicy(QtWidgets.QSizePolicy.Policy.Expanding, QtWidgets.QSizePolicy.Policy.Preferred)
        tb.addWidget(spacer)
        self.find_box_action = tb.addWidget(self.find_box)
        self.find_box_action.setVisible(False)

        # status bar: progress + Cancel while loading/fetching; steps; trace file
        sb = self.statusBar()
        self.progress = QtWidgets.QProgressBar()
        self.progress.setFixedWidth(180)
        self.progress.setVisible(False)
        self.cancel_button = QtWidgets.QPushButton("Cancel")
        self.cancel_button.setVisible(False)
        self.cancel_button.clicked.connect(self.cancel_load)
        self.restart_button = QtWidgets.QPushButton("Restart engine")
        self.restart_button.setToolTip("The model's process ended: start a new one, reload the model, new chat")
        self.restart_button.setVisible(False)
        self.restart_button.clicked.connect(self.restart_engine)
        self.steps_label = StatusText()  # (set at every paint of a stream: a QLabel would lay the window out)
        self.trace_label = QtWidgets.QLabel()
        self.trace_label.setMaximumWidth(360)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.cancel_button)
        sb.addPermanentWidget(self.restart_button)
        sb.addPermanentWidget(self.steps_label)
        sb.addPermanentWidget(self.trace_label)
        self.commands, self.menus = build_menus(self, {"load": load}, (self.chat_dock, self.events_dock,
                                                                         self.check_dock, self.layers_dock))
        from kvinspect.gui.base.accessibility import describe_window

        describe_window(self)

    def _dock(self, title: str, name: str, widget, area) -> QtWidgets.QDockWidget:
        d = QtWidgets.QDockWidget(title, self)
        d.setObjectName(f"dock-{name}")
        d.setWidget(widget)
        d.setFeatures(QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetMovable
                      | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetFloatable
                      | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(area, d)
        return d

    def _connect(self) -> None:
        c = self.controller
        c.progressed.connect(self._on_progress)
        c.modelLoaded.connect(self._on_loaded)
        c.fetched.connect(self._on_fetched)
        c.turnStarted.connect(self._on_turn_started)
        c.turnFinished.connect(self._on_turn_finished)
        c.failed.connect(self._on_failed)
        c.cancelled.connect(self._on_cancelled)
        c.busyChanged.connect(self._update_state)
        c.engineDied.connect(self._on_engine_died)
        c.engineState.connect(self._on_engine_state)
        c.autosavePaused.connect(self._show_autosave_paused)
        c.streamed.connect(self.clock.mark)
        c.firstOutput.connect(self.clock.release)
        self.plots.wantsPaint.connect(self.clock.interact)
        self.viewer.followPolled.connect(lambda st: st.changed and self.clock.mark())
        for panel, dock in self._panel_docks():
            # A tab raised, a dock reopened: its panel renders at the next paint (once it has its pixels).
            dock.visibilityChanged.connect(lambda on, panel=panel: on and panel in self._stale and self.clock.interact())
        self.chat.sendRequested.connect(self.send)
        self.chat.stopRequested.connect(self.stop)
        self.chat.newChatRequested.connect(self.new_chat)
        self.chat.turnClicked.connect(self.show_turn)
        self.events.eventSelected.connect(self.show_event)
        self.plots.eventClicked.connect(self.events.select)
        self.layers.layersSelected.connect(lambda rows: rows and self.plots.set_picked(rows))
        self.events.copyRequested.connect(self.copy_event)
        self.layers.copyRequested.connect(self.copy_layers)
        self.plots.loadRequested.connect(lambda: self.open_picker())
        self.viewer.opened.connect(self._remember_trace)
        self.viewer.modeChanged.connect(self._update_state)
        hints = QtGui.QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):  # Qt >= 6.5: the desktop switched light/dark
            # A bound method, not a lambda: Qt drops the connection with the window (tests make many).
            hints.colorSchemeChanged.connect(self._on_color_scheme)

    # -- settings -------------------------------------------------------------------------
    def _restore(self) -> None:
        s = self.settings
        g = s.window
        x, y, width, height = fit_to_screens(g.x, g.y, g.width, g.height)
        self.resize(width, height)
        if x is not None and y is not None:
            self.move(x, y)
        if g.state:
            try:
                self.restoreState(QtCore.QByteArray(base64.b64decode(g.state)))
            except (ValueError, TypeError):
                log.warning("settings: ignoring an unreadable window layout")
        if g.maximized:
            self.setWindowState(self.windowState() | QtCore.Qt.WindowState.WindowMaximized)
        self.chat.set_choice(self.chat.policy, s.policy)
        self.chat.set_choice(self.chat.cache_impl, s.cache_impl)
        self.chat.system.setPlainText(s.system_prompt)
        from kvinspect.core.session.script import GenerationSettings

        self.chat.apply_settings(GenerationSettings(max_new_tokens=s.max_new_tokens, do_sample=s.do_sample,
                                                    temperature=s.temperature, top_p=s.top_p, seed=s.seed))
        self.set_theme(s.theme, save=False)

    def save_settings(self) -> None:
        s = self.settings
        g = s.window
        geo = self.normalGeometry() if self.isMaximized() else self.geometry()
        g.x, g.y, g.width, g.height = geo.x(), geo.y(), geo.width(), geo.height()
        g.maximized = self.isMaximized()
        g.state = base64.b64encode(bytes(self.saveState())).decode("ascii")
        gs = self.chat.settings()
        s.policy, s.cache_impl = self.chat.policy.currentText(), self.chat.cache_impl.currentText()
        s.system_prompt = self.chat.system.toPlainText()
        s.max_new_tokens, s.do_sample, s.temperature = gs.max_new_tokens, gs.do_sample, gs.temperature
        s.top_p, s.seed = gs.top_p, gs.seed or 0
        s.picked_layers = list(self.plots.picked)
        if self.persist:
            save_settings(s)

    # -- actions --------------------------------------------------------------------------
    def open_picker(self, preset: str | None = None) -> ModelPicker:
        if self.picker is None:
            self.picker = ModelPicker(self)
            self.picker.loadRequested.connect(self.load_request)
            self.picker.fetchRequested.connect(self.fetch)
        s = self.settings
        self.picker.preset(preset or s.model or "tiny-gemma3", s.device, s.dtype, s.run_on, s.ssh_host, s.ssh_python)
        self.picker.show()
        self.picker.raise_()
        return self.picker

    def load(self, spec: str, device: str = "auto", dtype: str = "auto", trust_remote_code: bool = False,
             host: str | None = None, python: str | None = None) -> bool:
        """Load ``spec`` in the engine: on this machine, or on ``host`` over ssh (``python`` there)."""
        return self.load_request(LoadRequest(spec, device, dtype, trust_remote_code, host=host, python=python))

    def _refuse_ssh_host(self, host: str | None) -> bool:
        """True (after a dialog) when ``host`` is no ssh destination: one beginning with '-' is an ssh option."""
        from kvinspect.engine.launch import SshHostError, check_ssh_host

        if not host:
            return False
        try:
            check_ssh_host(host)
        except SshHostError as exc:
            self.errors.report("Cannot use that ssh host", str(exc))
            return True
        return False

    def load_request(self, req: LoadRequest) -> bool:
        if self._refuse_ssh_host(req.host):
            return False
        if not self.controller.load(req):
            self.errors.report("kvinspect", "busy: wait for the current generation or load to finish (or stop it)")
            return False
        self._last_request = req
        s = self.settings  # where it runs is remembered as asked (a host that failed is there to correct next time)
        s.run_on = "ssh" if req.host else "local"
        if req.host:
            s.ssh_host, s.ssh_python = req.host, req.python or ""
        self.statusBar().showMessage(f"loading {req.spec}" + (f" on {req.host}" if req.host else "") + "…")
        self._show_progress(True)
        self._sync_unloaded()
        return True

    def _sync_unloaded(self) -> None:
        """The engine was ended (a load or fetch elsewhere, a hard cancel): its model is gone from the window too."""
        if self.controller.info is None and self.info is not None:
            self.info = None
            self.model_label.setText("no model loaded")
            self._update_state()

    def fetch(self, name: str) -> None:
        host, python = self.picker.target() if self.picker is not None else (None, None)
        if self._refuse_ssh_host(host):
            return
        if self.controller.fetch(name, host, python):  # where the picker says the engine runs
            self._show_progress(True)
            self._sync_unloaded()

    def cancel_load(self) -> None:
        self.controller.cancel()
        self.statusBar().showMessage("cancelling… (at the next loading stage)")

    def send(self, req: TurnRequest) -> bool:
        if self.controller.dead is not None:
            self.errors.report("kvinspect", "the model's process has ended: Chat → Restart engine reloads the "
                                            "model (or load another one)")
            return False
        if self.info is None:
            self.errors.report("kvinspect", "load a model first (File → Load model…, Ctrl+L)")
            return False
        if self.viewer.mode:
            self.errors.report("kvinspect", "viewing a trace (read-only): File → Back to live session to chat")
            return False
        if self.evidence_jobs:
            self.errors.report("kvinspect", "a trace or report is being written from this session: "
                                            "send again in a moment")
            return False
        live = self.info.record
        index = len(live.turns) if live is not None else 0
        if not self.controller.send(req):
            return False
        self._pending_turn = req
        # The user's message goes in now, on this thread: the first tokens may be drained
        # before the controller's turnStarted arrives, and must land under it.
        self.chat.begin_turn(index, req.text, req.policy, req.cache_impl, images=req.images)
        self.chat.input.clear()
        self.chat.clear_images()
        self.statusBar().clearMessage()  # (the last turn's outcome)
        # Lay out and paint what the send changed (the message, the buttons, and the toolbar, which lays
        # the whole window out again when an action's state changes) before the request reaches the engine
        # (QProcess writes it from the event loop): not in the middle of the prompt's prefill, which wants
        # every core and whose length is the turn's time to first token.
        app = QtWidgets.QApplication.instance()
        app.sendPostedEvents(None, QtCore.QEvent.Type.LayoutRequest)
        app.sendPostedEvents(self, QtCore.QEvent.Type.UpdateRequest)
        return True

    def _trace_text(self, path: str | None) -> str:
        """The autosave's path elided at its start to the label's width: its file name, which names the
        session, stays whole (cut by characters, a wide font lost the name's end instead)."""
        if not path:
            return ""
        fm = self.trace_label.fontMetrics()
        room = self.trace_label.maximumWidth() - fm.horizontalAdvance("trace: ") - 2 * fm.averageCharWidth()
        return "trace: " + fm.elidedText(path, QtCore.Qt.TextElideMode.ElideLeft, max(room, 0))

    def stop(self) -> None:
        if self.controller.busy == "turn":
            self.controller.stop()
            self.statusBar().showMessage("stopping after the current token…")

    def restart_engine(self) -> bool:
        """Chat → Restart engine: a new model process, the same model reloaded, a new chat (the transcript stays)."""
        c = self.controller
        self._restarting = c.last_load is not None
        if not c.restart():
            self._restarting = False
            return False
        self.restart_button.setVisible(False)
        if c.busy == "load":
            self._show_progress(True)
            self.statusBar().showMessage(f"restarting the engine: loading {c.last_load.spec}…")
        self._update_state()
        return True

    def new_chat(self) -> None:
        if self.info is not None and self.controller.new_chat():
            self.chat.add_note("— new chat: conversation and cache cleared (the record keeps every turn) —")

    def show_turn(self, index: int) -> None:
        """Point at a turn: cursor at its first step, its checklist shown (viewing a trace: replay to its end)."""
        if self.record is None or not 0 <= index < len(self.record.turns):
            return
        if self.viewer.mode:
            self.viewer.show_turn(index)
            self.checklist.show_turn(index)
            self.check_dock.raise_()
            return
        self.plots.show_step(self.record.turns[index].first_step)
        self.checklist.show_turn(index)
        self.check_dock.raise_()

    def show_event(self, idx: int) -> None:
        if self.record is None or not 0 <= idx < len(self.record.events):
            return
        e = self.record.events[idx]
        self.plots.show_step(e.step, e.layers)
        self.tokens.pin(self.record, self.step, e.step, (e.data or {}).get("position"))
        self.checklist.show_turn(e.turn if e.turn < len(self.record.turns) - 1 else None)

    def set_theme(self, name: str, save: bool = True) -> None:
        """``system`` (follow the desktop, the default), ``dark`` or ``light``; the choice is what is remembered."""
        name = name if name in th.CHOICES else "system"
        t = th.get(name)
        app = QtWidgets.QApplication.instance()
        th.apply_palette(app, t)
        self.plots.apply_theme(t)
        self.chat.apply_theme(t)
        self.viewer.bar.apply_theme(t)
        if self.compare_window is not None:
            self.compare_window.apply_theme(t)
        self.commands[f"theme_{name}"].setChecked(True)
        self.settings.theme = name
        self.refresh(force=True)

    # -- desktop conventions: zoom, full screen, find, recent traces ----------------------
    @QtCore.Slot()
    def _on_color_scheme(self, *_args) -> None:
        if self.settings.theme == "system" and not self._closed:
            self.set_theme("system", save=False)

    def zoom_plots(self, factor: float) -> None:
        """Scale the steps in view by ``factor`` around the middle (0.5: zoom in); stops following."""
        self.plots.set_follow(False)
        self.plots.heat.plot.getViewBox().scaleBy(x=factor, y=1)  # the other lanes are x-linked to it

    def toggle_full_screen(self) -> None:
        self.setWindowState(self.windowState() ^ QtCore.Qt.WindowState.WindowFullScreen)
        self.commands["full_screen"].setChecked(self.isFullScreen())

    def show_find(self) -> None:
        self.find_box_action.setVisible(True)
        self.find_box.show()  # now, not at the toolbar's next layout pass: focus needs it shown
        self.find_box.setFocus()
        self.find_box.selectAll()

    def _hide_find(self) -> None:
        self.find_box_action.setVisible(False)
        self.find_box.hide()
        self.chat.input.setFocus()

    def _show_autosave_paused(self, message: str) -> None:
        self.trace_label.setText("⚠ autosave paused (disk full?)")
        self.trace_label.setStyleSheet("color: #e8a317; font-weight: 600")
        self.trace_label.setToolTip(message)
        self.statusBar().showMessage(message, 15000)

    def find_text(self, text: str, back: bool = False) -> bool:
        """Select the next (``back``: previous) ``text`` in the conversation, wrapping around; False if absent."""
        view = self.chat.pages.currentWidget()  # the live transcript, or the replayed one
        if not isinstance(view, QtWidgets.QTextBrowser):
            return False
        found = find_in(view, text, back)
        if text and not found:
            self.statusBar().showMessage(f"not found in the conversation: {text}", 4000)
        return found

    def _remember_trace(self, path: str) -> None:
        self.settings.remember_trace(path)

    def clear_recent_traces(self) -> None:
        self.settings.recent_traces = []

    def save_screenshot(self, path: str) -> bool:
        """Render everything now and save the window as PNG (exactly what is on screen)."""
        self.refresh(force=True)
        QtWidgets.QApplication.processEvents()
        self.refresh(force=True)
        ok = self.grab().save(str(path))
        if not ok:
            self.errors.report("kvinspect", f"could not write the screenshot {path}")
        return ok

    def save_screenshot_dialog(self) -> None:
        path, _ = QtWidgets.QFileDialog.getSaveFileName(self, "Save window screenshot", "kvinspect.png",
                                                        "PNG images (*.png)")
        if path:
            if self.save_screenshot(path):
                self.statusBar().showMessage(f"saved {path}", 5000)

    def show_about(self) -> None:
        about_dialog.show_about(self, self.info.trace_path if self.info else None)

    def show_policies(self) -> None:
        policies_box.show_policies(self)

    # -- controller results -----------------------------------------------------------------
    def _on_progress(self, task: str, stage: str, frac: float) -> None:
        if task in ("load", "fetch") and not self.progress.isVisible():
            self._show_progress(True)  # a load the window did not start itself: Restart engine's
        if task == "fetch" and self.picker is not None:
            self.picker.set_fetch_progress(stage, frac)
        self.statusBar().showMessage(f"{task}: {stage}…")
        if frac < 0:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(frac * 1000))

    def _show_model_line(self, info: ModelInfo) -> None:
        """The toolbar's model line, with the host when the engine runs over ssh."""
        host = self._last_request.host if self._last_request is not None else None
        self.model_label.setText(model_line.model_summary(info) + (f" · on <b>{html.escape(host)}</b>" if host else ""))

    def _on_loaded(self, info: ModelInfo) -> None:
        self._show_progress(False)
        self.restart_button.setVisible(False)
        restarted, self._restarting = self._restarting, False
        self.info = info
        gui_thread_gc.settle()  # the old model's cycles go now, the new one is frozen out of later GC passes
        if self.viewer.mode:
            self.viewer.back_to_live()  # loading a model is a live-session action: show it
        else:
            self.set_record(info.record)
        if restarted:
            self.chat.add_note("— engine restarted: a new chat (the turns above are in the previous autosave) —")
        else:
            self.chat.transcript.clear()
        self.chat.add_note(f"{info.name} loaded in {info.load_seconds:.1f} s on {info.device} ({info.dtype})."
                           + (" " + " ".join(info.notes) if info.notes else ""))
        self._show_model_line(info)
        self.setWindowTitle(f"kvinspect — {info.name}")
        self.trace_label.setText(self._trace_text(info.trace_path))
        self.trace_label.setToolTip(info.trace_path or "")
        self.statusBar().showMessage(f"{info.name} ready", 5000)
        if getattr(self.controller, "autosave_paused", None):  # a full disk: the warning stays in view
            self._show_autosave_paused(self.controller.live.paused)
        if self.settings.picked_layers and info.spec == self.settings.model:
            self.plots.set_picked(self.settings.picked_layers)  # the same model as last time: same curves
        if self._last_request is not None:
            self.settings.remember_model(self._last_request.spec)
            self.settings.device, self.settings.dtype = self._last_request.device, self._last_request.dtype
        self._update_state()

    def _on_fetched(self, path: str) -> None:
        self._show_progress(False)
        if self.picker is not None:
            self.picker.fetch_done(True)
        self.statusBar().showMessage(f"Fetched: {path}", 8000)

    def _on_turn_started(self, index: int) -> None:
        self._update_state()
        self.clock.hold()  # the prompt's prefill: the turn's start is painted with its first output

    def _on_turn_finished(self, turn) -> None:
        self.chat.append_tokens(self.controller.drain_tokens())
        live = self.info.record if self.info is not None else None  # the window may be showing a trace
        events = live.events_for_turn(turn.index) if live is not None else []
        self.chat.end_turn(turn, events)
        self._pending_turn = None
        self.checklist.show_turn(None)
        self.plots.refit()
        self.refresh(force=True)
        if live is not None and not self.viewer.mode:  # the toolbar's kinds: now what the cache did (3n: shared)
            self._show_model_line(self.info)
        # Until the next turn is sent, not for a few seconds: a message that times out repaints an idle window
        # (tens of milliseconds of cold caches), and the last turn's outcome belongs in a screenshot.
        self.statusBar().showMessage(f"turn {turn.index + 1}: {turn.status}")

    def _on_failed(self, task: str, message: str) -> None:
        self._show_progress(False)
        if task == "fetch" and self.picker is not None:
            self.picker.fetch_done(False, message)
        if task == "turn":
            self.chat.append_tokens(self.controller.drain_tokens())
            self.chat.add_note(f"not sent: {message}", th.STATUS_COLORS["fail"])
            self._pending_turn = None
        if task == "load" and not self.controller.restart_pending:
            self._restarting = False  # a failed reload: the next load is a fresh start
        if self.controller.dead is not None and task != "turn":
            return  # the engine's death is reported once, by _on_engine_died
        titles = {"load": "Could not load the model", "fetch": "Could not fetch", "turn": "Could not run the turn",
                  "compare": "Comparison failed"}
        self.statusBar().showMessage(f"{task} failed", 8000)
        self.errors.report(titles.get(task, "kvinspect"), message)

    def _on_engine_died(self, why: str) -> None:
        """The model's process ended: every finished turn stays; offer Restart engine."""
        self._show_progress(False)
        self._pending_turn = None
        if self.controller.restart_pending:  # the user's own Restart engine: no news, no dialog
            self.chat.add_note(f"— engine restarted ({why}) —")
            return
        self.restart_button.setVisible(True)
        self.chat.add_note(f"— the model's process ended ({why}); Chat → Restart engine reloads the model —",
                           th.STATUS_COLORS["fail"])
        self.statusBar().showMessage("the model's process ended: Restart engine to continue", 15000)
        self.plots.refit()
        self.refresh(force=True)
        self._update_state()
        if why.startswith("the engine did not start"):  # nothing was lost: the one line says what to do
            self.errors.report("The model's process did not start", why)
            return
        self.errors.report("The model's process ended", f"the model's process (the engine) ended: {why}; every "
                                                        "finished turn is kept (Chat → Restart engine reloads the model)")

    def _on_engine_state(self, state: str) -> None:
        if state == "unresponsive":
            self.statusBar().showMessage(f"the model's process has not answered for a while (busy: "
                                         f"{self.controller.busy or 'idle'}); Chat → Restart engine ends it")
            self.restart_button.setVisible(True)
        elif state == "ready" and self.controller.dead is None and not self._restarting:
            self.restart_button.setVisible(False)

    def _on_cancelled(self, task: str) -> None:
        self._show_progress(False)
        if task == "load" and self.controller.info is None and self.info is not None:
            # A hard cancel: the engine was restarted, and the model it held went with it.
            self.info = None
            self.model_label.setText("no model loaded (the engine was restarted to cancel the load)")
        if task == "fetch" and self.picker is not None:
            self.picker.fetch_done(False, "fetch cancelled")
        self.statusBar().showMessage(f"{task} cancelled", 5000)

    def _show_progress(self, on: bool) -> None:
        self.progress.setVisible(on)
        self.cancel_button.setVisible(on)
        if on:
            self.progress.setRange(0, 0)

    def _update_state(self, *args) -> None:
        busy = self.controller.busy
        viewing = self.viewer.mode
        alive = self.controller.dead is None
        self.chat.set_state(loaded=self.info is not None and alive, busy=bool(busy), generating=busy == "turn")
        self.plots.growing = (busy == "turn" and not viewing) or (viewing == "follow" and self.viewer.step is None)
        self.clock.streaming = busy == "turn" or viewing == "follow"
        if busy != "turn":
            self.clock.release()  # (a turn that ended, failed or stopped before any output)
        self.commands["load"].setEnabled(not busy)
        self.commands["stop"].setEnabled(busy == "turn")  # Esc stops the live turn even while a trace is shown
        self.commands["new_chat"].setEnabled(self.info is not None and alive and not busy and not viewing)
        self.commands["restart"].setEnabled(not self._closed)
        self.commands["back"].setEnabled(bool(viewing))
        self.commands["compare"].setEnabled(self.info is not None and alive and busy in ("", "check", "compare"))
        if busy == "compare":  # say why the chat waits, for as long as it waits
            self.statusBar().showMessage("comparing configurations (Tools → Compare): the chat waits until it ends")

    # -- rendering ------------------------------------------------------------------------
    def set_record(self, record, step: int | None = None) -> None:
        """Show ``record`` (live: step None). Every panel renders from these two values."""
        self.record, self.step = record, step
        self.refresh(force=True)

    def _panel_docks(self):
        return ((self.events, self.events_dock), (self.checklist, self.check_dock),
                (self.layers, self.layers_dock), (self.tokens, self.tokens_dock))

    def refresh(self, force: bool = False) -> None:
        """Paint every shown panel from ``(record, step)`` now (hidden ones when shown)."""
        r, s = self.record, self.step
        if on_screen(self.plots) or force:
            self.plots.render(r, s, force=force)
        self._render_panels(r, s)
        self._panels_key = self._content_key(r, s)

    def _render_panels(self, r, s) -> None:
        for panel, _dock in self._panel_docks():
            if on_screen(panel) or r is None:
                self._stale.discard(panel)
                panel.render(r, s)
            else:
                self._stale.add(panel)
        self.events_dock.setWindowTitle(f"Events ({self.events.count()})" if r is not None else "Events")
        if r is not None:
            self._show_steps(r)

    def _show_steps(self, r) -> None:
        """The status bar's step count (``StatusText``: it repaints itself, and only widens)."""
        self.steps_label.setText(f"{fmt_count(r.n_steps, 'step')} · {fmt_count(len(r.turns), 'turn')}")

    @staticmethod
    def _content_key(r, s):
        """What the panels other than the plots show changes with this: turns, their states, events, the step."""
        if r is None:
            return None
        with r.lock:
            return id(r), s, len(r.events), tuple(t.status for t in r.turns)

    def _pace_engine(self, every_s: float) -> None:
        """A live frame was painted: the engine's stream comes at the window's paint rate."""
        if self.controller.busy == "turn":
            self.controller.pace(every_s)

    def _paint(self) -> Iterator[None]:
        """The paint clock's paint: tokens in one batch, the plots, and the panels whose content moved.

        In two parts: Qt paints the transcript's new text before the plots are rendered (see
        :class:`PaintClock`), so the GUI thread is not held for the whole frame at once; a frame that
        moves the plots' view (a range step, a turn's start) paints them in a third part, after the
        event loop has had a turn between their render and that paint of every lane. (Each part is a
        paint of the window: a third, for the panels and the status bar's step count, cost more than it
        split.) Where a whole frame a second is dearer than the window's CPU budget, the clock ends some
        live frames after the first part: the text moves every second, the rest on a share of them.
        """
        text = self.controller.drain_tokens()
        if text:
            self.chat.append_tokens(text)
            yield
        r = self.record  # (read after the part: a turn clicked meanwhile is what the rest shows)
        if r is not None:
            if on_screen(self.plots):
                self.plots.render(r, self.step, hold_whole=True)
            for panel in [p for p in self._stale if on_screen(p)]:
                self._stale.discard(panel)
                panel.render(r, self.step)
            key = self._content_key(r, self.step)
            if key != self._panels_key:
                self._panels_key = key
                if self.viewer.mode:
                    self.viewer.update()
                self._render_panels(r, self.step)
            else:
                self._show_steps(r)
        if self.plots.held:  # a moved view repaints every lane: Qt's paint of them in a part of its own
            try:
                yield
            finally:
                self.plots.release_paint()
        self.renderedTick.emit()

    # -- Qt events ------------------------------------------------------------------------
    def dragEnterEvent(self, e: QtGui.QDragEnterEvent) -> None:
        if dropped_path(e.mimeData()):
            e.acceptProposedAction()

    def dropEvent(self, e: QtGui.QDropEvent) -> None:
        path = dropped_path(e.mimeData())
        if path:
            # A trace (a .jsonl file, or a run's folder holding trace.jsonl) opens for viewing; anything
            # else is a model for the picker (a .gguf, a model folder).
            if is_trace_path(path):
                self.open_trace(path)
            else:
                self.open_picker(path)
            e.acceptProposedAction()

    def closeEvent(self, e: QtGui.QCloseEvent) -> None:
        self.shutdown()
        super().closeEvent(e)

    def shutdown(self) -> None:
        """Save settings, shut the engine down (killed after a grace). Idempotent; also runs on aboutToQuit."""
        if self._closed:
            return
        self._closed = True
        self.clock.stop()
        try:
            self.save_settings()
        except Exception:  # noqa: BLE001 - closing must never fail over settings
            log.exception("saving settings failed")
        self.errors.close_all()
        if self.picker is not None:
            self.picker.close()
        for d in (self.export_dialog, self.follow_dialog, self.compare_window):
            if d is not None:
                d.close()
        self.hide()
        self.viewer.shutdown()
        self.controller.shutdown()
        for task in list(self.tasks):  # a report still rendering: let it finish writing its folder
            task.wait()
        gui_thread_gc.release()


