"""How the window starts an engine: the one function that builds the command line.

The engine opens no port: the window talks to it over the child's stdin/stdout, locally or through
``ssh -T`` (the user's ssh config, keys and jump hosts apply; nothing listens on the network).
"""

from __future__ import annotations

import os
import shlex
import sys

#: The ssh client command line for a remote engine, split like a shell (like ``GIT_SSH_COMMAND``):
#: for example ``ssh -F ~/.ssh/kvinspect_config`` or ``ssh -J jumphost``. Default ``ssh``.
SSH_COMMAND_ENV = "KVINSPECT_SSH_COMMAND"
#: The local engine's command line, split like a shell, instead of ``python -m kvinspect engine``:
#: a wrapper such as ``nice -n 5 python -m kvinspect engine``, a container, or the test suite's
#: fork server (tests/engine_zygote.py). Remote engines are not affected.
ENGINE_COMMAND_ENV = "KVINSPECT_ENGINE_COMMAND"


def ssh_command() -> list[str]:
    """``$KVINSPECT_SSH_COMMAND`` split with :func:`shlex.split`, or ``["ssh"]``."""
    raw = os.environ.get(SSH_COMMAND_ENV, "").strip()
    return shlex.split(raw) if raw else ["ssh"]


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
        Remote: ``["ssh", "-T", "-o", "BatchMode=yes", host, python or "python3", "-m", "kvinspect", "engine"]``,
        where ``ssh`` is :func:`ssh_command` (``$KVINSPECT_SSH_COMMAND``). The remote shell runs
        ``python``, so ``~/venv/bin/python`` works there.
    """
    if host:
        return [*ssh_command(), "-T", "-o", "BatchMode=yes", host, python or "python3", "-m", "kvinspect", "engine"]
    if python:
        return [python, "-m", "kvinspect", "engine"]
    override = os.environ.get(ENGINE_COMMAND_ENV, "").strip()
    if override:
        return shlex.split(override)
    if getattr(sys, "frozen", False):
        return [sys.executable, "engine"]
    return [sys.executable, "-m", "kvinspect", "engine"]
