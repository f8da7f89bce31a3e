"""A remote engine, from the window's side: which host a command reaches, and why it did not start.

The window starts a remote engine as
``ssh -T -o BatchMode=yes -o ServerAliveInterval=15 HOST PYTHON -m kvinspect engine``
(:func:`kvinspect.engine.launch.engine_command`; the ssh part is ``$KVINSPECT_SSH_COMMAND``). The
user's own ssh config, keys and jump hosts apply, and no port is opened on either side: the
protocol runs over the ssh channel's stdin/stdout. When that engine ends before its hello,
:func:`explain_start_failure` turns ssh's exit status and the last lines of its stderr into one
line that says what to do. No Qt here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvinspect.core.text_safety import terminal_text

#: What every engine command ends with (the python, then these).
_TAIL = ["-m", "kvinspect", "engine"]
#: ssh's own exit status when it could not connect or log in (a remote command's status is passed through).
SSH_FAILED = 255


@dataclass(frozen=True)
class RemoteTarget:
    host: str
    python: str


def remote_target(command: list[str]) -> RemoteTarget | None:
    """The host and python of an ssh engine command built by ``engine_command``; None for a local one."""
    cmd = list(command or [])
    if len(cmd) < 6 or cmd[-3:] != _TAIL or "-T" not in cmd[:-5]:
        return None
    return RemoteTarget(host=cmd[-5], python=cmd[-4])


def _last(stderr_tail: list[str]) -> str:
    return terminal_text(next((ln.strip() for ln in reversed(stderr_tail) if ln.strip()), ""))


def explain_start_failure(command: list[str], code: int | None, stderr_tail: list[str]) -> str | None:
    """One line for a remote engine that exited before its hello; None when the command is local.

    ``code``: the ssh client's exit status (the remote command's, or 255 for ssh's own failures).
    """
    t = remote_target(command)
    if t is None:
        return None
    text = "\n".join(stderr_tail)
    last = _last(stderr_tail)[:300]
    if code == SSH_FAILED:
        return f"could not reach {t.host} over ssh: {last or 'ssh exited with status 255'}"
    if "No module named kvinspect" in text:
        return (f"{t.host} has no kvinspect for {t.python}: install it there (pip install kvinspect) or give "
                f"the python of an environment that has it")
    if "invalid choice: 'engine'" in text:
        return (f"the kvinspect of {t.python} on {t.host} has no engine (too old): upgrade it there "
                f"(pip install -U kvinspect)")
    if code in (126, 127):
        why = f" ({last})" if last else ""
        return (f"{t.host} cannot run {t.python}{why}: give the path of a python that has kvinspect "
                f"(for example ~/venv/bin/python)")
    if code is None:
        return None
    return f"the engine on {t.host} did not start: {t.python} exited with status {code}" + (f": {last}" if last else "")
