"""Per-turn figures of a compare run, and the robust statistics over repeats.

Timing figures are summarised by median and spread (quartiles and min–max), never by mean:
one slow outlier from the machine must not move a comparison. Structural figures (token
counts, cache rows, bytes) come straight from the turn records and the per-step series.
"""

from __future__ import annotations

import gc

import numpy as np

from kvinspect.core.compare.correctness import reply_tokens
from kvinspect.core.trace.record import TraceRecord, TurnRecord

#: Failure kinds, as compare.json reports them.
STATIC_OVERFLOW = "static-cache-overflow"
OUT_OF_MEMORY = "out-of-memory"
CONTEXT_LIMIT = "context-limit"
ERROR = "error"


def stats(values) -> dict | None:
    """``{n, median, q1, q3, min, max}`` of the finite values, or None when there are none."""
    v = np.asarray([float(x) for x in values if x is not None], dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return None
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"n": int(len(v)), "median": float(med), "q1": float(q1), "q3": float(q3),
            "min": float(v.min()), "max": float(v.max())}


def memory_kind(device: str) -> str:
    """What "peak memory" measures on this device: ``cuda`` / ``mps`` allocator bytes, else process ``rss``."""
    if device.startswith("cuda") or device == "multi-gpu":
        return "cuda"
    if device == "mps":
        return "mps"
    return "rss"


MEMORY_LABEL = {
    "cuda": "peak CUDA allocated",
    "mps": "peak MPS allocated (sampled per step)",
    "rss": "peak RSS (process, upper bound)",
}


def failure_kind(error: str) -> str:
    e = (error or "").lower()
    if e.startswith("static cache overflow"):
        return STATIC_OVERFLOW
    if "out of memory" in e or "outofmemoryerror" in e or e.startswith("memoryerror"):
        return OUT_OF_MEMORY
    if e.startswith("context limit"):
        return CONTEXT_LIMIT
    return ERROR


def turn_metrics(turn: TurnRecord, record: TraceRecord, mem_kind: str) -> dict:
    """The figures compare.json keeps for one turn (field names documented in docs/compare.md)."""
    a = int(turn.first_step)
    b = int(turn.end_step) if turn.status != "running" else record.n_steps
    with record.lock:
        nb = record.nbytes[a:b].sum(axis=1) if b > a else np.zeros(0, np.int64)
        ids = record.cache_id[a:b].copy()
        alloc = record.accel_allocated[a:b].copy()
    peak_kv = max(int(turn.kv_bytes or 0), int(nb.max()) if len(nb) else 0)
    caps = [v for lay in turn.layers if (v := lay.get("capacity")) is not None]
    stored = [v for lay in turn.layers if (v := lay.get("stored")) is not None]
    if mem_kind == "cuda":
        peak_mem = int(turn.peak_accel_bytes or 0)
    elif mem_kind == "mps":
        peak_mem = int(alloc.max()) if len(alloc) else 0
    else:
        peak_mem = int(turn.peak_rss or 0)
    ttft = turn.ttft_s
    reply_ids, reply_pieces = reply_tokens(turn, record)
    return {
        "index": turn.index,
        "status": turn.status,
        "error": turn.error,
        "failure_kind": failure_kind(turn.error) if turn.status == "failed" else None,
        "prompt_tokens": turn.prompt_tokens,
        "reused_tokens": turn.reused_tokens,
        "prefill_tokens": turn.prefill_tokens,
        "new_tokens": turn.new_tokens,
        "ttft_s": ttft,
        "total_s": turn.total_s,
        "tokens_per_s": turn.tokens_per_s,
        "prefill_tokens_per_s": (turn.prefill_tokens / ttft) if ttft and turn.prefill_tokens else None,
        "kv_bytes": int(turn.kv_bytes or 0),
        "kv_held_bytes": int(turn.kv_held_bytes or 0),
        "peak_kv_bytes": peak_kv,
        "kv_stored_rows": max(stored) if stored else 0,
        "kv_capacity_rows": max(caps) if caps else None,
        "peak_memory_bytes": peak_mem,
        "cache_id": turn.cache_id,
        "cache_class": turn.cache_class,
        "cache_objects": sorted({int(i) for i in ids if i}),
        "steps": b - a,
        "reply_ids": reply_ids,  # greedy replies are compared with the baseline's (correctness.py)
        "reply_pieces": reply_pieces,
    }


def measured(turn: dict) -> bool:
    """Turns whose timings count: finished normally (not failed, not stopped by Cancel)."""
    return turn.get("status") == "ok"


def memory_now(loaded) -> int:
    """The baseline before a run: allocator bytes on an accelerator, RSS elsewhere (after a collect)."""
    gc.collect()
    kind = memory_kind(loaded.device)
    if kind == "cuda":
        import torch

        torch.cuda.empty_cache()
        return sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count()))
    if kind == "mps":
        import torch

        torch.mps.empty_cache()
        return int(torch.mps.current_allocated_memory())
    import psutil

    return int(psutil.Process().memory_info().rss)
