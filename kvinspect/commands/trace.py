"""``kvinspect trace [--out DIR] -- python my_script.py ARGS``: observe a program without editing it.

The program runs as a child process with kvinspect's boot folder first on its PYTHONPATH
(see kvinspect/core/observe/tracer.py); its stdout, stderr, stdin and exit code are its own.
Every causal LM it runs gets a trace in DIR, appended live (``kvinspect view --follow DIR``).
Afterwards the per-turn table and the events go to stderr, so the program's stdout stays exactly
what it printed, and kvinspect exits with the program's exit code. A program that cannot be
started exits 127 (not found) or 126 (found, but not executable), as a shell does, so that
kvinspect's own failure is never read as something the program returned.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..core.errors import KvInspectError, runtime_fault
from ..core.text_safety import json_dumps_utf8
from .common import ClaimedOut, claim_out_dir, echo, out_arg

DEFAULT_ROOT = "kvinspect-traces"
INDEX_NAME = "index.json"  # one entry per trace of the run: model, files, turns, events (kvinspect view DIR lists it)


class TraceCommandError(KvInspectError):
    """The program to trace cannot be started, or the output folder cannot be used."""


class ProgramNotFound(TraceCommandError):
    """No such program (not on PATH, or no such file): exit 127, as a shell does."""

    exit_code = 127


class ProgramNotExecutable(TraceCommandError):
    """The program exists but cannot be run (not executable, a folder, permission denied): exit 126."""

    exit_code = 126


def add_parser(sub) -> None:
    p = sub.add_parser(
        "trace", help="run your own program unchanged and observe every causal LM it runs",
        description="Run COMMAND (usually `python my_script.py ARGS`) unchanged and observe the KV cache of every "
                    "transformers causal LM it runs. The trace grows while it runs: watch it with "
                    "`kvinspect view --follow DIR`. The program's output and exit code pass through (127 when it "
                    "is not found, 126 when it cannot be run); the per-turn table and the events are printed on "
                    "stderr afterwards.",
        usage="kvinspect trace [--out DIR] [-q] -- python my_script.py [ARGS ...]",
    )
    p.add_argument("--out", metavar="DIR", default=None,
                   help=f"trace folder (default: a new ./{DEFAULT_ROOT}/<date-time> folder)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only where the trace is, not the tables")
    p.add_argument("--overwrite", action="store_true", help="replace the traces already in --out")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="the program to run, after `--`")


def main(args, argv) -> int:
    cmd = list(args.program)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise TraceCommandError("nothing to run: kvinspect trace [--out DIR] -- python my_script.py ARGS")
    _check_program(cmd)
    claimed = _out_dir(args.out, args.overwrite)
    out = claimed.path
    env = _child_env(out)
    shown = shlex.join(cmd)
    print(f"kvinspect: tracing `{shown}` → {out}", file=sys.stderr, flush=True)
    try:
        with claimed:
            rc = _run(cmd, env)
    except TraceCommandError:
        if claimed.created:
            _remove_empty(out)
        raise
    status = f"exit code {rc}" if rc else "exited normally"
    # A trace is written at a model's first forward pass: then it replaces the earlier ones. A program
    # that never ran a model (a bad model path, a crash while loading) leaves them as they were.
    if not any(out.glob("trace*.jsonl")):
        kept = " (the earlier traces there are kept)" if claimed.aside is not None else ""
        claimed.abandon()
        print(f"kvinspect: nothing observed: `{shown}` ({status}) ran no forward pass of a transformers causal LM, "
              f"so no trace was written{kept}", file=sys.stderr)
        if claimed.created:
            _remove_empty(out)
        return rc
    claimed.replaced()
    return _report(out, shown, status, rc, quiet=args.quiet)


def _check_program(cmd: list[str]) -> None:
    """Refuse a program that cannot start before anything is printed or created."""
    import shutil

    exe = cmd[0]
    if os.sep in exe or (os.altsep and os.altsep in exe):
        p = Path(exe)
        if not p.exists():
            raise ProgramNotFound(f"command not found: {exe}")
        if p.is_dir() or not os.access(p, os.X_OK):
            raise ProgramNotExecutable(f"cannot run {exe}: not an executable file")
    elif shutil.which(exe) is None:
        raise ProgramNotFound(f"command not found: {exe}")


def _out_dir(given: str | None, overwrite: bool = False) -> ClaimedOut:
    if given is not None:
        out = out_arg(given, error=TraceCommandError)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path(DEFAULT_ROOT) / stamp
        n = 2
        while out.exists():
            out = Path(DEFAULT_ROOT) / f"{stamp}-{n}"
            n += 1
    claimed = claim_out_dir(out, lambda d: [*d.glob("trace*.jsonl"), *d.glob("summary*.json"), *d.glob(INDEX_NAME)], "a trace",
                            overwrite, TraceCommandError)
    claimed.path = out.resolve()  # the child's trace folder, whatever its working directory
    return claimed


def _child_env(out: Path) -> dict:
    import kvinspect.core.observe

    from ..core.observe.tracer import ENV_DIR, ENV_PKG

    boot = Path(kvinspect.core.observe.__file__).resolve().parent / "_trace_boot"
    from ..cli import QUIETED

    # The program runs as it would without kvinspect: none of our own quieting reaches it.
    env = {k: v for k, v in os.environ.items() if QUIETED.get(k) != v}
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(boot) + (os.pathsep + old if old else "")
    env[ENV_DIR] = str(out)
    env[ENV_PKG] = str(Path(kvinspect.core.observe.__file__).resolve().parents[3])
    return env


def _run(cmd: list[str], env: dict) -> int:
    try:
        child = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        raise ProgramNotFound(f"command not found: {cmd[0]}") from None
    except PermissionError:
        raise ProgramNotExecutable(f"cannot run {cmd[0]}: permission denied") from None
    except OSError as exc:
        if runtime_fault(exc) is not None:
            raise  # no memory to start it: the machine's fault (exit 1), not the program's
        raise ProgramNotExecutable(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None  # e.g. exec format error
    # Ctrl-C reaches the child through the terminal; we wait for it, then report what it did.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = child.wait()
    finally:
        signal.signal(signal.SIGINT, old)
    return 128 - rc if rc < 0 else rc  # killed by signal N: the shell's 128 + N


def _report(out: Path, shown: str, status: str, rc: int, quiet: bool) -> int:
    from ..core.report.tables import events_text, turn_table
    from ..core.trace.summary import write_summary
    from ..core.trace.tracefile import read_trace

    traces = sorted(out.glob("trace*.jsonl"), key=lambda p: (p.name != "trace.jsonl", p.name))
    err = sys.stderr
    index: list[dict] = []
    for path in traces:
        try:
            rec = read_trace(path)
        except KvInspectError as exc:
            echo(f"kvinspect: {path.name}: {exc}", file=err)
            continue
        summary = path.with_name("summary.json" if path.name == "trace.jsonl"
                                 else "summary" + path.name[len("trace"):-len(".jsonl")] + ".json")
        try:
            write_summary(summary, rec)
        except OSError as exc:  # a full disk: say so, and still pass on the program's own exit code
            print(f"kvinspect: cannot write {summary}: {exc.strerror or exc}", file=err)
            try:
                summary.unlink(missing_ok=True)  # no half-written summary
            except OSError:
                pass
            summary = None
        model = (rec.header.get("model") or {}).get("name") or "model"
        problems = [e for e in rec.events if e.is_problem]
        index.append({"model": model, "class": (rec.header.get("model") or {}).get("class", ""),
                      "role": (rec.header.get("model") or {}).get("role", ""), "trace": path.name,
                      "summary": summary.name if summary else None, "turns": len(rec.turns),
                      "events": len(rec.events), "problems": len(problems),
                      "problem_kinds": sorted({e.kind for e in problems})})
        if not quiet:
            echo(f"\n── {model} ({rec.header.get('model', {}).get('class', '')}): {len(rec.turns)} turn(s), "
                  f"{rec.n_steps} forward passes ──", file=err)
            echo(turn_table(rec), file=err)
            for t in rec.turns[:50]:  # which call of the program each turn was
                echo(f"  turn {t.index + 1}: {t.user}", file=err)
            print(file=err)
            echo(events_text(rec), file=err)
            for note in rec.notes:
                echo(f"note: {note}", file=err)
        if not quiet:
            print(f"trace: {path}" + (f"\nsummary: {summary}" if summary else ""), file=err)
    try:
        (out / INDEX_NAME).write_text(json_dumps_utf8({"command": shown, "status": status, "traces": index},
                                                      indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"kvinspect: cannot write {out / INDEX_NAME}: {exc.strerror or exc}", file=err)
    if quiet:
        flagged = sum(1 for i in index if i["problems"])
        print(f"kvinspect: {len(index)} model{'s' if len(index) != 1 else ''} observed → {out} ({flagged} with "
              f"events); `{shown}` {status}", file=err)
    else:
        print(f"kvinspect: `{shown}` {status}; open the trace with: kvinspect view {out}", file=err)
    return rc


def _remove_empty(out: Path) -> None:
    try:
        if out.exists():
            out.rmdir()
        if out.parent.name == DEFAULT_ROOT:
            out.parent.rmdir()  # ./kvinspect-traces when this was its only run
    except OSError:
        pass
