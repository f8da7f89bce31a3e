"""The chat pane: system prompt, transcript, next-turn settings, input box, Send and Stop.

The transcript is append-only: streamed text is inserted at the end once per paint tick
(never re-set), and each finished turn gets a line with its token counts and timings that
links to the turn in the plots.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.session.policies import CACHE_HELP, CACHE_IMPLS, POLICIES, POLICY_HELP
from kvinspect.core.session.script import GenerationSettings
from kvinspect.gui.base import theme as th
from kvinspect.gui.engine_link.engine_requests import TurnRequest

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")


class ChatInput(QtWidgets.QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a newline; image files dropped or a picture pasted attach to the message."""

    submitted = QtCore.Signal()
    imagesDropped = QtCore.Signal(list)  # file paths
    _paste_dir: str | None = None

    def _images_in(self, source: QtCore.QMimeData) -> list[str]:
        files = [u.toLocalFile() for u in source.urls() if u.isLocalFile()] if source.hasUrls() else []
        return [f for f in files if f.lower().endswith(IMAGE_SUFFIXES)]

    def canInsertFromMimeData(self, source: QtCore.QMimeData) -> bool:
        return bool(self._images_in(source)) or source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QtCore.QMimeData) -> None:
        files = self._images_in(source)
        if not files and source.hasImage() and not source.hasText():
            image = QtGui.QImage(source.imageData())
            if not image.isNull():
                # A pasted picture has no file: the engine reads files, so it gets one (kept for the session).
                import tempfile

                if ChatInput._paste_dir is None:
                    ChatInput._paste_dir = tempfile.mkdtemp(prefix="kvinspect-pasted-")
                path = str(Path(ChatInput._paste_dir) / f"pasted-{len(list(Path(ChatInput._paste_dir).iterdir())) + 1}.png")
                if image.save(path, "PNG"):
                    files = [path]
        if files:
            self.imagesDropped.emit(files)
            return
        super().insertFromMimeData(source)

    def keyPressEvent(self, e: QtGui.QKeyEvent) -> None:
        if e.key() in (QtCore.Qt.Key.Key_Return, QtCore.Qt.Key.Key_Enter) and not (
                e.modifiers() & QtCore.Qt.KeyboardModifier.ShiftModifier):
            self.submitted.emit()
            return
        super().keyPressEvent(e)


