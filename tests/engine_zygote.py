"""A fork server for the GUI tests' engines: each window still gets its own ``kvinspect engine``
process, but forked from one that has already imported torch and transformers.

Why: a GUI test that loads a model starts an engine child, and on CI's 2-core machine about 5 s of
CPU of each start is ``import torch, transformers``. Forked from a warm parent, the engine is the
same code on the same pipes, minus that import.

How: ``python tests/engine_zygote.py serve SOCKET`` imports and waits (single-threaded, so
forking is safe; it never runs a torch op, so no thread pool exists to be forked). The window's
engine command is ``python -S tests/engine_zygote.py connect SOCKET``: a small client that passes its
own stdin, stdout and stderr (SCM_RIGHTS), its environment and working directory to the server,
which forks an engine onto those fds. The client forwards SIGTERM/SIGINT/SIGHUP to the engine and
exits as the engine does (same code, or killed by the same signal); the engine dies when its client
does (a SIGKILL of the client is a SIGKILL of the engine), so the window sees what it would see
of a plain child.

Used by tests/gui/conftest.py through ``$KVINSPECT_ENGINE_COMMAND`` (kvinspect.engine.launch).
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import struct
import sys

_STATUS = struct.Struct("!i")  # >= 0: exit code; < 0: killed by that signal


def _send_fds(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    sock.sendmsg([struct.pack("!I", len(payload)) + payload],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(1 << 16, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    (n,) = struct.unpack("!I", msg[:4])
    body = msg[4:]
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            break
        body += chunk
    return body, list(fds)


# -- the client (the window's engine command) ---------------------------------------------------------
def connect(path: str) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    payload = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid()}).encode()
    _send_fds(sock, payload, [0, 1, 2])
    child = _STATUS.unpack(_recv_exact(sock, _STATUS.size))[0]

    def forward(sig, _frame):
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    raw = _recv_exact(sock, _STATUS.size)
    status = _STATUS.unpack(raw)[0] if raw else -signal.SIGKILL
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return b""
        buf += chunk
    return buf


# -- the server ---------------------------------------------------------------------------------------
def _warm() -> None:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import GenerationConfig  # noqa: F401
    from transformers.models.gemma2 import modeling_gemma2  # noqa: F401
    from transformers.models.gemma3 import modeling_gemma3  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401
    from transformers.models.llama4 import modeling_llama4  # noqa: F401
    from transformers.models.mistral import modeling_mistral  # noqa: F401

    import kvinspect.cli  # noqa: F401
    import kvinspect.core.model.loading  # noqa: F401
    import kvinspect.core.session.chat  # noqa: F401
    import kvinspect.engine.server  # noqa: F401


def _child(conn: socket.socket, listener: socket.socket, others: list[socket.socket], req: dict,
           fds: list[int]) -> None:
    listener.close()
    for s in others:
        s.close()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    conn.close()
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.argv = [sys.executable, "-m", "kvinspect", "engine"]
    _die_with(req["pid"])
    from kvinspect.cli import main

    rc = 1
    try:
        rc = main(["engine"])
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(rc if isinstance(rc, int) else 1)


def _die_with(pid: int) -> None:
    """SIGKILL ourselves when the client process ends (as a plain child dies with its process)."""
    import threading

    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)
            select.select([fd], [], [])
        except (AttributeError, OSError):
            import time

            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="zygote-client-watch", daemon=True).start()


def serve(path: str) -> int:
    _warm()
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    conns: dict[int, socket.socket] = {}  # engine pid -> its client's connection
    parent = os.getppid()
    while True:
        ready, _, _ = select.select([listener], [], [], 0.1)
        if ready:
            conn, _ = listener.accept()
            try:
                body, fds = _recv_fds(conn)
                req = json.loads(body)
            except (OSError, ValueError, struct.error):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                _child(conn, listener, list(conns.values()), req, fds)
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(_STATUS.pack(pid))
            except OSError:
                pass
            conns[pid] = conn
        while conns:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = conns.pop(pid, None)
            if conn is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                try:
                    conn.sendall(_STATUS.pack(code))
                except OSError:
                    pass
                conn.close()
        if os.getppid() != parent:  # the test session is gone
            for pid in conns:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return 0


if __name__ == "__main__":
    mode, sock_path = sys.argv[1], sys.argv[2]
    sys.exit(serve(sock_path) if mode == "serve" else connect(sock_path))
