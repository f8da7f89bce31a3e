"""Cold vs warm load of the fetched GGUF built-ins (the conversion cache, docs/probe.md).

Each load runs in a fresh process (imports included, as a user waits for them). Cold = the
conversion entry removed first (de-quantise + store); warm = read the stored conversion.
Prints the median of interleaved warm runs; a figure, not an assertion.

    .venv/bin/python benchmarks/model_load.py [smollm2 gemma3-270m] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from kvinspect.core.model.loading import load_model
lm = load_model(sys.argv[1], device="cpu")
print(json.dumps({"load_s": lm.load_seconds, "process_s": time.perf_counter() - t0, "source": lm.load_source}))
"""


def one(name: str) -> dict:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    d["wall_s"] = time.perf_counter() - t
    for line in out.stderr.splitlines():  # why a conversion was not used ("stale", "truncated", …)
        if "conversion cache" in line:
            print(f"  {name}: {line.strip()}")
    return d


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=["smollm2", "gemma3-270m"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true", help="keep existing conversions (warm runs only)")
    args = ap.parse_args()
    from kvinspect.core.model import conversion_cache as cc
    from kvinspect.core.model.fetch import is_fetched

    names = [n for n in args.names if is_fetched(n)]
    for n in set(args.names) - set(names):
        print(f"{n}: not fetched, skipped")
    cold = {}
    if not args.no_cold:
        shutil.rmtree(cc.root(), ignore_errors=True)
        for n in names:
            cold[n] = one(n)
    warm: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.runs):  # interleaved
        for n in names:
            warm[n].append(one(n))
    for n in names:
        ws = [w["load_s"] for w in warm[n]]
        c = cold.get(n)
        cold_txt = f"cold {c['load_s']:.1f} s ({c['source']}), " if c else ""
        print(f"{n}: {cold_txt}warm median {statistics.median(ws):.2f} s load_model "
              f"({statistics.median(w['process_s'] for w in warm[n]):.2f} s with imports) over {len(ws)} runs "
              f"[{', '.join(w['source'] for w in warm[n])}]"
              + (f"; cold/warm {c['load_s'] / statistics.median(ws):.1f}x" if c else ""))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
