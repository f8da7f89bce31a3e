"""``kvinspect compare``: one conversation under several cache configurations, side by side."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from .common import ClaimedOut, add_model_args, claim_out_dir, echo, out_arg, progress_printer

SECTIONS_HELP = ("With --turns-until-failure or --prompt-lengths only those sections run; add --conversation "
                 "to run the scripted comparison too.")


def add_parser(sub) -> None:
    from ..core.compare.configs import DEFAULT_CONFIGS

    p = sub.add_parser(
        "compare",
        help="run one conversation under several cache configurations; write compare.md/json and plots",
        description="Run the same scripted conversation under several cache configurations, each in its own "
                    "engine process (interleaved between repeats), optionally in several environments (--env), "
                    "and write compare.md, compare.json, plots and every run's trace. " + SECTIONS_HELP)
    add_model_args(p)
    p.add_argument("--script", metavar="FILE", help="chat script JSON (see docs/trace-format.md)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, metavar="LIST",
                   help="comma-separated: dynamic, static, static+compile, offloaded, quantized, nocache, any "
                        f"policy name (e.g. recreate) or POLICY:IMPL (default {DEFAULT_CONFIGS})")
    p.add_argument("--repeat", type=int, default=3, metavar="N",
                   help="measured repeats per configuration (default 3)")
    p.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="untimed rounds before the repeats (static+compile always gets one; default 0)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder (compare.md, compare.json, plots/, runs/)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier comparison in --out")
    p.add_argument("--turns-until-failure", type=int, default=None, metavar="MAX",
                   help="stress: extend the conversation (script turns cycled) until each configuration "
                        "fails, or MAX turns")
    p.add_argument("--prompt-lengths", default=None, metavar="LIST",
                   help="sweep: one turn per configuration at these rendered prompt lengths, e.g. 32,256,2048")
    p.add_argument("--conversation", action="store_true",
                   help="also run the scripted comparison when --turns-until-failure/--prompt-lengths are given")
    p.add_argument("--max-cache-len", type=int, default=None, metavar="N",
                   help="rows of static caches (default: min(max positions, 2048); "
                        "sweep: longest prompt + max_new_tokens)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the script's max_new_tokens")
    p.add_argument("--seed", type=int, default=None, help="override the script's seed")
    p.add_argument("--system", default=None, help="override the script's system prompt")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template replacing the tokenizer's")
    p.add_argument("--compile-mode", default=None, metavar="MODE",
                   help="torch.compile mode for static+compile (default: reduce-overhead on CUDA, default elsewhere)")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="the configuration whose greedy replies the others must equal (default: the first)")
    p.add_argument("--env", action="append", default=None, metavar="NAME=PYTHON",
                   help="an environment to compare in (repeatable): NAME=PYTHON (another interpreter, e.g. another "
                        "transformers version) or NAME=ssh:HOST:PYTHON; every environment runs every configuration, "
                        "and with two the report says where their traces part")
    p.add_argument("--in-process", action="store_true",
                   help="run every configuration in this process instead of an engine child each (no --env)")
    p.add_argument("--no-plots", action="store_true", help="skip the plot images")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-turn progress lines")


def parse_lengths(text: str | None) -> list[int]:
    from ..core.errors import ScriptError

    if not text:
        return []
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            n = int(item)
        except ValueError:
            raise ScriptError(f"--prompt-lengths expects token counts like 32,256,2048, got {item!r}") from None
        if n < 1:
            raise ScriptError(f"--prompt-lengths: {n} is not a positive token count")
        out.append(n)
    if not out:
        raise ScriptError("--prompt-lengths is empty; give token counts like 32,256,2048")
    return out


def build_plan(args, argv: list[str] | None = None):
    """A ComparePlan from the flags, checked before any model is loaded."""
    from ..core.compare.configs import parse_configs
    from ..core.compare.run import ComparePlan
    from ..core.errors import ScriptError
    from ..core.session.options import apply_script_overrides
    from ..core.session.script import load_script

    configs = parse_configs(args.configs)
    lengths = parse_lengths(args.prompt_lengths)
    conversation = args.conversation or not (args.turns_until_failure or lengths)
    script = None
    if args.script:
        script = apply_script_overrides(load_script(args.script), args)
    elif conversation or args.turns_until_failure:
        raise ScriptError("--script is needed (the conversation to compare); only --prompt-lengths works without one")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ScriptError("--max-new-tokens must be positive")
    if args.compile_mode is not None and args.compile_mode not in COMPILE_MODES:
        raise ScriptError(f"--compile-mode {args.compile_mode!r} is not a torch.compile mode: "
                          f"{', '.join(COMPILE_MODES)}")
    plan = ComparePlan(
        configs=configs, script=script, repeat=args.repeat, warmup=args.warmup, conversation=conversation,
        turns_until_failure=args.turns_until_failure, prompt_lengths=lengths, max_cache_len=args.max_cache_len,
        max_new_tokens=args.max_new_tokens, compile_mode=args.compile_mode,
        script_name=Path(args.script).name if args.script else None,
        command=["kvinspect", *(argv if argv is not None else sys.argv[1:])],
        baseline=_baseline_name(args.baseline),
    )
    if args.chat_template:
        from ..core.session.options import read_chat_template

        plan.chat_template = read_chat_template(args.chat_template)
        plan.chat_template_name = str(args.chat_template)
    return plan.validate()


def _baseline_name(text: str | None) -> str | None:
    """--baseline in the canonical spelling the configurations get (``reuse:static`` is ``static``)."""
    if text is None:
        return None
    from ..core.compare.configs import parse_configs
    from ..core.errors import ScriptError

    found = parse_configs(text)
    if len(found) != 1:
        raise ScriptError(f"--baseline names one configuration, got {text!r}")
    return found[0].name


#: torch.compile's modes (torch._inductor's list; a wrong one is a RuntimeError after the model loaded).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def prepare_out(out: Path, overwrite: bool) -> ClaimedOut:
    from ..core.compare.report import JSON_NAME, MD_NAME, PLOTS_DIR
    from ..core.compare.run import RUNS_DIR

    def earlier(d: Path) -> list[Path]:
        if not ((d / JSON_NAME).exists() or any((d / RUNS_DIR).glob("*"))):
            return []
        return [p for p in (d / RUNS_DIR, d / PLOTS_DIR, d / JSON_NAME, d / MD_NAME) if p.exists()]

    if out.is_dir() and not earlier(out) and any(not q.name.startswith(".") for q in out.iterdir()):
        from ..core.errors import ScriptError

        # Files of another kind there would be overwritten by compare.json, compare.md, plots/ …
        raise ScriptError(f"--out {out} is not empty and holds no earlier comparison; give a new or empty folder "
                          f"so nothing there is overwritten")
    return claim_out_dir(out, earlier, "a comparison", overwrite,
                         owns=lambda n: n in (RUNS_DIR, PLOTS_DIR, JSON_NAME, MD_NAME))


class _Interrupt:
    """First Ctrl-C: finish gracefully (the turn in progress stops at its next token, the report is
    written with what finished). A second Ctrl-C aborts at once."""

    def __init__(self):
        self.hit = False
        self._old = None

    def __enter__(self):
        # Signal handlers belong to the main thread; elsewhere (an embedding app) Ctrl-C stays as it is.
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True
        print("\nkvinspect: stopping after the current step; the report keeps what finished "
              "(Ctrl-C again to abort)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def __call__(self) -> bool:
        return self.hit


def main(args, argv) -> int:
    from ..child_render import render_in_child
    from ..core.compare.report import write_report
    from ..core.errors import ScriptError
    from ..core.model.loading import resolve_spec
    from ..engine.compare_children import parse_envs

    plan = build_plan(args, argv)
    envs = parse_envs(args.env)
    if args.in_process and envs:
        raise ScriptError("--in-process runs in this Python only; it cannot be combined with --env")
    resolve_spec(args.model)  # fail fast, before torch is imported
    out = out_arg(args.out)

    def progress(done: int, total: int, message: str) -> None:
        if not args.quiet:
            echo(f"[{done}/{total}] {message}", file=sys.stderr, flush=True)

    # With --overwrite the earlier comparison comes back unless this one's measurements reach the disk.
    with prepare_out(out, args.overwrite) as claimed:
        with _Interrupt() as interrupted:
            if args.in_process:
                result = _in_process(args, plan, out, progress, interrupted)
            else:
                from ..engine.compare_children import ModelArgs, run_compare_in_engines

                model = ModelArgs(args.model, device=args.device, dtype=args.dtype,
                                  trust_remote_code=args.trust_remote_code, command=plan.command)
                result = run_compare_in_engines(model, plan, out, envs=envs, progress=progress, cancel=interrupted)
        claimed.replaced()
    for e in result.environments:
        echo(f"environment {e['name']}: kvinspect {e.get('kvinspect') or '?'}, transformers "
             f"{e.get('transformers') or '?'}, torch {e.get('torch') or '?'}, device {e.get('device') or '?'}"
             + (f" ({e['error']})" if e.get("error") else ""))
    files = write_report(result, out, plots=not args.no_plots, renderer=render_in_child)
    text = summary_text(result)
    if text:
        echo(text)
    for c in result.configs:
        if c.status != "ran":
            echo(f"{c.name}: {c.status}: {c.reason}")
    _print_diffs(result.diffs)
    for n in files.notes:
        echo(n)
    print(f"\nreport: {files.markdown}\ndata: {files.json}")
    if files.plots:
        print("plots: " + ", ".join(str(p) for p in files.plots if p.suffix == ".png"))
    if result.cancelled:
        print("cancelled: the report covers what finished", file=sys.stderr)
        return 130
    unmeasured = result.unmeasured()
    if unmeasured:
        # The files list every skip with its reason; the exit status says nothing was measured.
        raise ScriptError(unmeasured[0])
    return 0


def _print_diffs(diffs: list[dict]) -> None:
    from ..core.compare.trace_diff import diff_text

    for d in diffs:
        echo(f"\nwhere they part, {d['config']}:")
        echo(f"  not compared: {d['skip']}" if d.get("skip") else diff_text(d))


def _in_process(args, plan, out, progress, interrupted):
    from ..core.compare.run import run_compare
    from ..core.model.loading import load_model

    loaded = load_model(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                        progress=None if args.quiet else progress_printer("loading " + args.model))
    return run_compare(loaded, plan, out, progress=progress, cancel=interrupted)


def summary_text(result) -> str:
    """A terminal table of the per-configuration medians (compare.md has everything)."""
    from ..core.compare.markdown import fmt_rate, recompile_note, spread
    from ..core.compare.report import build_report
    from ..core.units import fmt_bytes

    d = build_report(result)
    lines = []
    ran = [c for c in d["configs"] if c["summary"]]
    if ran:
        head = ["configuration", "TTFT", "conversation", "decode tok/s", "prefill/turn", "peak KV", "failed"]
        rows = [[c["name"], spread(c["summary"]["ttft_s"]), spread(c["summary"]["conversation_s"]),
                 spread(c["summary"]["decode_tokens_per_s"], fmt_rate),
                 ",".join("-" if x is None else str(x) for x in c["summary"]["prefill_tokens_per_turn"]),
                 fmt_bytes(c["summary"]["peak_kv_bytes"]), str(c["summary"]["turns_failed"])] for c in ran]
        lines += _text_table(head, rows)
    for c in d["configs"]:
        w = c.get("warmup") or {}
        if c.get("compile") and w.get("compiled_graphs") is not None:
            lines.append(f"{c['name']}: graphs compiled (recompilations included): {w['compiled_graphs']} in warm-up, "
                         f"{c.get('steady_compiled_graphs')} during the measured repeats")
        if c.get("recompile_limit"):
            lines.append(recompile_note(c["name"], c["recompile_limit"]).replace("`", ""))
    if d.get("stress") and d["stress"]["configs"]:
        lines.append("")
        rows = [[c["name"], c["status"], str(c["failed_at_turn"] or "-"), str(c["tokens_at_failure"] or "-"),
                 str(c.get("cache_rows_needed") or "-"), c["failure_kind"] or "-"] for c in d["stress"]["configs"]]
        lines += _text_table(["stress", "result", "failed at turn", "tokens at failure (prompt+new)",
                              "cache rows needed", "kind"], rows)
    if d.get("lengths") and d["lengths"]["configs"] and d["lengths"]["prompt_tokens"]:
        lines.append("")
        lens = [int(k) for k in d["lengths"]["prompt_tokens"]]
        rows = []
        for c in d["lengths"]["configs"]:
            pts = {p["length"]: p for p in c["points"]}
            rows.append([c["name"]] + [spread(pts[n]["ttft_s"]) if n in pts else "-" for n in lens])
        lines += _text_table(["TTFT by prompt length"] + [str(n) for n in lens], rows)
    return "\n".join(lines).strip("\n")


def _text_table(head: list[str], rows: list[list[str]]) -> list[str]:
    from ..core.report.text_table import text_table

    return text_table(head, rows).split("\n")
