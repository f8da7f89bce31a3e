"""``kvinspect run``: a scripted conversation, headless; writes the trace and summary.json."""

from __future__ import annotations

from pathlib import Path

from ..core.session.options import apply_script_overrides, check_fixed_choice, session_options
from .common import ClaimedOut, add_model_args, add_session_args, claim_out_dir, echo, out_arg, progress_printer


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a scripted conversation headless; write a trace and summary.json")
    add_model_args(p)
    p.add_argument("--script", required=True, metavar="FILE", help="chat script JSON (see docs/trace-format.md)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (trace.jsonl, summary.json, script.json)")
    add_session_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="do not stream replies")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out")
    p.add_argument("--fail-on-problems", action="store_true",
                   help="exit 1 when a warning or error event fired (summary.json's \"problems\"), for CI checks")


def main(args, argv) -> int:
    from ..core.model.loading import load_model, resolve_spec
    from ..core.report.tables import checklist_text, events_text, turn_table
    from ..core.session.policies import check_cache_available
    from ..core.session.runner import run_script
    from ..core.session.script import load_script

    script = apply_script_overrides(load_script(args.script), args)
    opts = session_options(args)
    check_fixed_choice(opts)
    resolve_spec(args.model)  # fail fast, before torch is imported
    out = out_arg(args.out)
    claimed = prepare_out(out, Path(args.script), args.overwrite)
    with claimed:  # with --overwrite: the earlier run comes back unless this one gets a turn on disk
        loaded = load_model(args.model, device=args.device, dtype=args.dtype,
                            trust_remote_code=args.trust_remote_code, progress=progress_printer("loading " + args.model))
        check_cache_available(loaded, opts.cache_impl)
    stream = not args.quiet

    def on_turn_start(i, text):
        head = f"── turn {i + 1} ── user: {one_line(text, 100)}"
        echo(f"\n{head}" if stream else head, flush=True)
        if stream:
            print("assistant: ", end="", flush=True)

    def on_token(t):
        if stream:
            echo(t, end="", flush=True)

    def on_turn(turn):
        claimed.replaced()  # this run's first turn is on disk: the earlier run is replaced
        if stream:
            print()
        if turn.status == "failed":
            echo(f"turn {turn.index + 1} failed: {turn.error}", flush=True)

    with claimed:  # an exception before the first turn was written: the earlier run stays as it was
        res = run_script(loaded, script, out, opts, command=reproduce_command(args), on_token=on_token,
                         on_turn_start=on_turn_start, on_turn=on_turn)
    rec = res.record
    print()
    echo(turn_table(rec))
    print()
    echo(events_text(rec))
    print()
    echo(checklist_text(rec))
    echo(f"\ntrace: {res.trace}\nsummary: {res.summary}")
    return _exit_code(rec, args.fail_on_problems)


def one_line(text: str, limit: int) -> str:
    text = " ⏎ ".join(ln.strip() for ln in text.strip().splitlines())  # echo() escapes what is left
    return text if len(text) <= limit else text[: limit - 1] + f"… ({len(text):,} chars)"


def prepare_out(out: Path, script: Path, overwrite: bool) -> ClaimedOut:
    """``--out`` claimed for a run (see :func:`claim_out_dir`); never the folder the script is read from."""
    from ..core.errors import ScriptError
    from ..core.session.runner import SCRIPT_NAME, SUMMARY_NAME
    from ..core.trace.tracefile import TRACE_NAME

    if (out / SCRIPT_NAME).exists() and script.resolve() == (out / SCRIPT_NAME).resolve():
        raise ScriptError(f"--script {script} is the script.json this run writes into --out; copy it elsewhere "
                          "or choose another --out")
    for name in (TRACE_NAME, SUMMARY_NAME, SCRIPT_NAME):
        if (out / name).is_dir():
            raise ScriptError(f"{out / name} is a folder; choose another --out")

    def earlier(d: Path) -> list[Path]:
        if not any((d / n).exists() for n in (TRACE_NAME, SUMMARY_NAME)):
            return []
        return [d / n for n in (TRACE_NAME, SUMMARY_NAME, SCRIPT_NAME) if (d / n).exists()]

    return claim_out_dir(out, earlier, "a run", overwrite, owns=lambda n: n in (TRACE_NAME, SUMMARY_NAME, SCRIPT_NAME))


def _exit_code(rec, fail_on_problems: bool) -> int:
    """0 when every turn ran; 1 when one failed, or (asked for) when a problem event fired.

    The trace and summary are written either way; 2 stays reserved for the user's input mistakes.
    """
    import sys

    failed = [t.index + 1 for t in rec.turns if t.status == "failed"]
    problems = sorted({e.kind for e in rec.events if e.is_problem})
    if failed:
        print(f"kvinspect: turn{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} of "
              f"{len(rec.turns)} failed; the trace keeps every turn", file=sys.stderr)
        return 1
    if fail_on_problems and problems:
        print(f"kvinspect: problems found: {', '.join(problems)}", file=sys.stderr)
        return 1
    return 0


def reproduce_command(args) -> list[str]:
    """The command line that reproduces this run, with the script as saved next to the trace."""
    cmd = ["kvinspect", "run", "--model", args.model, "--script", "script.json", "--out", "rerun"]
    if args.device != "auto":
        cmd += ["--device", args.device]
    if args.dtype != "auto":
        cmd += ["--dtype", args.dtype]
    if args.policy != "reuse":
        cmd += ["--policy", args.policy]
    if args.cache != "dynamic":
        cmd += ["--cache", args.cache]
    if args.chat_template:
        cmd += ["--chat-template", args.chat_template]
    if args.max_cache_len:
        cmd += ["--max-cache-len", str(args.max_cache_len)]
    for kv in args.generation_config:
        cmd += ["--generation-config", kv]
    if args.respect_generation_config:
        cmd.append("--respect-generation-config")
    if args.trust_remote_code:
        cmd.append("--trust-remote-code")
    return cmd