def _combo(items, tips: dict) -> QtWidgets.QComboBox:
    c = QtWidgets.QComboBox()
    # Long policy names must not set the dock's minimum width (the window has to fit 1280 px).
    c.setSizeAdjustPolicy(QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    c.setMinimumContentsLength(8)
    for i, name in enumerate(items):
        c.addItem(name)
        c.setItemData(i, tips.get(name, ""), QtCore.Qt.ItemDataRole.ToolTipRole)
    return c


class ChatPanel(QtWidgets.QWidget):
    sendRequested = QtCore.Signal(object)  # TurnRequest
    stopRequested = QtCore.Signal()
    newChatRequested = QtCore.Signal()
    turnClicked = QtCore.Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._theme = th.DARK
        self._streaming = False
        self._build()
        self.set_state(loaded=False, busy=False)

    # -- layout ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.system = QtWidgets.QPlainTextEdit()
        self.system.setPlaceholderText("System prompt (optional; applies from the next turn)")
        self.system.setFixedHeight(46)
        self.system.setTabChangesFocus(True)

        self.transcript = QtWidgets.QTextBrowser()
        self.transcript.setOpenLinks(False)
        self.transcript.anchorClicked.connect(self._on_anchor)
        self.transcript.setPlaceholderText("The conversation appears here, as it is generated.")
        # A saved or followed trace shows its own conversation here; the live one is kept as it is.
        self.replay = QtWidgets.QTextBrowser()
        self.replay.setOpenLinks(False)
        self.replay.anchorClicked.connect(self._on_anchor)
        self.replay.setPlaceholderText("No turn recorded yet.")
        self._replay_key = None
        self.pages = QtWidgets.QStackedWidget()
        self.pages.addWidget(self.transcript)
        self.pages.addWidget(self.replay)
        self.read_only = False

        self.policy = _combo(POLICIES, POLICY_HELP)
        self.policy.setToolTip("How the next turn handles the cache (the correct reuse, or a classic mistake)")
        self.cache_impl = _combo(CACHE_IMPLS, CACHE_HELP)
        self.cache_impl.setToolTip("Cache implementation for caches created from the next turn on")
        self.max_new = QtWidgets.QSpinBox(minimum=1, maximum=100_000, value=64)
        self.max_new.setToolTip("max_new_tokens")
        self.mode = _combo(["greedy", "sampling"], {"greedy": "argmax at every step (deterministic)",
                                                     "sampling": "temperature / top-p sampling with the seed"})
        self.temperature = QtWidgets.QDoubleSpinBox(minimum=0.01, maximum=5.0, singleStep=0.1, value=1.0)
        self.temperature.setToolTip("temperature (sampling only)")
        self.top_p = QtWidgets.QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, value=1.0)
        self.top_p.setToolTip("top_p (sampling only)")
        self.seed = QtWidgets.QSpinBox(minimum=0, maximum=2**31 - 1, value=0)
        self.seed.setToolTip("seed (sampling only)")
        for w in (self.max_new, self.temperature, self.top_p, self.seed):
            # A 10-digit seed range must not set the dock's minimum width either.
            w.setSizePolicy(QtWidgets.QSizePolicy.Policy.Ignored, QtWidgets.QSizePolicy.Policy.Fixed)
            w.setMinimumWidth(56)
        self.mode.currentTextChanged.connect(self._on_mode)
        self._on_mode(self.mode.currentText())

        form = QtWidgets.QGridLayout()
        form.setHorizontalSpacing(6)
        form.setVerticalSpacing(4)
        form.addWidget(QtWidgets.QLabel("Policy"), 0, 0)
        form.addWidget(self.policy, 0, 1, 1, 3)
        form.addWidget(QtWidgets.QLabel("Cache"), 1, 0)
        form.addWidget(self.cache_impl, 1, 1)
        form.addWidget(QtWidgets.QLabel("Decoding"), 1, 2)
        form.addWidget(self.mode, 1, 3)
        form.addWidget(QtWidgets.QLabel("Tokens"), 2, 0)
        form.addWidget(self.max_new, 2, 1)
        form.addWidget(QtWidgets.QLabel("Seed"), 2, 2)
        form.addWidget(self.seed, 2, 3)
        form.addWidget(QtWidgets.QLabel("Temp."), 3, 0)
        form.addWidget(self.temperature, 3, 1)
        form.addWidget(QtWidgets.QLabel("Top-p"), 3, 2)
        form.addWidget(self.top_p, 3, 3)
        self.max_new.setToolTip("max_new_tokens: the most tokens the next reply may have")
        form.setColumnStretch(1, 1)
        form.setColumnStretch(3, 1)
        settings = QtWidgets.QGroupBox("Next turn")
        settings.setLayout(form)
        self.settings_box = settings

        self.input = ChatInput()
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.input.setFixedHeight(64)
        self.input.submitted.connect(self.send)
        self.input.imagesDropped.connect(self.attach_images)
        self.send_button = QtWidgets.QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self.send)
        self.stop_button = QtWidgets.QPushButton("Stop")
        self.stop_button.setToolTip("Stop after the current token; the turn is kept and marked stopped (Esc)")
        self.stop_button.clicked.connect(self.stopRequested)
        self.new_button = QtWidgets.QPushButton("New chat")
        self.new_button.setToolTip("Forget the conversation and the cache; the record keeps every turn (Ctrl+N)")
        self.new_button.clicked.connect(self.newChatRequested)
        self.attach_button = QtWidgets.QPushButton("Attach image…")
        self.attach_button.setToolTip("Send pictures with the next message (a vision-language model, such as "
                                      "tiny-gemma3-vl, runs them through its processor)")
        self.attach_button.clicked.connect(self._choose_images)
        self.attached = QtWidgets.QLabel()
        self.attached.setWordWrap(True)
        self.attached.hide()
        self.images: list[str] = []
        buttons = QtWidgets.QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.attach_button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)

        box = QtWidgets.QVBoxLayout(self)
        box.setContentsMargins(6, 4, 6, 6)
        box.setSpacing(4)
        box.addWidget(self.system)
        box.addWidget(self.pages, 1)
        box.addWidget(settings)
        box.addWidget(self.attached)
        box.addWidget(self.input)
        box.addLayout(buttons)

    def _on_mode(self, mode: str) -> None:
        sampling = mode == "sampling"
        for w in (self.temperature, self.top_p, self.seed):
            w.setEnabled(sampling)

    # -- state ------------------------------------------------------------------------------
    def set_state(self, loaded: bool, busy: bool, generating: bool = False) -> None:
        live = not self.read_only
        self.send_button.setEnabled(live and loaded and not busy)
        self.input.setEnabled(live and loaded)
        self.stop_button.setEnabled(live and generating)
        self.new_button.setEnabled(live and loaded and not busy)
        self.attach_button.setEnabled(live and loaded)
        for w in (self.system, self.settings_box):
            w.setEnabled(live)

    def set_read_only(self, on: bool, what: str = "viewing a trace") -> None:
        """Viewing a trace: its conversation replaces the live one on screen; nothing can be sent."""
        self.read_only = bool(on)
        self.pages.setCurrentWidget(self.replay if on else self.transcript)
        self.input.setPlaceholderText(
            f"Read-only: {what}. File → Back to live session to chat." if on
            else "Message (Enter sends, Shift+Enter for a new line)")
        if not on:
            self.replay.clear()
            self._replay_key = None

    def show_record(self, record, step: int | None = None, growing: bool = False) -> None:
        """The recorded conversation up to the turn of ``step`` (all of it when None); redrawn when it changed.

        ``growing``: the file is still being written (follow mode), so an open turn is generating.
        """
        if record is None:
            self.replay.clear()
            self._replay_key = None
            return
        with record.lock:
            turns = [t for t in record.turns if step is None or t.first_step <= step]
            events = list(record.events)
        current = turns[-1].index if turns and step is not None else None
        key = (id(record), tuple((t.index, t.status, len(t.reply)) for t in turns), len(events), current,
               growing, self._theme.name)
        if key == self._replay_key:
            return
        self._replay_key = key
        t = self._theme
        out = []
        system = ((record.header.get("session") or {}).get("system") or "").strip()
        if system:
            out.append(f"<p><span style='color:{t.dim_text}'>System: {_para(system)}</span></p>")
        for turn in turns:
            mark = f" <span style='color:{t.highlight}'>◀ step shown</span>" if turn.index == current else ""
            out.append(f"<p><span style='color:{t.highlight}; font-weight:bold'>You</span>"
                       f"<span style='color:{t.dim_text}'> · turn {turn.index + 1} · {html.escape(turn.policy)}/"
                       f"{html.escape(turn.cache_impl)}</span>{mark}<br>{_para(turn.user)}</p>")
            missing = "(generating…)" if turn.status == "running" and growing else "(no reply recorded)"
            reply = _para(turn.reply) if turn.reply else f"<span style='color:{t.dim_text}'><i>{missing}</i></span>"
            out.append(f"<p><span style='color:{th.KIND_COLORS['sliding']}; font-weight:bold'>Model</span><br>"
                       f"<span style='color:{t.text}'>{reply}</span></p>")
            if turn.status != "running":
                out.append(f"<p>{turn_line_html(turn, [e for e in events if e.turn == turn.index], t)}</p>")
        bar = self.replay.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        self.replay.setHtml("".join(out))
        if at_end or current is not None:
            bar.setValue(bar.maximum())

    def settings(self) -> GenerationSettings:
        return GenerationSettings(
            max_new_tokens=self.max_new.value(), do_sample=self.mode.currentText() == "sampling",
            temperature=round(self.temperature.value(), 4), top_p=round(self.top_p.value(), 4),
            seed=self.seed.value())

    def apply_settings(self, s: GenerationSettings) -> None:
        self.max_new.setValue(s.max_new_tokens)
        self.mode.setCurrentText("sampling" if s.do_sample else "greedy")
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        if s.seed is not None:
            self.seed.setValue(s.seed)

    def set_choice(self, combo: QtWidgets.QComboBox, value: str) -> None:
        i = combo.findText(value)
        if i >= 0:
            combo.setCurrentIndex(i)

    def request(self, text: str) -> TurnRequest:
        return TurnRequest(text=text, policy=self.policy.currentText(), cache_impl=self.cache_impl.currentText(),
                           settings=self.settings(), system=self.system.toPlainText().strip(),
                           images=list(self.images))

    # -- images for the next turn ----------------------------------------------------------------
    def _choose_images(self) -> None:
        paths, _ = QtWidgets.QFileDialog.getOpenFileNames(
            self, "Attach images to the next message", "", "Images (*.png *.jpg *.jpeg *.webp *.bmp *.gif);;All files (*)")
        self.attach_images(paths)

    def attach_images(self, paths) -> None:
        """Pictures for the next message (the engine reads them; a bad file fails that turn with one line)."""
        self.images += [str(p) for p in paths if str(p)]
        self._show_attached()

    def clear_images(self) -> None:
        self.images = []
        self._show_attached()

    def _show_attached(self) -> None:
        if not self.images:
            self.attached.hide()
            self.attached.clear()
            return
        names = ", ".join(Path(p).name for p in self.images)
        self.attached.setText(f"Attached to the next message: {names}")
        self.attached.setToolTip("\n".join(self.images))
        self.attached.show()

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or not self.send_button.isEnabled():
            return
        self.sendRequested.emit(self.request(text))

    # -- transcript -----------------------------------------------------------------------
    def _append_html(self, markup: str) -> None:
        cur = QtGui.QTextCursor(self.transcript.document())
        cur.movePosition(QtGui.QTextCursor.MoveOperation.End)
        cur.insertHtml(markup)
        self._scroll()

    def _scroll(self) -> None:
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _block(self) -> None:
        cur = QtGui.QTextCursor(self.transcript.document())
        cur.movePosition(QtGui.QTextCursor.MoveOperation.End)
        if not self.transcript.document().isEmpty():
            cur.insertBlock()

    def begin_turn(self, index: int, text: str, policy: str, cache_impl: str, images=()) -> None:
        """The user's message (with its pictures' thumbnails), then an empty model reply that tokens stream into."""
        t = self._theme
        self._block()
        self._append_html(
            f"<span style='color:{t.highlight}; font-weight:bold'>You</span>"
            f"<span style='color:{t.dim_text}'> · turn {index + 1} · {html.escape(policy)}/{html.escape(cache_impl)}"
            f"</span><br>{_thumbnails(images)}{html.escape(text).replace(chr(10), '<br>')}")
        self._block()
        self._append_html(f"<span style='color:{th.KIND_COLORS['sliding']}; font-weight:bold'>Model</span><br>")
        self._streaming = True

    def append_tokens(self, text: str) -> None:
        if not text:
            return
        cur = QtGui.QTextCursor(self.transcript.document())
        cur.movePosition(QtGui.QTextCursor.MoveOperation.End)
        # No colour of its own: the reply takes the palette's text colour, so it stays readable
        # when the theme changes (a colour fixed here would be light-on-white after a switch).
        cur.insertText(text, QtGui.QTextCharFormat())
        self._scroll()

    def end_turn(self, turn, events=()) -> None:
        """The per-turn line: status, prompt/reused/prefilled/new tokens, TTFT, total, tok/s."""
        self._streaming = False
        self._block()
        self._append_html(turn_line_html(turn, events, self._theme))

    def add_note(self, text: str, color: str | None = None) -> None:
        self._block()
        self._append_html(f"<span style='color:{color or self._theme.dim_text}'>{html.escape(text)}</span>")

    def plain_text(self) -> str:
        return self.transcript.toPlainText()

    def apply_theme(self, t: th.Theme) -> None:
        self._theme = t

    def _on_anchor(self, url: QtCore.QUrl) -> None:
        if url.scheme() == "turn":
            try:
                self.turnClicked.emit(int(url.path() or url.host()))
            except ValueError:
                pass


