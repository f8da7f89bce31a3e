"""A headless end of the engine protocol: one ``kvinspect engine`` child driven by blocking calls.

The window drives its engine through Qt (:mod:`kvinspect.gui.engine_link.engine_process`); a command
such as ``kvinspect compare`` has no event loop, so :class:`EngineChild` starts the child with
:mod:`subprocess`, reads its stdout and stderr on two threads, and offers ``request(kind, …)``, which
returns the terminal reply and hands every other line to a callback on the calling thread. How a
child ended is said in one line (:func:`describe_exit`), the same words the window uses.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import signal as _signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from kvinspect import __version__
from kvinspect.core.errors import KvInspectError
from kvinspect.core.text_safety import terminal_text
from kvinspect.engine import protocol as P

log = logging.getLogger("kvinspect.engine")

#: How long a starting engine may take to say hello (an ssh login and the first imports included).
HELLO_TIMEOUT_S = 120.0
#: An engine that sends nothing at all (not even a heartbeat) for this long is hung: it is killed.
SILENT_KILL_S = 120.0
#: How long a shutdown waits for the child to exit before it is killed.
SHUTDOWN_GRACE_S = 5.0
STDERR_TAIL = 40

_SIGNAL_HINTS = {
    "SIGKILL": "killed from outside, or by the system's out-of-memory killer",
    "SIGSEGV": "a crash in native code (segmentation fault)",
    "SIGABRT": "aborted by native code (for example a failed CUDA or C++ assertion)",
    "SIGBUS": "a crash in native code (bus error)",
    "SIGTERM": "terminated from outside",
}


def signal_name(num: int) -> str:
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def describe_exit(code: int | None, sig: int | None, stderr_tail: list[str], greeted: bool) -> str:
    """One line: why the engine is gone."""
    if sig is not None:
        name = signal_name(sig)
        hint = _SIGNAL_HINTS.get(name)
        text = f"killed by signal {sig} ({name})" + (f": {hint}" if hint else "")
    else:
        text = f"exited with status {code}"
        last = next((ln for ln in reversed(stderr_tail) if ln.strip()), "")
        if last:
            text += f": {terminal_text(last.strip()[:300])}"
    return text if greeted else f"the engine did not start: {text}"


class EngineDied(KvInspectError):
    """The child ended while a request was in flight (or before its hello)."""

    exit_code = 1

    def __init__(self, message: str, code: int | None, sig: int | None):
        super().__init__(message)
        self.code, self.signal = code, sig

    def to_dict(self) -> dict:
        return {"message": str(self), "code": self.code, "signal": self.signal}


class EngineRefused(KvInspectError):
    """The engine answered a request with an ``error`` line (its one-line message)."""


@dataclass
class EngineChild:
    """One engine child. ``start()`` (the handshake), ``request(...)``, ``close()``."""

    command: list[str]
    name: str = ""
    env: dict | None = None
    hello: dict | None = None
    proc: subprocess.Popen | None = None
    stderr_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=STDERR_TAIL))
    _lines: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _next_id: int = 0

    # -- lifetime -------------------------------------------------------------------------------------
    def start(self, timeout: float = HELLO_TIMEOUT_S) -> dict:
        """Start the child and exchange hellos; the engine's hello (its versions) is returned."""
        try:
            # Its own session: a Ctrl-C in the terminal reaches this process only, which cancels the run in
            # flight over the protocol (the child stops at its next token) instead of killing every engine.
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=self.env, bufsize=0, start_new_session=True)
        except OSError as exc:
            raise EngineDied(f"the engine did not start: {terminal_text(self.command[0])}: {exc.strerror or exc}",
                             None, None) from None
        threading.Thread(target=self._read_stdout, name=f"engine-{self.name}-out", daemon=True).start()
        threading.Thread(target=self._read_stderr, name=f"engine-{self.name}-err", daemon=True).start()
        deadline = time.monotonic() + timeout
        while self.hello is None:
            obj = self._next(deadline, greeted=False)
            if obj is None:
                self.kill()
                raise EngineDied(f"the engine did not say hello within {timeout:.0f} s", None, None)
            try:
                P.check_hello(obj, __version__)
            except P.ProtocolError as exc:
                self.kill()
                raise EngineRefused(str(exc)) from None
            self.hello = obj
        self._send(P.client_hello(__version__, local=True))
        return self.hello

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Shut the child down politely; kill it when it does not go within the grace period."""
        if self.proc is None:
            return
        if self.alive() and self.hello is not None:
            try:
                self._send({"type": P.SHUTDOWN, "id": self._id()})
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(SHUTDOWN_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def signal(self, kind: str) -> None:
        """A Stop or Cancel, acted on by the engine the moment it arrives."""
        try:
            self._send({"type": kind})
        except OSError:
            pass  # the child is gone: its death is reported by the request in flight

    # -- requests -------------------------------------------------------------------------------------
    def request(self, kind: str, /, *, on_line=None, **fields) -> dict:
        """Send one request and wait for its terminal reply. Other lines go to ``on_line(obj)``.

        Raises :class:`EngineDied` when the child ends first, :class:`EngineRefused` on an ``error`` reply.
        """
        rid = self._id()
        try:
            self._send({"type": kind, "id": rid, **fields})
        except OSError:
            pass  # a dead child: _next says how it died
        while True:
            obj = self._next(None, greeted=True)
            if obj is None:  # silent for too long
                self.kill()
                raise EngineDied(f"the engine sent nothing for {SILENT_KILL_S:.0f} s (hung) and was killed",
                                 None, None)
            # Heartbeats reach on_line too: a caller's Cancel is sent within a second even in a long prefill.
            if obj.get("id") == rid and obj.get("type") in P.TERMINAL:
                if obj["type"] == P.ERROR:
                    raise EngineRefused(str(obj.get("message") or f"{kind} failed"))
                return obj
            if on_line is not None:
                on_line(obj)

    # -- plumbing -------------------------------------------------------------------------------------
    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _send(self, obj: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def _next(self, deadline: float | None, *, greeted: bool) -> dict | None:
        """The next protocol object; None when the deadline (or the silence limit) passed. Raises on death."""
        while True:
            wait = SILENT_KILL_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._lines.get(timeout=wait)
            except queue.Empty:
                return None
            if item is None:  # end of stdout: the child is gone
                assert self.proc is not None
                try:
                    rc = self.proc.wait(SHUTDOWN_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.kill()
                    rc = self.proc.returncode
                time.sleep(0.05)  # the stderr thread's last lines
                code, sig = (None, -rc) if rc is not None and rc < 0 else (rc, None)
                raise EngineDied(describe_exit(code, sig, list(self.stderr_tail), greeted), code, sig)
            return item

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                raw = raw.rstrip(b"\r\n")
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (ValueError, UnicodeDecodeError):
                    obj = None
                if not isinstance(obj, dict):
                    # A login banner before the hello (ssh), or a bug: never fatal, always in the log.
                    log.info("engine %s stdout (not a protocol line): %s", self.name,
                             terminal_text(raw[:200].decode("utf-8", "replace")))
                    continue
                self._lines.put(obj)
        except (OSError, ValueError):
            pass
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            for raw in self.proc.stderr:
                text = terminal_text(raw.decode("utf-8", "replace").rstrip("\r\n"))
                self.stderr_tail.append(text)
                log.info("engine %s: %s", self.name, text)
        except (OSError, ValueError):
            pass

