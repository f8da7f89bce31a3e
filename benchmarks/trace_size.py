"""Trace size on disk and load time at scale: 100k steps × 64 layers (goal: <= 20 MB, load < 2 s).

The record is synthesised with the shapes a long real session has: a Gemma-3-like layout
(five sliding layers with a 1024-token window for every full one), twenty turns of reuse on one
cache (each a prefill of the new suffix, then one token per forward), full layers growing to
100k+ tokens while sliding ones stay capped, per-layer bytes, RSS and accelerator counters that
move with noise. It is appended step by step to a :class:`TraceRecord` and written by
:class:`TraceWriter` exactly as a session writes: a ``steps`` chunk whenever half a second of
(simulated) time has passed, a ``turn`` line at each turn's end. Then :func:`read_trace` loads
it several times and the median is reported. Run::

    .venv/bin/python benchmarks/trace_size.py
    .venv/bin/python benchmarks/trace_size.py --steps-per-second 100   # a fast GPU: bigger chunks

Nothing is asserted; the figures are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvinspect.core.detect.events import Event  # noqa: E402
from kvinspect.core.trace.messages import EventMsg  # noqa: E402
from kvinspect.core.trace.record import TraceRecord, TurnRecord  # noqa: E402
from kvinspect.core.trace.stream import Stream  # noqa: E402
from kvinspect.core.trace.tracefile import TraceWriter, read_trace  # noqa: E402


def synthesise(path: Path, steps: int, layers: int, turns: int, window: int, steps_per_second: float,
               flush_s: float, seed: int = 0) -> tuple[TraceRecord, dict]:
    """Append ``steps`` forwards to a record and write them as a session would; returns the record and timings."""
    rng = np.random.default_rng(seed)
    kinds = ["full" if i % 6 == 5 else "sliding" for i in range(layers)]
    sliding = np.array([k == "sliding" for k in kinds])
    row_bytes = 2 * 8 * 128 * 2  # K and V, 8 KV heads, head_dim 128, bf16
    header = {"model": {"spec": "synthetic", "name": "synthetic"}, "device": "cuda:0",
              "layers": [{"index": i, "config_attention": k, "window": window if k == "sliding" else None}
                         for i, k in enumerate(kinds)], "session": {"policy": "reuse"}}
    rec = TraceRecord(layers, header)
    writer = Stream(rec, [TraceWriter(path)])
    writer.devices(["cuda:0"])
    per_turn = steps // turns
    seen = 0
    t = 1000.0
    last_flush = t
    dev = np.zeros(layers, np.int8)
    rss_base, alloc_base = 3 << 30, 2 << 30
    append_s = write_s = 0.0
    step = 0
    for k in range(turns):
        turn = TurnRecord(index=k, user=f"message {k}", status="running", first_step=step)
        rec.add_turn(turn)
        writer.turn_started(turn)
        prompt = int(rng.integers(40, 400))
        for j in range(per_turn if k < turns - 1 else steps - step):
            q = prompt if j == 0 else 1
            seen += q
            s = np.full(layers, seen, np.int32)
            st = np.where(sliding, min(seen, window - 1), seen).astype(np.int32)
            nbytes = st.astype(np.int64) * row_bytes
            kv = int(nbytes.sum())
            t += (0.25 if j == 0 else 1.0 / steps_per_second) * float(rng.uniform(0.9, 1.1))
            a = time.perf_counter()
            rec.append_step(turn=k, t=t, cache_id=1, q_len=q, use_cache=True, seen=s, stored=st, dev=dev,
                            nbytes=nbytes, rss=rss_base + (seen << 6) + int(rng.integers(0, 1 << 16)),
                            accel_allocated=alloc_base + kv + int(rng.integers(0, 1 << 20)),
                            accel_reserved=alloc_base + ((kv >> 26) + 1 << 26))
            b = time.perf_counter()
            append_s += b - a
            if t - last_flush >= flush_s:
                writer.flush_steps()
                last_flush = t
                write_s += time.perf_counter() - b
            step += 1
        a = time.perf_counter()
        turn.status, turn.end_step, turn.new_tokens = "ok", step, step - turn.first_step
        turn.prompt_tokens, turn.prefill_tokens = seen - turn.new_tokens + 1, prompt
        turn.layers = [{"index": i, "kind": kinds[i], "seen": int(s[i]), "stored": int(st[i])} for i in range(layers)]
        if k == 0:
            ev = Event("window_reached", "info", 0, window, "sliding layers stopped growing", "Expected.",
                       layer=0, layers=[i for i in range(layers) if sliding[i]], data={"window": window})
            writer.emit(EventMsg(ev))
        writer.turn_finished(turn)
        write_s += time.perf_counter() - a
    a = time.perf_counter()
    writer.close()
    write_s += time.perf_counter() - a
    return rec, {"append_s": append_s, "write_s": write_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--steps-per-second", type=float, default=25.0,
                   help="decode speed simulated (sets how many steps go in each 0.5 s chunk)")
    p.add_argument("--flush-seconds", type=float, default=0.5, help="the session's flush interval")
    p.add_argument("--loads", type=int, default=5, help="read_trace repetitions (median reported)")
    p.add_argument("--keep", metavar="FILE", help="write the trace here instead of a temporary file")
    args = p.parse_args(argv)

    tmp = None
    if args.keep:
        path = Path(args.keep)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kvinspect-bench-")
        path = Path(tmp.name) / "trace.jsonl"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"synthesising {args.steps:,} steps × {args.layers} layers, {args.turns} turns, window {args.window}, "
          f"{args.steps_per_second:g} steps/s, flush every {args.flush_seconds:g} s (load average {load})")
    rec, times = synthesise(path, args.steps, args.layers, args.turns, args.window, args.steps_per_second,
                            args.flush_seconds)
    size = path.stat().st_size
    with path.open("rb") as f:
        lines = f.read().count(b"\n")
    chunks = lines - 2 * args.turns - 3
    raw = sum(rec.col(c).nbytes for c in rec._cols)
    print(f"file: {size / 1e6:.2f} MB ({size / 2**20:.2f} MiB) in {lines:,} lines (~{chunks:,} step chunks of "
          f"~{args.steps / max(chunks, 1):.0f} steps); raw arrays {raw / 1e6:.1f} MB, ratio {raw / size:.0f}×")
    print(f"goal <= 20 MB: {'met' if size <= 20e6 else 'MISSED'}")
    print(f"append {1e6 * times['append_s'] / args.steps:.1f} µs/step, write {times['write_s']:.2f} s in total")
    loads, cpu = [], []
    for _ in range(max(args.loads, 1)):
        t, c = time.perf_counter(), time.process_time()
        back = read_trace(path)
        loads.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    same = all(np.array_equal(back.col(c), rec.col(c)) for c in rec._cols)
    print(f"read_trace: median {statistics.median(loads):.3f} s over {len(loads)} loads "
          f"(min {min(loads):.3f}, max {max(loads):.3f}); goal < 2 s: "
          f"{'met' if statistics.median(loads) < 2 else 'MISSED'}; CPU time median {statistics.median(cpu):.3f} s "
          f"(what a quiet machine's wall time would be); read back equal: {same}; "
          f"{back.n_steps:,} steps, {len(back.turns)} turns, {len(back.notes)} reader notes {back.notes[:3]}")
    if load is not None:
        print(f"load average at end {os.getloadavg()}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
