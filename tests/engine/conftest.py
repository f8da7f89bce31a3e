"""An engine child driven line by line, as the window drives it (no Qt here)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvinspect.engine.protocol import TERMINAL, client_hello

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 240


class EngineChild:
    """``kvinspect engine`` (or ``argv``) with a reader thread; ``lines`` is everything it said, in order."""

    def __init__(self, argv: list[str] | None = None, env: dict | None = None):
        self.proc = subprocess.Popen(argv or [sys.executable, "-m", "kvinspect", "engine"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self.q: queue.Queue = queue.Queue()
        self.lines: list[dict] = []
        self.raw: list[bytes] = []
        self._stderr = b""
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()
        self._err_thread = threading.Thread(target=self._read_err, daemon=True)
        self._err_thread.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.q.put(raw)
        self.q.put(None)

    def _read_err(self) -> None:
        self._stderr = self.proc.stderr.read()

    @property
    def stderr(self) -> bytes:
        """Everything the engine wrote to stderr; complete once it has exited (read then waits for the end)."""
        if self.proc.poll() is not None:
            self._err_thread.join(30)
        return self._stderr

    def send(self, obj: dict) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, kind: str, **fields) -> int:
        self._next += 1
        self.send({"type": kind, "id": self._next, **fields})
        return self._next

    def next(self) -> dict | None:
        raw = self.q.get(timeout=TIMEOUT_S)
        if raw is None:
            return None
        self.raw.append(raw)
        obj = json.loads(raw)  # every stdout line is a protocol line, or this fails
        self.lines.append(obj)
        return obj

    def until(self, kinds=TERMINAL, rid: int | None = None) -> dict:
        """Read until a line of ``kinds`` (for request ``rid`` when given); returns it."""
        while True:
            obj = self.next()
            assert obj is not None, f"the engine ended early: {self.proc.wait()} {self.stderr[-2000:]!r}"
            if obj.get("type") in kinds and (rid is None or obj.get("id") == rid):
                return obj

    def hello(self) -> dict:
        first = self.next()
        self.send(client_hello("test"))
        return first

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        rc = self.proc.wait()
        if rc < 0:  # killed by a signal: the engine's last words (faulthandler's stacks) go with a failing test's output
            print(f"the engine ended by signal {-rc}; its stderr ends with: {self.stderr[-4000:].decode(errors='replace')}",
                  file=sys.stderr)
        return rc


@pytest.fixture
def engine_child():
    made: list[EngineChild] = []

    def make(argv=None, env=None) -> EngineChild:
        made.append(EngineChild(argv, env))
        return made[-1]

    yield make
    for e in made:
        if e.proc.poll() is None:
            e.proc.kill()
        e.proc.wait()
