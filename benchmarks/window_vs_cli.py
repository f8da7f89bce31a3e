"""Decode speed and time to first token of one chat script, in the window (Xvfb) and in ``kvinspect run``.

Each pair runs the same script (2 turns × 96 new tokens, greedy, SmolLM2 on CPU by default) once
through ``kvinspect gui --script … --exit-when-done`` on a private Xvfb (the real xcb platform,
painting at its paint clock's rate while the engine generates) and once through ``kvinspect run``, in fresh
processes; the order inside a pair alternates, so drift in machine load hits both arms. The figures
are each turn's own, as the trace records them (``tokens_per_s``: decode rate after the first token;
``ttft_s``: prompt to first token), read from the window's autosave and from run's summary.json.
Reported: every pair's medians, the medians over pairs, and window/CLI ratios measured pair by pair.

Goals (the current ones, window-CPU issue): window/CLI decode ≥ 0.97, TTFT ≤ 1.05×. Timings are the machine's,
not assertions::

    .venv/bin/python benchmarks/window_vs_cli.py                     # 3 interleaved pairs, SmolLM2
    .venv/bin/python benchmarks/window_vs_cli.py --pairs 7 --model tiny-llama --tokens 200
    .venv/bin/python benchmarks/window_vs_cli.py --engine-threads 2   # the engine on every core, like run

A local engine leaves one core to the window (torch threads = cores − 1, docs/gui.md), ``kvinspect
run`` uses every core; ``--engine-threads`` / ``--cli-threads`` set them (``KVINSPECT_TORCH_THREADS``,
``OMP_NUM_THREADS``) to tell that choice from the cost of the window itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fetched import require_fetched  # noqa: E402
from _xvfb import xvfb  # noqa: E402

TURNS = ["Write a long story about a lighthouse keeper who finds a message in a bottle.",
         "Continue the story: what does the keeper do next? Tell it in detail."]


def _env(base: dict, folder: Path) -> dict:
    env = dict(base)
    env.update(KVINSPECT_CONFIG_DIR=str(folder / "config"), KVINSPECT_DATA_DIR=str(folder / "data"),
               KVINSPECT_EPHEMERAL="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return env


def _turn_figures(turns) -> tuple[list[float], list[float], list[int]]:
    ok = [t for t in turns if t["status"] == "ok"]
    if len(ok) != len(turns):
        raise SystemExit(f"a turn did not finish ok: {[t['status'] for t in turns]}")
    return [t["tokens_per_s"] for t in ok], [t["ttft_s"] for t in ok], [t["new_tokens"] for t in ok]


def run_window(script: Path, folder: Path, base_env: dict, args) -> dict:
    from kvinspect.core.trace.tracefile import read_trace

    env = _env(base_env, folder)
    if args.engine_threads:
        env["KVINSPECT_TORCH_THREADS"] = str(args.engine_threads)
    cmd = [sys.executable, "-m", "kvinspect", "gui", "--model", args.model, "--device", args.device,
           "--script", str(script), "--exit-when-done"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"the window run failed ({p.returncode}): {p.stderr[-1500:]}")
    traces = sorted((folder / "data" / "autosave").glob("*.jsonl"))
    rec = read_trace(traces[-1])
    return dict(zip(("tok_s", "ttft", "tokens"), _turn_figures([t.to_dict() for t in rec.turns]), strict=True))


def run_cli(script: Path, folder: Path, base_env: dict, args) -> dict:
    env = _env(base_env, folder)
    if args.cli_threads:
        env["OMP_NUM_THREADS"] = str(args.cli_threads)
    out = folder / "out"
    cmd = [sys.executable, "-m", "kvinspect", "run", "--model", args.model, "--device", args.device,
           "--script", str(script), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"kvinspect run failed ({p.returncode}): {p.stderr[-1500:]}")
    summary = json.loads((out / "summary.json").read_text())
    return dict(zip(("tok_s", "ttft", "tokens"), _turn_figures(summary["turns"]), strict=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="interleaved window/CLI pairs (default 3)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=96, help="max_new_tokens per turn (default 96)")
    ap.add_argument("--display", default=None, help="use this X display instead of starting Xvfb")
    ap.add_argument("--engine-threads", type=int, default=None, help="torch threads of the window's engine "
                    "(default: cores - 1, the engine's own choice)")
    ap.add_argument("--cli-threads", type=int, default=None, help="torch threads of kvinspect run (default: torch's)")
    args = ap.parse_args(argv)
    require_fetched(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="kvinspect-window-vs-cli-"))
    script = tmp / "script.json"
    script.write_text(json.dumps({"turns": TURNS, "max_new_tokens": args.tokens, "do_sample": False, "seed": 0}))
    rows = []
    with xvfb(args.display) as env:
        print(f"window_vs_cli: {args.model} on {args.device}, {len(TURNS)} turns × {args.tokens} tokens, "
              f"{args.pairs} interleaved pairs, window on {env['DISPLAY']} (xcb); torch threads: engine "
              f"{args.engine_threads or 'its default'}, cli {args.cli_threads or 'torch default'}, {os.cpu_count()} cores")
        for i in range(args.pairs):
            arms = [("window", run_window), ("cli", run_cli)]
            if i % 2:
                arms.reverse()
            res = {}
            for name, fn in arms:
                res[name] = fn(script, tmp / f"{name}-{i}", env, args)
            w, c = res["window"], res["cli"]
            wt, ct = statistics.median(w["tok_s"]), statistics.median(c["tok_s"])
            wf, cf = statistics.median(w["ttft"]), statistics.median(c["ttft"])
            rows.append((wt, ct, wf, cf))
            print(f"  pair {i + 1} ({arms[0][0]} first): decode window {wt:5.1f} tok/s  cli {ct:5.1f} tok/s  "
                  f"({wt / ct:.2f}×)   TTFT window {wf * 1000:4.0f} ms  cli {cf * 1000:4.0f} ms ({wf / cf:.2f}×)   "
                  f"tokens {w['tokens']} / {c['tokens']}   load average {os.getloadavg()[0]:.1f}")
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    dec_ratio = statistics.median(r[0] / r[1] for r in rows)
    ttft_ratio = statistics.median(r[2] / r[3] for r in rows)
    print(f"  medians: decode window {med[0]:.1f} tok/s, cli {med[1]:.1f} tok/s; TTFT window {med[2] * 1000:.0f} ms, "
          f"cli {med[3] * 1000:.0f} ms")
    print(f"  window/cli (median of pairs): decode {dec_ratio:.2f}× (goal ≥ 0.97: {'met' if dec_ratio >= 0.97 else 'NOT met'}),"
          f" TTFT {ttft_ratio:.2f}× (goal ≤ 1.05: {'met' if ttft_ratio <= 1.05 else 'NOT met'})")
    print(f"  ranges over pairs: decode ratio {min(r[0] / r[1] for r in rows):.2f}–{max(r[0] / r[1] for r in rows):.2f}, "
          f"TTFT ratio {min(r[2] / r[3] for r in rows):.2f}–{max(r[2] / r[3] for r in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
