"""Live following: a small daemon thread that keeps a trace file current while the program runs.

It closes a ``generate()`` turn as soon as the call has returned (its frame left the stack) and
appends recorded steps, so a follower (``kvinspect view --follow``) sees the last turn of a chat
program that is waiting for input, not only when the next forward comes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvinspect.core.observe.model_observer import ModelObserver

class Ticker:
    """A daemon thread that calls :meth:`ModelObserver.tick` a few times a second (live following)."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self._observers: list[ModelObserver] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, obs: ModelObserver) -> None:
        self._observers.append(obs)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvinspect-ticker", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for obs in list(self._observers):
                obs.tick()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        self._thread = None
