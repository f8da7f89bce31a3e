"""Running ``kvinspect`` on hostile input in a child process, and judging what it did.

The contract every command keeps (docs/errors.md): it exits 0 or 2 (1 for a fault of the
machine where a case says so), a refusal is one ``kvinspect:`` line on stderr, nothing prints a
traceback, memory stays under a cap (``resource.setrlimit`` in the child) and the command ends
before a timeout. A timeout is a hang, not a speed figure: the limits are many times what any
case needs.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Address space a child may map: a report reads a trace in well under this; torch needs more.
MEM_LIMIT = 2 << 30
MEM_LIMIT_TORCH = 12 << 30


@dataclass
class Outcome:
    args: list[str]
    rc: int | None
    out: str
    err: str
    hung: bool = False
    why: list[str] = field(default_factory=list)

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err or "Traceback (most recent call last)" in self.out

    def check(self, allowed=(0, 2)) -> list[str]:
        """What broke the contract (empty: nothing)."""
        why = []
        if self.hung:
            why.append("hang")
        elif self.rc not in allowed:
            why.append(f"exit {self.rc}")
        if self.traceback:
            why.append("traceback")
        if self.rc == 2 and not self.hung:
            lines = [ln for ln in self.err.splitlines() if ln.startswith("kvinspect:")]
            if len(lines) != 1:
                why.append(f"{len(lines)} kvinspect: lines")
        self.why = why
        return why


def _limits(mem: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        os.setsid()
    return apply


def run_cli(args: list[str], *, timeout: float = 60, mem: int = MEM_LIMIT, cwd: str | os.PathLike | None = None,
            env: dict | None = None, stdin: bytes | None = None) -> Outcome:
    full = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "KVINSPECT_EPHEMERAL": "1", "PYTHONFAULTHANDLER": "",
            **(env or {})}
    full.pop("PYTHONFAULTHANDLER")
    p = subprocess.Popen([sys.executable, "-m", "kvinspect", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=cwd or ROOT, env=full, preexec_fn=_limits(mem))
    try:
        out, err = p.communicate(stdin or b"", timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the child's own children (a plot renderer) too
        out, err = p.communicate()
        return Outcome(args, None, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), hung=True)
    return Outcome(args, p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
