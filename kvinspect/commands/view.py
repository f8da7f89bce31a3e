"""``kvinspect view TRACE`` and ``kvinspect view --follow PATH``: a trace in the inspector window.

The path is checked here, before Qt starts: a missing file, a file that is not a trace or a
trace of a newer format prints one line and exits 2. What was read for that check is handed
to the window, so nothing is read twice.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("view", help="show a saved trace read-only with a replay slider, or --follow one "
                                    "another program is writing",
                       description="Open a trace in the inspector window. Without --follow: read-only, with a "
                                   "replay slider and turn selector. With --follow: the window keeps reading "
                                   "what another process (kvinspect trace / run / observe, possibly on another "
                                   "machine whose folder is synced or mounted) appends, and shows it live.")
    p.add_argument("trace", metavar="PATH",
                   help="a trace .jsonl file or a folder holding one (with --follow: the newest trace*.jsonl "
                        "in the folder, switching to newer ones; the file may not exist yet)")
    p.add_argument("--follow", action="store_true", help="keep reading as the file grows (polls every 0.4 s)")
    p.add_argument("--theme", choices=("dark", "light"), default=None, help="window theme (default: as last time)")
    p.add_argument("--list", action="store_true",
                   help="print the traces of a `kvinspect trace` folder (its index.json: model, turns, events) "
                        "and exit, with no window")


def main(args, argv) -> int:
    from ..core.errors import TraceError

    if args.list:
        return _list(args.trace)
    if args.follow:
        # No Qt yet: the window opens only once the path is known to be followable.
        from ..core.trace.follow import FollowSource, check_follow_target

        target = check_follow_target(args.trace)
        source = FollowSource(target)
        try:
            source.poll()  # not a trace, a newer format: one line, exit 2, no window
        except OSError as exc:
            raise TraceError(f"cannot read {source.path or target}: {exc.strerror or exc}") from None
        return _run_viewer()(follow=str(target), source=source, theme=args.theme)

    from ..core.trace.tracefile import read_trace, trace_path

    record = read_trace(args.trace)  # TraceError: one line, exit 2
    return _run_viewer()(record=record, path=str(trace_path(args.trace)), theme=args.theme)


def _list(folder: str) -> int:
    """The folder's traces, one line each: what `kvinspect trace -q` left in index.json."""
    import json
    from pathlib import Path

    from ..core.errors import TraceError
    from .common import echo

    index = Path(folder) / "index.json"
    try:
        doc = json.loads(index.read_text(encoding="utf-8"))
        rows = [r for r in doc["traces"] if isinstance(r, dict)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TraceError(f"no trace index at {index} (kvinspect trace writes one): {exc}") from None
    for r in rows:
        kinds = ", ".join(str(k) for k in r.get("problem_kinds") or [])
        role = f" ({r['role']})" if r.get("role") else ""
        echo(f"{r.get('trace')}: {r.get('model')}{role}, {r.get('turns')} turn(s), {r.get('problems')} problem "
             f"event(s){': ' + kinds if kinds else ''}")
    echo(f"{len(rows)} trace(s); open one with: kvinspect view {Path(folder) / 'TRACE.jsonl'}")
    return 0


def _run_viewer():
    """The window's entry point; one line (not an ImportError) where the GUI stack is not installed."""
    from ..core.errors import KvInspectError

    try:
        from ..gui.app import run_viewer
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("PySide6", "pyqtgraph", "shiboken6"):
            raise KvInspectError(f"the window needs {exc.name.split('.')[0]}, which is not installed here; "
                                 f"`kvinspect report TRACE --out DIR` works without it") from None
        raise
    return run_viewer
