"""``kvinspect report TRACE --out DIR``: a bug-report bundle that reads anywhere, offline."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write a bug-report bundle (report.md, plots, summary, trace, "
                                      "reproduce command) from a trace")
    p.add_argument("trace", metavar="TRACE", help="a trace.jsonl, or the folder holding one (e.g. a run's --out)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="bundle folder: new, empty, or an earlier bundle (which is replaced)")
    p.add_argument("--redact", action="store_true",
                   help="replace prompts, replies and the system prompt by token counts in every file "
                        "(script.json is then left out)")
    p.add_argument("--no-plots", action="store_true", help="skip cache.png / memory.png (no Qt child process)")


def main(args, argv) -> int:
    import shlex

    from ..child_render import render_in_child
    from ..core.errors import RuntimeFault, runtime_fault
    from ..core.report.bundle import write_report
    from .common import out_arg

    out = out_arg(args.out)
    before = _files(out)
    created = not out.exists()
    try:
        res = write_report(args.trace, out, redact=args.redact, plots_enabled=not args.no_plots,
                           renderer=render_in_child)
    except OSError as exc:
        fault = runtime_fault(exc)
        if fault is None:
            raise
        # A full disk under --out is the target's fault, not the trace's: say where, and leave no
        # half-written bundle behind (an earlier bundle there was already being replaced).
        _remove_new(out, before, created)
        raise RuntimeFault(f"cannot write the report into {out}: {exc.strerror or exc}; the partial bundle "
                           f"was removed") from None
    from .common import echo

    for n in res.trace_notes:
        echo(f"trace: {n}")
    echo(f"report: {res.report}")
    echo("files: " + ", ".join(f.name for f in res.files[1:]))
    for n in res.notes:
        echo(f"note: {n}")
    if res.reproduction is not None:
        where = res.reproduction.run_in or res.out_dir
        echo(f"reproduce, from {where}: {shlex.join(res.reproduction.command)}")
    return 0


def _files(out) -> set:
    try:
        return {p.name for p in out.iterdir()} if out.is_dir() else set()
    except OSError:
        return set()


def _remove_new(out, before: set, created: bool) -> None:
    import shutil

    for name in _files(out) - before:
        p = out / name
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError:
            pass
    if created:
        try:
            out.rmdir()
        except OSError:
            pass
