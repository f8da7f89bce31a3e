"""How the window starts an engine: the one function that builds the command line.

The engine opens no port: the window talks to it over the child's stdin/stdout, locally or through
``ssh -T`` (the user's ssh config, keys and jump hosts apply; nothing listens on the network).
"""

from __future__ import annotations

import os
import shlex
import sys

from kvinspect.core.errors import KvInspectError
from kvinspect.core.text_safety import terminal_text

#: The ssh client command line for a remote engine, split like a shell (like ``GIT_SSH_COMMAND``):
#: for example ``ssh -F ~/.ssh/kvinspect_config`` or ``ssh -J jumphost``. Default ``ssh``.
SSH_COMMAND_ENV = "KVINSPECT_SSH_COMMAND"
#: The local engine's command line, split like a shell, instead of ``python -m kvinspect engine``:
#: a wrapper such as ``nice -n 5 python -m kvinspect engine``, a container, or the test suite's
#: fork server (tests/engine_zygote.py). Remote engines are not affected.
ENGINE_COMMAND_ENV = "KVINSPECT_ENGINE_COMMAND"
#: An idle engine and its window send each other nothing, so a link that died meanwhile is found by ssh's
#: keepalive (three unanswered, 45 s): ssh exits, and the window reports the engine gone.
SERVER_ALIVE = "ServerAliveInterval=15"


def ssh_command() -> list[str]:
    """``$KVINSPECT_SSH_COMMAND`` split with :func:`shlex.split`, or ``["ssh"]``."""
    raw = os.environ.get(SSH_COMMAND_ENV, "").strip()
    return shlex.split(raw) if raw else ["ssh"]


class SshHostError(KvInspectError):
    """An ssh destination that ssh would read as something else (an option)."""


def check_ssh_host(host: str) -> str:
    """``host`` if it can only be an ssh destination; :class:`SshHostError` (one line, exit 2) if not.

    A host that begins with ``-`` is an ssh option (``-oProxyCommand=…`` runs a command here); ``--``
    before the host in :func:`engine_command` makes ssh read it as a destination anyway, and this check
    says so to the user instead of letting ssh fail on a host called ``-o…``.
    """
    h = host.strip()
    if not h:
        raise SshHostError("the ssh host is empty; give user@host or an ssh config alias")
    if h.startswith("-"):
        raise SshHostError(f"the ssh host {terminal_text(h[:80])!r} begins with '-': ssh would read it as an "
                           "option; give user@host or an ssh config alias")
    if not h.isprintable() or any(c.isspace() for c in h):
        raise SshHostError(f"the ssh host {terminal_text(h[:80])!r} holds a space or a control character; give "
                           "user@host or an ssh config alias")
    return h


def engine_command(host: str | None = None, python: str | None = None) -> list[str]:
    """The argv that starts ``kvinspect engine``.

    Parameters
    ----------
    host
        None: on this machine. Otherwise an ssh destination (``user@host``, an ssh config alias).
    python
        The interpreter to run the engine with: default ``sys.executable`` here (in a PyInstaller
        bundle, the bundle itself with an ``engine`` argument), ``python3`` on a remote host.

    Returns
    -------
    list[str]
        Local: ``[python, "-m", "kvinspect", "engine"]`` (frozen: ``[sys.executable, "engine"]``;
        ``$KVINSPECT_ENGINE_COMMAND`` when set).
        Remote: ``["ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "--", host,
        python or "python3", "-m", "kvinspect", "engine"]``, where ``ssh`` is :func:`ssh_command`
        (``$KVINSPECT_SSH_COMMAND``). The remote shell runs ``python``, so ``~/venv/bin/python`` works
        there. ``host`` is checked by :func:`check_ssh_host`.
    """
    if host:
        return [*ssh_command(), "-T", "-o", "BatchMode=yes", "-o", SERVER_ALIVE, "--", check_ssh_host(host),
                python or "python3", "-m", "kvinspect", "engine"]
    if python:
        return [python, "-m", "kvinspect", "engine"]
    override = os.environ.get(ENGINE_COMMAND_ENV, "").strip()
    if override:
        return shlex.split(override)
    if getattr(sys, "frozen", False):
        return [sys.executable, "engine"]
    return [sys.executable, "-m", "kvinspect", "engine"]
