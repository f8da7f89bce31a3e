"""Decode speed and time to first token of one chat script, in the window (Xvfb) and in ``kvinspect run``.

Each pair runs the same script (2 turns × 96 new tokens, greedy, SmolLM2 on CPU by default) once
through ``kvinspect gui --script … --exit-when-done`` on a private Xvfb (the real xcb platform,
painting at its paint clock's rate while the engine generates) and once through ``kvinspect run``, in fresh
processes; the order inside a pair rotates, so drift in machine load hits every arm. The figures
are each turn's own, as the trace records them (``tokens_per_s``: decode rate after the first token;
``ttft_s``: prompt to first token), read from the window's autosave and from run's summary.json.
Reported: every pair's medians, the medians over pairs, and window/CLI ratios measured pair by pair;
TTFT also split into the first turn (the first prefill after the load) and the later ones.

``--headless`` adds a third arm: the same ``kvinspect engine`` process the window starts, driven over
the same protocol by a script with no window (each turn sent as the last one ends). Window/engine is
then the window's own cost, with the engine process and its protocol out of the comparison.

TTFT is one prefill of 100–250 ms, and a fresh process's first one moves by ±15 % from process to
process on this kind of machine (docs/redraw.md, "Time to first token"): a 3-pair median can land
on either side of 1.05 with no change at all. ``--pairs 8`` or more tells a real gap from that.

Goals (the current ones, window-CPU issue): window/CLI decode ≥ 0.97, TTFT ≤ 1.05×. Timings are the machine's,
not assertions::

    .venv/bin/python benchmarks/window_vs_cli.py                     # 3 interleaved pairs, SmolLM2
    .venv/bin/python benchmarks/window_vs_cli.py --pairs 8 --headless
    .venv/bin/python benchmarks/window_vs_cli.py --pairs 7 --model tiny-llama --tokens 200
    .venv/bin/python benchmarks/window_vs_cli.py --engine-threads 1   # leave a core to the window

The window's engine, like ``kvinspect run``, uses every core (``kvinspect/engine/server.py``);
``--engine-threads`` / ``--cli-threads`` set the torch threads (``KVINSPECT_TORCH_THREADS``,
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


def run_engine(script: Path, folder: Path, base_env: dict, args) -> dict:
    """The window's engine with no window: loaded and sent the script's turns over its protocol."""
    from kvinspect.engine.client import EngineChild

    env = _env(base_env, folder)
    if args.engine_threads:
        env["KVINSPECT_TORCH_THREADS"] = str(args.engine_threads)
    spec = json.loads(script.read_text())
    settings = {k: spec[k] for k in ("max_new_tokens", "do_sample", "seed")}
    turns: list[dict] = []

    def on_line(obj: dict) -> None:
        if obj.get("type") == "turn":
            turns.append(obj)

    child = EngineChild([sys.executable, "-m", "kvinspect", "engine"], name="bench", env=env)
    try:
        child.start()
        child.request("load", spec=args.model, device=args.device, dtype="auto")
        for text in spec["turns"]:
            child.request("turn", on_line=on_line, text=text, settings=settings)
    finally:
        child.close()
    return dict(zip(("tok_s", "ttft", "tokens"), _turn_figures(turns), strict=True))


def _ratios(rows: list[dict], arm: str, base: str) -> dict[str, list[float]]:
    """``arm``/``base`` pair by pair: decode, TTFT (each run's median turn), the first turn's and the later turns' TTFT."""
    med = statistics.median
    return {
        "decode": [med(r[arm]["tok_s"]) / med(r[base]["tok_s"]) for r in rows],
        "ttft": [med(r[arm]["ttft"]) / med(r[base]["ttft"]) for r in rows],
        "first": [r[arm]["ttft"][0] / r[base]["ttft"][0] for r in rows],
        "later": [med(r[arm]["ttft"][1:]) / med(r[base]["ttft"][1:]) for r in rows if len(r[base]["ttft"]) > 1],
    }


def _ratio_line(ratios: dict[str, list[float]], arm: str, base: str) -> str:
    med = statistics.median
    dec, ttft = ratios["decode"], ratios["ttft"]
    out = (f"  {arm}/{base} (median of pairs): decode {med(dec):.2f}× ({min(dec):.2f}–{max(dec):.2f}), "
           f"TTFT {med(ttft):.2f}× ({min(ttft):.2f}–{max(ttft):.2f}); TTFT of the first turn {med(ratios['first']):.2f}×")
    if ratios["later"]:
        out += f", of the later turns {med(ratios['later']):.2f}×"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="interleaved window/CLI pairs (default 3)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=96, help="max_new_tokens per turn (default 96)")
    ap.add_argument("--display", default=None, help="use this X display instead of starting Xvfb")
    ap.add_argument("--headless", action="store_true",
                    help="a third arm: the window's engine process, driven with no window")
    ap.add_argument("--engine-threads", type=int, default=None, help="torch threads of the window's engine "
                    "(default: every core, the engine's own choice)")
    ap.add_argument("--cli-threads", type=int, default=None, help="torch threads of kvinspect run (default: torch's)")
    args = ap.parse_args(argv)
    require_fetched(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="kvinspect-window-vs-cli-"))
    script = tmp / "script.json"
    script.write_text(json.dumps({"turns": TURNS, "max_new_tokens": args.tokens, "do_sample": False, "seed": 0}))
    arms = [("window", run_window), ("cli", run_cli)] + ([("engine", run_engine)] if args.headless else [])
    rows: list[dict] = []
    with xvfb(args.display) as env:
        print(f"window_vs_cli: {args.model} on {args.device}, {len(TURNS)} turns × {args.tokens} tokens, "
              f"{args.pairs} interleaved {'triples' if args.headless else 'pairs'}, window on {env['DISPLAY']} (xcb); "
              f"torch threads: engine {args.engine_threads or 'its default'}, cli {args.cli_threads or 'torch default'}, "
              f"{os.cpu_count()} cores")
        for i in range(args.pairs):
            k = i % len(arms)
            order = arms[k:] + arms[:k]
            res = {name: fn(script, tmp / f"{name}-{i}", env, args) for name, fn in order}
            rows.append(res)
            figs = "   ".join(f"{name} {statistics.median(r['tok_s']):5.1f} tok/s, TTFT "
                               f"{'/'.join(f'{x * 1000:.0f}' for x in r['ttft'])} ms" for name, r in res.items())
            print(f"  pair {i + 1} ({order[0][0]} first): {figs}   tokens {res['window']['tokens']}   "
                  f"load average {os.getloadavg()[0]:.1f}")
    for name, _ in arms:
        print(f"  medians, {name}: decode {statistics.median(statistics.median(r[name]['tok_s']) for r in rows):.1f} "
              f"tok/s, TTFT {statistics.median(statistics.median(r[name]['ttft']) for r in rows) * 1000:.0f} ms")
    main_ratios = _ratios(rows, "window", "cli")
    dec_ratio, ttft_ratio = statistics.median(main_ratios["decode"]), statistics.median(main_ratios["ttft"])
    print(_ratio_line(main_ratios, "window", "cli"))
    if args.headless:
        print(_ratio_line(_ratios(rows, "window", "engine"), "window", "engine") + "   (the window's own cost)")
        print(_ratio_line(_ratios(rows, "engine", "cli"), "engine", "cli") + "   (the engine process and its protocol)")
    print(f"  goals, window/cli: decode {dec_ratio:.2f}× (≥ 0.97: {'met' if dec_ratio >= 0.97 else 'NOT met'}), "
          f"TTFT {ttft_ratio:.2f}× (≤ 1.05: {'met' if ttft_ratio <= 1.05 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
