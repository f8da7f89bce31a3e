"""The bar above the plots while a saved or followed trace is shown: what is shown, and the replay controls.

Two rows and an optional banner: a warning banner with what a damaged file lost
(``record.notes``); the source ("viewing trace.jsonl (read-only)" / "following … · last update
3 s ago · 1,234 steps") with Stop following and Back to live session; then the turn selector,
the replay slider and an exact step box. The bar only emits what the user asked for; the
window decides what it means (:mod:`kvinspect.gui.windows.trace_modes`).
"""

from __future__ import annotations

import html

from PySide6 import QtCore, QtWidgets

from kvinspect.gui.base import theme as th
from kvinspect.gui.base.accessibility import fill_missing, name

BANNER_LINES = 2  # notes shown in the banner itself; all of them in its tooltip


class ViewerBar(QtWidgets.QFrame):
    """Signals: ``stepRequested(step)``, ``turnRequested(index)``, ``latestRequested()``,
    ``stopFollowRequested()``, ``backRequested()``."""

    stepRequested = QtCore.Signal(int)
    turnRequested = QtCore.Signal(int)
    latestRequested = QtCore.Signal()
    stopFollowRequested = QtCore.Signal()
    backRequested = QtCore.Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("viewer-bar")
        self.setFrameShape(QtWidgets.QFrame.Shape.StyledPanel)
        self._turns_key = None
        self._notes: list[str] = []
        self._updating = False

        self.banner = QtWidgets.QLabel()
        self.banner.setObjectName("damage-banner")
        self.banner.setWordWrap(True)
        self.banner.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.banner.setContentsMargins(8, 4, 8, 4)
        self.banner.setVisible(False)

        self.source = QtWidgets.QLabel()
        self.source.setObjectName("viewer-source")
        self.source.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.source.setSizePolicy(QtWidgets.QSizePolicy.Policy.Ignored, QtWidgets.QSizePolicy.Policy.Preferred)
        self.stop_button = QtWidgets.QPushButton("Stop follo&wing")
        self.stop_button.setToolTip("Stop reading the file; keep what was read as a read-only replay")
        self.stop_button.clicked.connect(self.stopFollowRequested)
        self.back_button = QtWidgets.QPushButton("Back to &live session")
        self.back_button.setToolTip("Leave the trace and show the window's own session again")
        self.back_button.clicked.connect(self.backRequested)
        top = QtWidgets.QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.source, 1)
        top.addWidget(self.stop_button)
        top.addWidget(self.back_button)

        self.turn_box = QtWidgets.QComboBox()
        self.turn_box.setToolTip("Jump to the end of a turn")
        self.turn_box.setSizeAdjustPolicy(QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.turn_box.activated.connect(self._on_turn)
        self.slider = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
        self.slider.setToolTip("Replay: plots, events, checklist and layers as they were at this step "
                               "(arrow keys: one step; Page Up/Down: a tenth)")
        self.slider.setRange(0, 0)
        self.slider.valueChanged.connect(self._on_slider)
        self.spin = QtWidgets.QSpinBox()
        self.spin.setToolTip("Step (forward pass) shown")
        self.spin.setRange(0, 0)
        self.spin.setKeyboardTracking(False)
        self.spin.valueChanged.connect(self._on_spin)
        self.total = QtWidgets.QLabel("/ 0")
        self.latest = QtWidgets.QCheckBox("L&atest")
        self.latest.setToolTip("Follow the newest step as the file grows (off once you move the slider)")
        self.latest.toggled.connect(self._on_latest)
        low = QtWidgets.QHBoxLayout()
        low.setContentsMargins(0, 0, 0, 0)
        # Alt+R / Alt+P: the main window's menus hold F, E, C, V, T and H.
        turn_label, step_label = QtWidgets.QLabel("Tu&rn"), QtWidgets.QLabel("Ste&p")
        turn_label.setBuddy(self.turn_box)
        step_label.setBuddy(self.slider)
        low.addWidget(turn_label)
        low.addWidget(self.turn_box)
        low.addSpacing(6)
        low.addWidget(step_label)
        low.addWidget(self.slider, 1)
        low.addWidget(self.spin)
        low.addWidget(self.total)
        low.addWidget(self.latest)

        box = QtWidgets.QVBoxLayout(self)
        box.setContentsMargins(6, 4, 6, 4)
        box.setSpacing(3)
        box.addWidget(self.banner)
        box.addLayout(top)
        box.addLayout(low)
        # The same words as the main window's table (accessibility.WINDOW), for a bar shown on its own.
        name(self.slider, "Replay step", "The step of the trace shown: drag to replay; arrow keys move one step, "
             "Page Up/Down a tenth")
        name(self.spin, "Replay step number", "The step of the trace shown")
        name(self.turn_box, "Replay turn", "Jump to the end of a turn of the trace")
        name(self.latest, "Latest step", "Show the latest step as the followed trace grows")
        name(self.stop_button, "Stop following", "Stop reading the followed trace; keep what was read")
        name(self.back_button, "Back to live session", "Leave the trace and show the live session")
        self.setAccessibleName("Trace replay")
        self.setAccessibleDescription("What trace is shown, and the controls to replay it step by step")
        fill_missing(self)
        self.apply_theme(th.DARK)

    # -- what the window sets -------------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        """``view`` (a file, read-only) or ``follow`` (a growing file)."""
        following = mode == "follow"
        self.stop_button.setVisible(following)
        self.latest.setVisible(following)

    def set_source_text(self, markup: str, tooltip: str = "") -> None:
        if markup != self.source.text():
            self.source.setText(markup)
        self.source.setToolTip(tooltip)

    def set_steps(self, n_steps: int, step: int | None) -> None:
        """Range 0..n-1; ``step`` None: at the newest step (follow mode's Latest)."""
        self._updating = True
        try:
            top = max(n_steps - 1, 0)
            if self.slider.maximum() != top:
                self.slider.setRange(0, top)
                self.spin.setRange(0, top)
                self.slider.setPageStep(max(1, n_steps // 10))
            at = top if step is None else min(step, top)
            self.slider.setValue(at)
            self.spin.setValue(at)
            self.total.setText(f"/ {top:,}")
            self.slider.setEnabled(n_steps > 0)
            self.spin.setEnabled(n_steps > 0)
            if self.latest.isChecked() != (step is None):
                self.latest.setChecked(step is None)
        finally:
            self._updating = False

    def set_turns(self, turns: list, step: int | None) -> None:
        """Fill the turn selector (only when the turns changed) and select the turn of ``step``."""
        key = tuple((t.index, t.first_step, t.end_step, t.status) for t in turns)
        self._updating = True
        try:
            if key != self._turns_key:
                self._turns_key = key
                self.turn_box.clear()
                for t in turns:
                    end = "" if t.status == "running" else f"{max(t.end_step - 1, t.first_step):,}"
                    self.turn_box.addItem(f"{t.index + 1} · {t.status} · steps {t.first_step:,}–{end}", t.index)
            if step is None:
                self.turn_box.setCurrentIndex(self.turn_box.count() - 1)
            else:
                current = next((i for i, t in enumerate(turns)
                                if t.first_step <= step < max(t.end_step, t.first_step + 1)), None)
                if current is None:  # a step between turns, or past the last closed one
                    current = max((i for i, t in enumerate(turns) if t.first_step <= step), default=-1)
                self.turn_box.setCurrentIndex(current)
        finally:
            self._updating = False

    def set_notes(self, notes: list[str]) -> None:
        """The banner: what a damaged file lost (``record.notes``); hidden when there is nothing."""
        notes = list(notes or [])
        if notes == self._notes:
            return
        self._notes = notes
        self.banner.setVisible(bool(notes))
        if not notes:
            return
        shown = "; ".join(html.escape(n) for n in notes[:BANNER_LINES])
        more = f" <i>(+{len(notes) - BANNER_LINES} more: hover for all)</i>" if len(notes) > BANNER_LINES else ""
        self.banner.setText(f"<b>⚠ This trace is incomplete or damaged</b> — what could be read is shown. "
                            f"{shown}{more}")
        self.banner.setToolTip("\n".join(f"• {n}" for n in notes))

    def notes(self) -> list[str]:
        return list(self._notes)

    def apply_theme(self, t: th.Theme) -> None:
        warn = th.STATUS_COLORS["warn"]
        self.banner.setStyleSheet(f"QLabel#damage-banner {{ background: {warn}; color: {th.badge_text_color(warn)};"
                                  f" border-radius: 3px; }}")
        self.setStyleSheet(f"QFrame#viewer-bar {{ background: {t.alt_base}; border: 1px solid {t.highlight}; "
                           f"border-radius: 3px; }}")

    # -- user input -----------------------------------------------------------------------
    def _on_slider(self, v: int) -> None:
        if self._updating:
            return
        self._updating = True
        self.spin.setValue(v)
        self._updating = False
        self.stepRequested.emit(v)

    def _on_spin(self, v: int) -> None:
        if self._updating:
            return
        self.slider.setValue(v)  # emits stepRequested through _on_slider

    def _on_turn(self, row: int) -> None:
        if self._updating or row < 0:
            return
        self.turnRequested.emit(int(self.turn_box.itemData(row)))

    def _on_latest(self, on: bool) -> None:
        if self._updating:
            return
        if on:
            self.latestRequested.emit()
        else:
            self.stepRequested.emit(self.slider.value())
