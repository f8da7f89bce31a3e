"""``summary.json``: the stable, script-facing digest of a trace. Add fields, never rename."""

from __future__ import annotations

import os
from pathlib import Path

from kvinspect.core.text_safety import json_dumps_utf8
from kvinspect.core.trace.record import TraceRecord

SUMMARY_FORMAT = "kvinspect-summary"
SUMMARY_VERSION = 1
LAYER_FIELDS = ("index", "kind", "seen", "stored", "capacity", "window", "device", "dtype", "bytes", "held_bytes")
EXTRA_LAYER_FIELDS = ("attention", "config_attention", "storage", "cls", "home_device")


def build_summary(record: TraceRecord, redact: bool = False) -> dict:
    """The summary dict; ``redact`` replaces the conversation by token counts everywhere in it."""
    if redact and not record.header.get("redacted"):
        from kvinspect.core.trace.redact import redact_record

        record = redact_record(record)
    h = record.header
    model = h.get("model") or {}
    turns = []
    cache_class = None
    for t in record.turns:
        if t.cache_class and t.cache_class not in ("None", "") and cache_class is None:
            cache_class = t.cache_class
        evs = [
            {"kind": e.kind, "layer": e.layer, "step": e.step, "message": e.message,
             "severity": e.severity, "advice": e.advice, "layers": e.layers, "data": e.data}
            for e in record.events_for_turn(t.index)
        ]
        layers = [
            {**{k: lay.get(k) for k in LAYER_FIELDS}, **{k: lay.get(k) for k in EXTRA_LAYER_FIELDS if k in lay}}
            for lay in t.layers
        ]
        turns.append({
            "index": t.index,
            "prompt_tokens": t.prompt_tokens,
            "reused_tokens": t.reused_tokens,
            "prefill_tokens": t.prefill_tokens,
            "new_tokens": t.new_tokens,
            "ttft_s": _r(t.ttft_s),
            "total_s": _r(t.total_s),
            "tokens_per_s": _r(t.tokens_per_s, 2),
            "reply": t.reply,
            "cache_id": t.cache_id,
            "layers": layers,
            "events": evs,
            # additions beyond the original contract
            "user": t.user,
            "status": t.status,
            "error": t.error,
            "policy": t.policy,
            "cache_impl": t.cache_impl,
            "cache_class": t.cache_class,
            "first_step": t.first_step,
            "end_step": t.end_step,
            "kv_bytes": t.kv_bytes,
            "kv_held_bytes": t.kv_held_bytes,
            "kv_bytes_by_device": t.kv_bytes_by_device,
            "peak_accel_bytes": t.peak_accel_bytes,
            "peak_rss": t.peak_rss,
            "divergence_at": t.divergence_at,
            "cropped_from": t.cropped_from,
            "checklist": t.checklist,
        })
    sess = h.get("session") or {}
    return {
        "format": SUMMARY_FORMAT,
        "version": SUMMARY_VERSION,
        "model": model.get("spec"),
        "versions": h.get("versions") or {},
        "device": h.get("device") or model.get("device"),
        "cache_class": cache_class,
        "turns": turns,
        # additions
        "model_info": {k: model.get(k) for k in ("name", "source", "class", "dtype", "config", "generation_config",
                                                  "load_s", "load_source")},
        "policy": sess.get("policy"),
        "cache_impl": sess.get("cache_impl"),
        "steps": record.n_steps,
        "command": h.get("command"),
        "problems": sorted({e.kind for e in record.events if e.is_problem}),
        "trace_notes": list(record.notes),
        "redacted": bool(h.get("redacted")),
    }


def _r(v, nd: int = 4):
    return None if v is None else round(float(v), nd)


def write_summary(path: str | os.PathLike, record: TraceRecord, redact: bool = False) -> Path:
    p = Path(path)
    p.write_text(json_dumps_utf8(build_summary(record, redact), indent=2) + "\n", encoding="utf-8")
    return p
