"""A long ``run``: time per turn and RSS over N turns on tiny-llama, then ``report`` with plots on its trace.

    .venv/bin/python benchmarks/long_session.py [--turns 1000] [--out DIR] [--report-only] [--synthetic]

Prints the median time per turn of the first and last 50 turns (and their ratio), RSS after the
first and the last turn, the prompt length reached, and the wall time and peak RSS of
``kvinspect report TRACE --out DIR`` (plots included) in a child process. Figures, not asserts.
``--synthetic``: skip the long run; build the 1,000-turn trace from a real 3-turn run of
tiny-llama (its turns repeated, 17 forward passes each, the context growing as it would), which
measures ``report`` in a minute instead of the run's half hour.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def run(turns: int, out: Path) -> None:
    from kvinspect.core.model.loading import load_model
    from kvinspect.core.session.runner import run_script
    from kvinspect.core.session.script import ChatScript, GenerationSettings

    loaded = load_model("tiny-llama", device="cpu")
    script = ChatScript(turns=[f"message number {i}: tell me more" for i in range(turns)],
                        settings=GenerationSettings(max_new_tokens=16))
    proc = psutil.Process()
    times: list[float] = []
    rss: list[int] = []
    last = [time.perf_counter()]

    def on_turn(turn):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
        rss.append(proc.memory_info().rss)

    res = run_script(loaded, script, out, on_turn=on_turn)
    head, tail = statistics.median(times[:50]), statistics.median(times[-50:])
    print(f"run: {turns} turns, prompt reached {res.record.turns[-1].prompt_tokens:,} tokens, "
          f"{res.record.n_steps:,} steps")
    print(f"time per turn: first 50 median {head * 1e3:.0f} ms, last 50 median {tail * 1e3:.0f} ms "
          f"(x{tail / head:.1f})")
    print(f"RSS: after turn 1 {rss[0] / 2**20:.0f} MB, after turn {turns} {rss[-1] / 2**20:.0f} MB")
    print(f"trace: {res.trace} ({res.trace.stat().st_size / 2**20:.1f} MB)")


def synthetic(turns: int, out: Path) -> None:
    import copy

    import numpy as np

    from kvinspect.core.model.loading import load_model
    from kvinspect.core.session.runner import run_script
    from kvinspect.core.session.script import ChatScript, GenerationSettings
    from kvinspect.core.trace.record import TraceRecord
    from kvinspect.core.trace.tracefile import write_trace

    src = run_script(load_model("tiny-llama", device="cpu"),
                     ChatScript(turns=["one", "two", "three"], settings=GenerationSettings(max_new_tokens=16)),
                     out / "seed").record
    rec = TraceRecord(src.n_layers, dict(src.header))
    rec.set_devices(src.devices)
    L, seen = src.n_layers, 0
    for i in range(turns):
        t = copy.deepcopy(src.turns[i % len(src.turns)])
        t.index, t.first_step = i, rec.n_steps
        prefill = 40 + i % 7
        for k in range(17):
            seen += prefill if k == 0 else 1
            rec.append_step(turn=i, t=0.02 * rec.n_steps, cache_id=1, q_len=prefill if k == 0 else 1, use_cache=True,
                            seen=np.full(L, seen), stored=np.full(L, seen), dev=np.zeros(L, np.int8),
                            nbytes=np.full(L, seen * 1024), rss=350_000_000 + i * 200_000)
        t.end_step, t.prompt_tokens = rec.n_steps, seen - 16
        rec.add_turn(t)
    write_trace(out / "trace.jsonl", rec)
    print(f"synthetic: {turns} turns, {rec.n_steps:,} steps, {seen:,} tokens")


def report(trace: Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "kvinspect", "report", str(trace), "--out", str(Path(d) / "rep")],
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"report with plots: {wall:.1f} s, exit {p.returncode}, peak RSS of its children {peak:.0f} MB")
        if p.returncode:
            print(p.stderr[-500:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--synthetic", action="store_true")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="kvlong-"))
    if a.synthetic:
        synthetic(a.turns, out)
    elif not a.report_only:
        run(a.turns, out)
    report(out / "trace.jsonl")
    print(json.dumps({"out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