#: Characters of one message the replay shows: laying out megabytes of text freezes the window
#: for minutes (a 5 MB turn in a hostile trace); the trace and a report keep all of it.
SHOWN_CHARS = 20_000


def _thumbnails(images) -> str:
    """Each picture as a small image (Qt reads the file itself) with its name under the tooltip."""
    out = []
    for p in images:
        url = QtCore.QUrl.fromLocalFile(str(Path(p).resolve())).toString()
        out.append(f"<img src='{html.escape(url, quote=True)}' height='48' title='{html.escape(Path(p).name)}'> ")
    return ("".join(out) + "<br>") if out else ""


def _para(text: str) -> str:
    more = len(text) - SHOWN_CHARS
    if more > 0:
        return (html.escape(text[:SHOWN_CHARS]).replace("\n", "<br>")
                + f" <i>… {more:,} more characters not shown (the trace keeps them)</i>")
    return html.escape(text).replace("\n", "<br>")


def _fmt(v, unit: str = " s", nd: int = 2) -> str:
    return "–" if v is None else f"{v:.{nd}f}{unit}"


def turn_line_html(turn, events, t: th.Theme) -> str:
    status_color = {"ok": th.STATUS_COLORS["pass"], "stopped": th.STATUS_COLORS["warn"],
                    "failed": th.STATUS_COLORS["fail"]}.get(turn.status, t.dim_text)
    badge = (f"<span style='background-color:{status_color}; color:{th.badge_text_color(status_color)}'>"
             f"&nbsp;{html.escape(turn.status)}&nbsp;</span>")
    ttft = "–" if turn.ttft_s is None else (f"{turn.ttft_s * 1e3:.1f} ms" if turn.ttft_s < 0.01
                                            else f"{turn.ttft_s * 1e3:.0f} ms" if turn.ttft_s < 1 else _fmt(turn.ttft_s))
    parts = [f"prompt {turn.prompt_tokens}", f"reused {turn.reused_tokens}", f"prefilled {turn.prefill_tokens}",
             f"new {turn.new_tokens}", f"TTFT {ttft}", f"total {_fmt(turn.total_s)}",
             f"{_fmt(turn.tokens_per_s, ' tok/s', 1)}"]
    parts = [p.replace(" ", "&nbsp;") for p in parts]  # a line may wrap between figures, never inside one
    problems = [e for e in events if e.is_problem]
    flags = ""
    if problems:
        kinds = sorted({e.kind for e in problems})
        flags = " " + " ".join(
            f"<span style='color:{th.severity_color(_sev(problems, k))}'>⚠&nbsp;{k}</span>" for k in kinds)
    err = f"<br><span style='color:{th.STATUS_COLORS['fail']}'>{html.escape(turn.error)}</span>" if turn.error else ""
    return (f"<a href='turn:{turn.index}' style='text-decoration:none; color:{t.dim_text}'>"
            f"<small>{badge} turn {turn.index + 1} · " + " · ".join(parts) + f"</small></a>{flags}{err}")


def _sev(events, kind: str) -> str:
    sevs = {e.severity for e in events if e.kind == kind}
    return "error" if "error" in sevs else "warn" if "warn" in sevs else "info"
