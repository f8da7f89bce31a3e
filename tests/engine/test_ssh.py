"""A remote engine over real ssh: a throw-away sshd on 127.0.0.1 (tests/sshd.py), this machine as the host.

The engine is started exactly as the window starts it (``engine_command(host, python)`` with
``KVINSPECT_SSH_COMMAND`` pointing ssh at the test's own client config) and driven line by line.
A host without kvinspect, one that cannot run the python, and one that refuses the connection each
give the window one line saying what to do (:func:`kvinspect.gui.engine_link.remote_engine.explain_start_failure`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from kvinspect.engine.launch import SSH_COMMAND_ENV, engine_command, ssh_command
from kvinspect.engine.protocol import PROTOCOL_VERSION
from kvinspect.gui.engine_link.remote_engine import explain_start_failure, remote_target


def python_without_kvinspect() -> str:
    """A python on this machine that cannot import kvinspect: the system's, else this one without site-packages."""
    for candidate in ("/usr/bin/python3",):
        if os.access(candidate, os.X_OK):
            r = subprocess.run([candidate, "-I", "-c", "import kvinspect"], capture_output=True, cwd="/")
            if r.returncode != 0:
                return candidate
    return f"{sys.executable} -I -S"  # -S: no site-packages, so not the venv's kvinspect either


def test_the_test_sshd_runs_a_command(sshd):
    r = sshd.run(sys.executable, "-c", "print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.stderr, sshd.log_tail())
    # The test's own environment went over (SendEnv/AcceptEnv): the remote side uses the test's folders.
    r = sshd.run(sys.executable, "-c", "import os; print(os.environ.get('KVINSPECT_DATA_DIR'))")
    assert r.stdout.strip() == os.environ["KVINSPECT_DATA_DIR"]


def test_ssh_command_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(SSH_COMMAND_ENV, raising=False)
    assert ssh_command() == ["ssh"]
    assert engine_command("gpu1")[:8] == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "--",
                                         "gpu1"]
    monkeypatch.setenv(SSH_COMMAND_ENV, "ssh -F '/tmp/my config' -J jump")
    cmd = engine_command("gpu1", "~/venv/bin/python")
    assert cmd == ["ssh", "-F", "/tmp/my config", "-J", "jump", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15",
                   "--", "gpu1",
                   "~/venv/bin/python", "-m", "kvinspect", "engine"]
    assert remote_target(cmd).host == "gpu1" and remote_target(cmd).python == "~/venv/bin/python"
    assert remote_target(engine_command()) is None and remote_target(engine_command(None, "/x/python")) is None


def _ended(e) -> tuple[int, list[str]]:
    """Exit status and stderr lines of an engine child that ends before its hello (stderr is read by a thread)."""
    assert e.next() is None  # no hello: it exits at once
    code = e.proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while not e.stderr and time.monotonic() < deadline:
        time.sleep(0.05)
    return code, e.stderr.decode(errors="replace").splitlines()


def _start(sshd, monkeypatch, engine_child, python):
    monkeypatch.setenv(SSH_COMMAND_ENV, sshd.ssh_command)
    cmd = engine_command(sshd.host, python)
    return cmd, engine_child(cmd)


def test_an_engine_over_ssh_chats_and_listens_on_no_port(sshd, monkeypatch, engine_child):
    cmd, e = _start(sshd, monkeypatch, engine_child, sys.executable)
    hello = e.hello()
    assert hello["type"] == "hello" and hello["protocol"] == PROTOCOL_VERSION, e.stderr
    # The engine is a process of the ssh session, not of this test: its parent is sshd's session, not us.
    pid = hello["pid"]
    engine = psutil.Process(pid)
    assert pid != e.proc.pid and engine.ppid() != os.getpid()
    rid = e.request("load", spec="tiny-llama", device="cpu")
    loaded = e.until(rid=rid)
    assert loaded["type"] == "loaded", loaded
    for text in ("Hello over ssh?", "And a second turn?"):
        rid = e.request("turn", text=text, settings={"max_new_tokens": 8})
        done = e.until(rid=rid)
        assert done["type"] == "turn_done" and done["status"] == "ok", done
    # No listening socket in the engine (nor in this test's ssh client): ssh's channel is the transport.
    for proc in (engine, psutil.Process(e.proc.pid)):
        listening = [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening == [], (proc.pid, listening)
    kinds = [x["type"] for x in e.lines]
    assert kinds.count("turn") == 2 and "header" in kinds and "steps" in kinds
    assert e.close() == 0


def test_a_host_without_kvinspect_says_what_to_install(sshd, monkeypatch, engine_child):
    python = python_without_kvinspect()
    cmd, e = _start(sshd, monkeypatch, engine_child, python)
    code, tail = _ended(e)
    assert "No module named kvinspect" in "\n".join(tail), tail
    line = explain_start_failure(cmd, code, tail)
    assert line == (f"kvtest has no kvinspect for {python}: install it there (pip install kvinspect) or give "
                    f"the python of an environment that has it")


def test_a_python_that_is_not_there(sshd, monkeypatch, engine_child):
    cmd, e = _start(sshd, monkeypatch, engine_child, "/nonexistent/bin/python3")
    code, tail = _ended(e)
    line = explain_start_failure(cmd, code, tail)
    assert code == 127 and line.startswith("kvtest cannot run /nonexistent/bin/python3 (") and "\n" not in line


def test_a_host_that_refuses_names_the_host_and_ssh_s_reason(sshd, monkeypatch, engine_child, tmp_path):
    # Port 1 on 127.0.0.1: nothing listens there, ssh itself fails (exit status 255).
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host nowhere\n  HostName 127.0.0.1\n  Port 1\n  BatchMode yes\n"
                   f"  UserKnownHostsFile {tmp_path / 'known_hosts'}\n  StrictHostKeyChecking no\n")
    monkeypatch.setenv(SSH_COMMAND_ENV, f"ssh -F {cfg}")
    cmd = engine_command("nowhere")
    e = engine_child(cmd)
    code, tail = _ended(e)
    line = explain_start_failure(cmd, code, tail)
    assert code == 255
    assert line.startswith("could not reach nowhere over ssh: ") and "Connection refused" in line, line


def test_a_local_command_is_not_explained_here():
    assert explain_start_failure([sys.executable, "-m", "kvinspect", "engine"], 1, ["boom"]) is None


@pytest.mark.parametrize("tail,code,want", [
    (["bash: line 1: python3: command not found"], 127, "kvtest cannot run python3 (bash: line 1: python3: command "
                                                       "not found): give the path of a python that has kvinspect"),
    (["kvinspect: error: argument COMMAND: invalid choice: 'engine' (choose from 'run')"], 2,
     "the kvinspect of python3 on kvtest has no engine (too old)"),
    (["Traceback (most recent call last):", "ImportError: libfoo.so"], 1,
     "the engine on kvtest did not start: python3 exited with status 1: ImportError: libfoo.so"),
])
def test_start_failures_in_one_line(tail, code, want, monkeypatch):
    monkeypatch.delenv(SSH_COMMAND_ENV, raising=False)
    line = explain_start_failure(engine_command("kvtest"), code, tail)
    assert line.startswith(want) and "\n" not in line
