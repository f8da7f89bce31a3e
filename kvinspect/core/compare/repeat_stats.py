"""Per-configuration summaries of a comparison: medians and spreads over repeats, per turn and overall."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvinspect.core.compare.metrics import measured, stats
from kvinspect.core.compare.plan import ConfigResult, RunMetrics


def _median_int(values) -> int | None:
    v = [x for x in values if x is not None]
    return int(np.median(v)) if v else None


def _max(values, default=0):
    v = [x for x in values if x is not None]
    return max(v) if v else default


def failures(runs: list[RunMetrics]) -> list[dict]:
    """Failed turns grouped by their one-line reason."""
    groups: OrderedDict[str, dict] = OrderedDict()
    for r in runs:
        for t in r.turns:
            if t["status"] != "failed":
                continue
            g = groups.setdefault(t["error"], {"reason": t["error"], "kind": t["failure_kind"], "count": 0,
                                                "turns": [], "repeats": []})
            g["count"] += 1
            if t["index"] + 1 not in g["turns"]:
                g["turns"].append(t["index"] + 1)
            if r.repeat not in g["repeats"]:
                g["repeats"].append(r.repeat)
    return list(groups.values())


def summarize_runs(runs: list[RunMetrics]) -> dict | None:
    """Everything the summary table shows for one configuration (timings over measured turns only)."""
    if not runs:
        return None
    turns = [t for r in runs for t in r.turns]
    ok = [t for t in turns if measured(t)]
    complete = [r for r in runs if r.status == "ok"]
    n_turns = max((len(r.turns) for r in runs), default=0)
    growth = [_max([t["peak_memory_bytes"] for t in r.turns]) - r.baseline_memory_bytes for r in runs if r.turns]
    caps = [t["kv_capacity_rows"] for t in turns if t["kv_capacity_rows"] is not None]
    return {
        "repeats": len(runs),
        "ttft_s": stats(t["ttft_s"] for t in ok),
        "turn_s": stats(t["total_s"] for t in ok),
        "conversation_s": stats(sum(t["total_s"] for t in r.turns) for r in complete),
        "decode_tokens_per_s": stats(t["tokens_per_s"] for t in ok),
        "prefill_tokens_per_s": stats(t["prefill_tokens_per_s"] for t in ok),
        "prompt_tokens_per_turn": [_median_int(_at(runs, i, "prompt_tokens")) for i in range(n_turns)],
        "reused_tokens_per_turn": [_median_int(_at(runs, i, "reused_tokens")) for i in range(n_turns)],
        "prefill_tokens_per_turn": [_median_int(_at(runs, i, "prefill_tokens")) for i in range(n_turns)],
        "new_tokens_per_turn": [_median_int(_at(runs, i, "new_tokens")) for i in range(n_turns)],
        "peak_kv_bytes": _max(t["peak_kv_bytes"] for t in turns),
        "peak_kv_held_bytes": _max(t["kv_held_bytes"] for t in turns),
        "kv_capacity_rows": max(caps) if caps else None,
        "peak_memory_bytes": _max(t["peak_memory_bytes"] for t in turns),
        "peak_memory_growth_bytes": max(growth) if growth else 0,
        "cache_objects_per_run": _median_int(len({c for t in r.turns for c in t["cache_objects"]}) for r in runs),
        "turns_total": len(turns),
        "turns_ok": len(ok),
        "turns_failed": sum(t["status"] == "failed" for t in turns),
        "turns_stopped": sum(t["status"] == "stopped" for t in turns),
        "failures": failures(runs),
    }


def _at(runs: list[RunMetrics], i: int, key: str, only_ok: bool = True) -> list:
    out = []
    for r in runs:
        if i < len(r.turns) and (not only_ok or measured(r.turns[i])):
            out.append(r.turns[i][key])
    return out


def per_turn(runs: list[RunMetrics]) -> list[dict]:
    """One row per turn index: spreads over repeats (what the per-turn plots draw)."""
    n_turns = max((len(r.turns) for r in runs), default=0)
    rows = []
    for i in range(n_turns):
        at = [r.turns[i] for r in runs if i < len(r.turns)]
        ok = [t for t in at if measured(t)]
        rows.append({
            "index": i,
            "ttft_s": stats(t["ttft_s"] for t in ok),
            "total_s": stats(t["total_s"] for t in ok),
            "tokens_per_s": stats(t["tokens_per_s"] for t in ok),
            "prompt_tokens": _median_int(t["prompt_tokens"] for t in ok),
            "reused_tokens": _median_int(t["reused_tokens"] for t in ok),
            "prefill_tokens": _median_int(t["prefill_tokens"] for t in ok),
            "new_tokens": _median_int(t["new_tokens"] for t in ok),
            # Memory of measured turns only: a failed turn dropped its cache, a 0 there would read as "free".
            "kv_bytes": _max((t["kv_bytes"] for t in ok), None),
            "peak_kv_bytes": _max((t["peak_kv_bytes"] for t in ok), None),
            "kv_capacity_rows": _max((t["kv_capacity_rows"] for t in ok), None),
            "peak_memory_bytes": _max((t["peak_memory_bytes"] for t in ok), None),
            "ok": len(ok),
            "failed": sum(t["status"] == "failed" for t in at),
            "errors": sorted({t["error"] for t in at if t["status"] == "failed"}),
        })
    return rows


def warmup_summary(warmups: list[RunMetrics], steady: dict | None) -> dict | None:
    """Warm-up apart from steady state: what the first pass cost and what compilation added."""
    if not warmups:
        return None
    conv = [sum(t["total_s"] for t in r.turns) for r in warmups]
    first = warmups[0].turns[0] if warmups[0].turns else None
    steady_med = (steady or {}).get("conversation_s") or {}
    out = {
        "runs": len(warmups),
        "conversation_s": conv,
        "first_turn_ttft_s": first["ttft_s"] if first else None,
        "first_turn_total_s": first["total_s"] if first else None,
        "compiled_graphs": sum(r.compiled_graphs or 0 for r in warmups) if any(
            r.compiled_graphs is not None for r in warmups) else None,
        "extra_s_vs_steady": ((conv[0] - steady_med["median"]) if conv and steady_med.get("median") is not None
                              else None),
    }
    return out


def steady_compiled_graphs(runs: list[RunMetrics]) -> int | None:
    vals = [r.compiled_graphs for r in runs if r.compiled_graphs is not None]
    return sum(vals) if vals else None


def length_points(cr: ConfigResult) -> list[dict]:
    """One point per requested prompt length: spreads over repeats of the single-turn run."""
    by_len: OrderedDict[int, list[RunMetrics]] = OrderedDict()
    for r in sorted(cr.lengths, key=lambda r: r.length or 0):
        by_len.setdefault(int(r.length or 0), []).append(r)
    points = []
    for n, runs in by_len.items():
        turns = [r.turns[0] for r in runs if r.turns]
        ok = [t for t in turns if measured(t)]
        points.append({
            "length": n,
            "prompt_tokens": _median_int(t["prompt_tokens"] for t in turns),
            "repeats": len(runs),
            "ttft_s": stats(t["ttft_s"] for t in ok),
            "total_s": stats(t["total_s"] for t in ok),
            "decode_tokens_per_s": stats(t["tokens_per_s"] for t in ok),
            "prefill_tokens_per_s": stats(t["prefill_tokens_per_s"] for t in ok),
            "peak_kv_bytes": _max((t["peak_kv_bytes"] for t in ok), None),
            "kv_capacity_rows": _max((t["kv_capacity_rows"] for t in ok), None),
            "peak_memory_bytes": _max((t["peak_memory_bytes"] for t in ok), None),
            "max_cache_len": runs[0].max_cache_len,
            "failures": failures(runs),
        })
    return points
