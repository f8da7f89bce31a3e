"""The window's end of the engine protocol: the child process, its lines, its heartbeat, its death.

:class:`EngineClient` owns one ``kvinspect engine`` child (a :class:`QtCore.QProcess`, so every
signal arrives on the GUI thread with no thread of our own). It writes the window's hello and its
requests (JSON lines with ids), checks the engine's hello (a mismatched protocol is refused, both
versions named), splits stdout into lines and hands each one on, relays stderr line by line to the
log (``kvinspect.engine``), watches the heartbeat, and reports how the process ended, in words
(``killed by signal 9 (SIGKILL)``, ``exited with status 1: …``). Everything above the line level
(records, autosave, request tracking) is :class:`~kvinspect.gui.engine_link.session_controller.SessionController`'s.

No torch here, no pickle: only :mod:`json` and :mod:`kvinspect.engine.protocol`.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import time
from dataclasses import dataclass, field

from PySide6 import QtCore

from kvinspect import __version__
from kvinspect.core.text_safety import terminal_text
from kvinspect.engine import protocol as P
from kvinspect.engine.client import describe_exit
from kvinspect.engine.launch import engine_command
from kvinspect.gui.engine_link.remote_engine import explain_start_failure, remote_target

log = logging.getLogger("kvinspect.engine")

#: An engine silent (no line at all, not even a heartbeat) for this long is reported as not responding.
HUNG_AFTER_S = 15.0
#: How long a starting engine may take to say hello (an ssh login included).
HELLO_TIMEOUT_S = 60.0
#: How long a shutdown waits for the engine to close its session and exit before killing it.
SHUTDOWN_GRACE_MS = 5_000

@dataclass
class EngineExit:
    """How an engine ended. ``expected``: this side asked for it (shutdown, a hard cancel, a restart)."""

    code: int | None = None  # exit status (None: killed by a signal, or never started)
    signal: int | None = None
    expected: bool = False
    message: str = ""  # one line, for the user
    greeted: bool = False  # it had said hello (False: it never really started)
    stderr_tail: list[str] = field(default_factory=list)


class EngineClient(QtCore.QObject):
    """One engine child. ``start()``, then ``request(...)``; ``line`` carries everything it says."""

    ready = QtCore.Signal(object)  # the engine's hello (a dict)
    line = QtCore.Signal(object, object)  # the decoded object, the raw line (bytes, no newline)
    exited = QtCore.Signal(object)  # EngineExit
    unresponsive = QtCore.Signal(float)  # seconds since the last line
    responsive = QtCore.Signal()

    def __init__(self, command: list[str] | None = None, parent: QtCore.QObject | None = None, *,
                 local: bool | None = None, hung_after_s: float | None = None,
                 hello_timeout_s: float | None = None):
        super().__init__(parent)
        self.command = list(command) if command else engine_command()
        self.local = (remote_target(self.command) is None) if local is None else local
        self.hung_after_s = HUNG_AFTER_S if hung_after_s is None else hung_after_s
        self.hello_timeout_s = HELLO_TIMEOUT_S if hello_timeout_s is None else hello_timeout_s
        self.proc: QtCore.QProcess | None = None
        self.hello: dict | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._buf = b""
        self._errbuf = b""
        self._next_id = 0
        self._expected = False
        self._override: str | None = None  # the reason we killed it, when that is the news
        self._exited = False
        self._silent = False
        self._started_at = 0.0
        self._last_line = 0.0
        # The requests sent and not yet answered, and since when the engine owes a line: an idle engine is
        # silent (it heartbeats only while it works), so silence means something only while one is pending.
        self._pending: set[int] = set()
        self._owed_since = 0.0
        # Single-shot, armed for the next deadline (the handshake's, or the last line's plus HUNG_AFTER_S,
        # while a request is pending): a timer that polled every second would wake an idle window for nothing.
        self._watch = QtCore.QTimer(self)
        self._watch.setSingleShot(True)
        self._watch.timeout.connect(self._on_watch)

    # -- lifetime -------------------------------------------------------------------------------------
    def start(self) -> EngineClient:
        p = QtCore.QProcess(self)
        self.proc = p
        p.setProgram(self.command[0])
        p.setArguments(self.command[1:])
        p.readyReadStandardOutput.connect(self._on_stdout)
        p.readyReadStandardError.connect(self._on_stderr)
        p.finished.connect(self._on_finished)
        p.errorOccurred.connect(self._on_error)
        log.info("starting the engine: %s", terminal_text(" ".join(self.command)))
        self._started_at = self._last_line = time.monotonic()
        p.start()
        if p.waitForStarted(10_000):
            self.send(P.client_hello(__version__, local=self.local))
            self._arm_watch(self.hello_timeout_s)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and not self._exited and self.proc.state() != QtCore.QProcess.ProcessState.NotRunning

    @property
    def pid(self) -> int | None:
        if self.proc is None:
            return None
        pid = self.proc.processId()
        return int(pid) if pid else None

    def send(self, obj: dict) -> bool:
        """Write one line; False when the engine is not running (the line is dropped)."""
        if not self.running:
            return False
        self.proc.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n")
        return True

    def request(self, kind: str, **fields) -> int:
        """Send request ``kind`` with a fresh id; returns the id (its terminal reply carries it)."""
        self._next_id += 1
        if self.send({"type": kind, "id": self._next_id, **fields}):
            if not self._pending:
                self._owed_since = time.monotonic()
            self._pending.add(self._next_id)
            if self.hello is not None and not self._watch.isActive():
                self._arm_watch(self.hung_after_s)
        return self._next_id

    def kill(self, *, expected: bool = True, reason: str | None = None) -> None:
        """SIGKILL the engine. ``expected``: no death is reported (a hard cancel, a restart); else ``reason`` is."""
        self._expected = self._expected or expected
        if reason:
            self._override = reason
        if self.proc is not None and self.proc.state() != QtCore.QProcess.ProcessState.NotRunning:
            self.proc.kill()

    def shutdown(self, grace_ms: int = SHUTDOWN_GRACE_MS) -> None:
        """Ask the engine to close its session and exit; kill it after ``grace_ms``. Blocks (window closing).

        Lines that arrive meanwhile are still handed on (the session's last lines reach the autosave).
        """
        if self.proc is None or self._exited:
            return
        self._expected = True
        p = self.proc
        if p.state() != QtCore.QProcess.ProcessState.NotRunning:
            self.send({"type": P.SHUTDOWN, "id": self._next_id + 1})
            p.closeWriteChannel()  # end of input: an engine that missed the request exits too
            deadline = time.monotonic() + grace_ms / 1000
            while p.state() != QtCore.QProcess.ProcessState.NotRunning and time.monotonic() < deadline:
                p.waitForFinished(100)
                self._on_stdout()
            if p.state() != QtCore.QProcess.ProcessState.NotRunning:
                log.warning("the engine did not exit within %.1f s of shutdown: killing it", grace_ms / 1000)
                p.kill()
                p.waitForFinished(3000)
        if not self._exited:
            self._on_finished(p.exitCode(), p.exitStatus())

    # -- input ----------------------------------------------------------------------------------------
    @QtCore.Slot()
    def _on_stdout(self) -> None:
        if self.proc is None:
            return
        data = bytes(self.proc.readAllStandardOutput())
        if not data:
            return
        self._last_line = time.monotonic()
        if self._silent:
            self._silent = False
            self.responsive.emit()
            self._arm_watch(self.hung_after_s)
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        for raw in lines:
            raw = raw.rstrip(b"\r")
            if raw.strip():
                self._handle(raw)
                if self._exited and self.hello is None:
                    return

    def _handle(self, raw: bytes) -> None:
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError):
            # A login banner before the hello (ssh), or a bug: never fatal, always in the log.
            log.warning("engine stdout (not a protocol line): %s", raw[:200].decode("utf-8", "replace"))
            return
        kind = obj.get("type")
        if self.hello is None:
            try:
                P.check_hello(obj, __version__)
            except P.ProtocolError as exc:
                log.error("%s", exc)
                self.kill(expected=False, reason=str(exc))
                return
            self.hello = obj
            if self._pending:
                self._arm_watch(self.hung_after_s)
            else:
                self._watch.stop()
            log.info("engine ready: pid %s on %s, kvinspect %s, protocol %s", obj.get("pid"), obj.get("host"),
                     obj.get("kvinspect"), obj.get("protocol"))
            self.ready.emit(obj)
            return
        if kind == P.HEARTBEAT:
            return
        if kind in P.TERMINAL and type(obj.get("id")) is int and obj["id"] in self._pending:
            self._pending.discard(obj["id"])
            if not self._pending:
                self._watch.stop()  # nothing owed: an idle engine's silence is its rest
        if kind == P.ERROR and obj.get("task") == P.HELLO:  # the engine refused our hello
            self._override = obj.get("message") or "the engine refused the handshake"
        self.line.emit(obj, raw)

    @QtCore.Slot()
    def _on_stderr(self) -> None:
        if self.proc is None:
            return
        data = self._errbuf + bytes(self.proc.readAllStandardError())
        lines = data.split(b"\n")
        self._errbuf = lines.pop()
        for raw in lines:
            self._log_stderr(raw.decode("utf-8", "replace").rstrip())

    def _log_stderr(self, text: str) -> None:
        # A progress bar redraws with \r: its last state is the line. The engine's stderr and a remote host's
        # ssh banner are not ours: their controls are shown escaped, never sent to the terminal we log to.
        text = terminal_text(next((part for part in reversed(text.split("\r")) if part.strip()), ""))
        if not text:
            return
        self.stderr_tail.append(text)
        level = logging.INFO
        for name, lvl in (("CRITICAL", logging.CRITICAL), ("ERROR", logging.ERROR), ("WARNING", logging.WARNING)):
            if text.startswith(name + " "):
                level = lvl
                break
        log.log(level, "%s", text)

    # -- the end --------------------------------------------------------------------------------------
    @QtCore.Slot(int, QtCore.QProcess.ExitStatus)
    def _on_finished(self, code: int, status) -> None:
        if self._exited:
            return
        self._on_stdout()  # what it wrote before it went
        self._on_stderr()
        if self._errbuf:
            self._log_stderr(self._errbuf.decode("utf-8", "replace").rstrip())
            self._errbuf = b""
        self._exited = True
        self._watch.stop()
        crashed = status == QtCore.QProcess.ExitStatus.CrashExit
        sig = int(code) if crashed else None
        tail = list(self.stderr_tail)
        remote = None if crashed or self.hello is not None else explain_start_failure(self.command, int(code), tail)
        message = self._override or (f"the engine did not start: {remote}" if remote else None) or describe_exit(
            None if crashed else int(code), sig, tail, self.hello is not None)
        ex = EngineExit(code=None if crashed else int(code), signal=sig, expected=self._expected and not self._override,
                        message=message, greeted=self.hello is not None, stderr_tail=tail)
        if not ex.expected:
            log.warning("the engine is gone: %s", message)
        self.exited.emit(ex)

    @QtCore.Slot(QtCore.QProcess.ProcessError)
    def _on_error(self, err) -> None:
        if err == QtCore.QProcess.ProcessError.FailedToStart and not self._exited:
            self._exited = True
            self._watch.stop()
            reason = self.proc.errorString() if self.proc is not None else "failed to start"
            msg = f"the engine did not start: could not run {self.command[0]!r}: {reason}"
            log.warning("%s", msg)
            self.exited.emit(EngineExit(expected=False, message=msg))

    def _arm_watch(self, seconds: float) -> None:
        self._watch.start(max(1, math.ceil(seconds * 1000)))

    @QtCore.Slot()
    def _on_watch(self) -> None:
        if not self.running:
            return
        now = time.monotonic()
        if self.hello is None:
            if now - self._started_at > self.hello_timeout_s:
                self.kill(expected=False, reason=f"the engine did not start: no handshake within "
                                                 f"{self.hello_timeout_s:.0f} s ({' '.join(self.command)})")
            else:
                self._arm_watch(self._started_at + self.hello_timeout_s - now)
            return
        if not self._pending:
            return
        silent = now - max(self._last_line, self._owed_since)
        if silent <= self.hung_after_s:
            self._arm_watch(self.hung_after_s - silent)
        elif not self._silent:  # (armed again by the next line)
            self._silent = True
            self.unresponsive.emit(silent)
