"""Compare cache configurations on SmolLM2-135M-Instruct: the figures behind docs/compare.md.

Runs ``run_compare`` (the code behind ``kvinspect compare``) once in this process: one model
load, the configurations interleaved between repeats (order rotated each repeat), medians
with their [min–max] spread, and ratios against the first configuration (dynamic by default)
measured in the same process. Prints the tables; the full report (compare.md, compare.json,
plots, every run's trace) goes to --out.

    .venv/bin/python benchmarks/compare_smollm2.py                       # dynamic,static,nocache ×3
    .venv/bin/python benchmarks/compare_smollm2.py --configs dynamic,static,static+compile --repeat 5
    .venv/bin/python benchmarks/compare_smollm2.py --prompt-lengths 32,256,1024 --repeat 3
    .venv/bin/python benchmarks/compare_smollm2.py --noise --repeat 6 --max-new-tokens 16   # in-process vs engines

``--engines`` runs every configuration in its own engine child (what ``kvinspect compare`` does);
``--noise`` runs the same plan both ways, in-process first, and prints the spread of the per-repeat
ratios (configuration ÷ baseline within one repeat) for each: (max − min) ÷ median.

Timings are the machine's, not assertions: run it when the machine is quiet and read the spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--configs", default="dynamic,static,nocache")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--script", default=str(ROOT / "resources" / "scripts" / "capital.json"))
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--max-cache-len", type=int, default=None)
    ap.add_argument("--prompt-lengths", default=None, help="run the length sweep instead of the conversation")
    ap.add_argument("--out", default=None, help="report folder (default: a temporary folder)")
    ap.add_argument("--plots", action="store_true", help="render the plot images too")
    ap.add_argument("--engines", action="store_true", help="every configuration in its own engine child")
    ap.add_argument("--noise", action="store_true", help="in-process, then engines: the per-repeat ratio spread")
    args = ap.parse_args(argv)
    if args.noise:
        return _noise(args)

    import torch

    from kvinspect.child_render import render_in_child
    from kvinspect.commands.compare import parse_lengths, summary_text
    from kvinspect.core.compare.configs import parse_configs
    from kvinspect.core.compare.markdown import fmt_s
    from kvinspect.core.compare.report import build_report, write_report
    from kvinspect.core.compare.run import ComparePlan, run_compare
    from kvinspect.core.env import versions
    from kvinspect.core.model.loading import load_model
    from kvinspect.core.session.script import load_script

    script = load_script(args.script)
    lengths = parse_lengths(args.prompt_lengths)
    plan = ComparePlan(configs=parse_configs(args.configs), script=script, repeat=args.repeat, warmup=args.warmup,
                       conversation=not lengths, prompt_lengths=lengths, max_cache_len=args.max_cache_len,
                       max_new_tokens=args.max_new_tokens, script_name=Path(args.script).name,
                       command=["python", "benchmarks/compare_smollm2.py", *(argv or sys.argv[1:])]).validate()
    out = Path(args.out or tempfile.mkdtemp(prefix="kvinspect-compare-bench-"))
    t0 = time.perf_counter()
    if args.engines:
        from kvinspect.engine.compare_children import ModelArgs, run_compare_in_engines

        result = run_compare_in_engines(ModelArgs(args.model, device=args.device), plan, out,
                                        progress=lambda d, t, m: print(f"  [{d}/{t}] {m}", file=sys.stderr, flush=True))
        write_report(result, out, plots=False)
        print(summary_text(result))
        _print_ratio_spread("engine children", result)
        return 0
    lm = load_model(args.model, device=args.device)
    v = versions()
    print(f"model {lm.name} ({type(lm.model).__name__}, {lm.dtype}) on {lm.device}, loaded in {lm.load_seconds:.1f} s; "
          f"transformers {v.get('transformers')}, torch {v.get('torch')}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"script {Path(args.script).name}: {len(script.turns)} turns, max_new_tokens {plan.settings.max_new_tokens}, "
          f"greedy; configurations {args.configs}; {args.repeat} interleaved repeats\n", flush=True)

    def progress(done: int, total: int, message: str) -> None:
        print(f"  [{done}/{total}] {message}", file=sys.stderr, flush=True)

    result = run_compare(lm, plan, out, progress=progress)
    files = write_report(result, out, plots=args.plots, renderer=render_in_child)
    data = build_report(result)
    print(summary_text(result))
    if plan.conversation:
        print("\nper turn (median [min–max] over repeats):")
        for c in data["configs"]:
            if not c["per_turn"]:
                continue
            cells = [f"turn {r['index'] + 1}: prefill {r['prefill_tokens']} tok, TTFT "
                     f"{fmt_s((r['ttft_s'] or {}).get('median'))}, turn {fmt_s((r['total_s'] or {}).get('median'))}"
                     for r in c["per_turn"]]
            print(f"  {c['name']:<16} " + " | ".join(cells))
        base = data["baseline"]
        b = next((c for c in data["configs"] if c["name"] == base and c["summary"]), None)
        if b:
            print(f"\nratios vs {base} (median ÷ median):")
            for c in data["configs"]:
                if c["summary"] and c["name"] != base:
                    r = {k: _ratio(c["summary"][k], b["summary"][k]) for k in
                         ("ttft_s", "conversation_s", "decode_tokens_per_s")}
                    print(f"  {c['name']:<16} TTFT {r['ttft_s']}, conversation {r['conversation_s']}, "
                          f"decode tok/s {r['decode_tokens_per_s']}")
    for c in result.configs:
        if c.status != "ran":
            print(f"{c.name}: {c.status}: {c.reason}")
    _print_ratio_spread("in-process", result)
    print(f"\nload average {os.getloadavg()[0]:.2f} at end; wall {time.perf_counter() - t0:.0f} s; "
          f"report {files.markdown}")
    return 0


def _run_figures(run) -> dict:
    ok = [t for t in run.turns if t["status"] == "ok"]
    rates = sorted(t["tokens_per_s"] for t in ok if t["tokens_per_s"])
    return {"conversation_s": sum(t["total_s"] for t in ok) if len(ok) == len(run.turns) else None,
            "decode_tokens_per_s": rates[len(rates) // 2] if rates else None}


def ratio_spread(result) -> dict[str, dict[str, tuple]]:
    """Per configuration and figure: the per-repeat ratios against the baseline run of the same repeat, and
    their spread (max − min) ÷ median."""
    from kvinspect.core.compare.report import baseline_name

    base = result.config(baseline_name(result))
    out = {}
    for c in result.configs:
        if c is base or not c.runs:
            continue
        figs = {}
        for key in ("conversation_s", "decode_tokens_per_s"):
            rs = []
            for a, b in zip(c.runs, base.runs):
                x, y = _run_figures(a)[key], _run_figures(b)[key]
                if x and y:
                    rs.append(x / y)
            rs.sort()
            med = statistics.median(rs) if rs else None
            figs[key] = (rs, (rs[-1] - rs[0]) / med if med else None)
        out[c.name] = figs
    return out


def _print_ratio_spread(label: str, result) -> dict:
    spread = ratio_spread(result)
    print(f"\nper-repeat ratio spread, {label} ((max − min) ÷ median of configuration ÷ baseline per repeat):")
    for name, figs in spread.items():
        cells = [f"{k}: {', '.join(f'{x:.3f}' for x in rs)} → spread {sp:.3f}" if sp is not None else f"{k}: –"
                 for k, (rs, sp) in figs.items()]
        print(f"  {name:<16} " + " | ".join(cells))
    return spread


def _noise(args) -> int:
    base = [a for a in sys.argv[1:] if a != "--noise"]
    for mode in ([], ["--engines"]):
        print(f"\n=== {'engine children' if mode else 'in-process'} ===", flush=True)
        rc = main(base + mode)
        if rc:
            return rc
    return 0


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not b["median"]:
        return "–"
    return f"{a['median'] / b['median']:.2f}×"


if __name__ == "__main__":
    sys.exit(main())
