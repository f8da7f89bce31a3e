"""``kvinspect gui --script FILE [--screenshot PNG] [--exit-when-done]``: a chat script typed into the real window.

Each turn goes through the same path as a user's: text into the input box, Send, tokens
streamed by the engine, the turn line, the plots. When the last turn is done the window is
rendered once more and grabbed to a PNG (reproducible images for bug reports and CI).
With ``--exit-when-done`` errors print one line and the exit status is 2; the window never
waits on a dialog. If the engine (the model's process) dies, the window stays up, the screenshot
is still taken, and the exit status is 1.

A turn is sent once the window has drawn what came before it (the loaded model, the last turn's
end), as a person would type it: sent in the same moment, the window's repaint of the turn end
ran beside the engine's prefill of the next prompt and lengthened its time to first token.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from PySide6 import QtCore, QtWidgets

log = logging.getLogger(__name__)


SETTLE_POLL_MS = 20  # how often the driver looks whether the window has painted what is pending
SETTLE_MAX_MS = 2000  # a window that keeps painting (it never should at rest) gets the next turn anyway


class ScriptDriver(QtCore.QObject):
    """Drives ``window`` through ``turns``; emits ``done(exit_code)`` at the end."""

    done = QtCore.Signal(int)

    def __init__(self, window, turns: list[str], screenshot: str | None = None, exit_when_done: bool = False,
                 images: list[list[str]] | None = None):
        super().__init__(window)
        self.window = window
        self.turns = list(turns)
        self.images = list(images or [])  # per turn, the pictures attached before Send
        self.screenshot = screenshot
        self.exit_when_done = exit_when_done
        self.index = 0
        self.code = 0
        self._finished = False
        c = window.controller
        c.modelLoaded.connect(self._on_loaded)
        c.turnFinished.connect(self._on_turn)
        c.failed.connect(self._on_failed)
        c.cancelled.connect(self._on_cancelled)
        c.engineDied.connect(self._on_engine_died)
        if exit_when_done:
            window.errors.interactive = False  # print, never wait on a dialog

    def start(self) -> None:
        if self.window.info is not None:
            QtCore.QTimer.singleShot(0, self._when_drawn)

    def _on_loaded(self, info) -> None:
        if self.index == 0 and not self._finished:
            QtCore.QTimer.singleShot(0, self._when_drawn)  # (after the window's own slots: what they ask to paint)

    def _when_drawn(self, waited_ms: int = 0) -> None:
        """``_next`` once the window's paint clock has nothing pending (its paint, then Qt's, ran)."""
        if self.window.clock.running and waited_ms < SETTLE_MAX_MS:
            QtCore.QTimer.singleShot(SETTLE_POLL_MS, lambda: self._when_drawn(waited_ms + SETTLE_POLL_MS))
            return
        QtCore.QTimer.singleShot(0, self._next)

    def _next(self) -> None:
        if self._finished:
            return
        if self.index >= len(self.turns):
            self._finish()
            return
        text = self.turns[self.index]
        pictures = self.images[self.index] if self.index < len(self.images) else []
        self.index += 1
        chat = self.window.chat
        chat.clear_images()
        chat.attach_images(pictures)  # as Attach image… does
        chat.input.setPlainText(text)
        chat.send()

    def _on_turn(self, turn) -> None:
        if turn.status == "failed":
            print(f"kvinspect: turn {turn.index + 1} failed: {turn.error}", file=sys.stderr, flush=True)
        QtCore.QTimer.singleShot(0, self._when_drawn)

    def _on_failed(self, task: str, message: str) -> None:
        if task == "load":
            self.code = 2
            self._finish(shoot=False)
        elif task == "turn":
            self.code = 2
            QtCore.QTimer.singleShot(0, self._when_drawn)

    def _on_engine_died(self, why: str) -> None:
        print(f"kvinspect: the model's process ended: {why}", file=sys.stderr, flush=True)
        self.code = 1
        self._finish(shoot=True)

    def _on_cancelled(self, task: str) -> None:
        if task == "load":
            self.code = 2
            self._finish(shoot=False)

    def _finish(self, shoot: bool = True) -> None:
        if self._finished:
            return
        self._finished = True
        # Let the paint clock's last paint land, then grab (save_screenshot renders everything once more).
        QtCore.QTimer.singleShot(150, lambda: self._shoot(shoot))

    def _shoot(self, shoot: bool) -> None:
        # Whatever the grab does, the script ends: an error raised in this slot must not leave a
        # scripted window up with nothing left to do.
        try:
            if shoot and self.screenshot:
                path = Path(self.screenshot)
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    saved = self.window.save_screenshot(str(path))
                except OSError as exc:
                    print(f"kvinspect: error: cannot save the screenshot {path}: {exc.strerror or exc}",
                          file=sys.stderr, flush=True)
                    saved = None
                if saved:
                    print(f"kvinspect: screenshot {path}", flush=True)
                else:
                    self.code = self.code or 2
        finally:
            self.done.emit(self.code)
            if self.exit_when_done:
                QtWidgets.QApplication.instance().exit(self.code)
