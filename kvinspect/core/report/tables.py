"""Plain-text tables for terminals: the per-turn table, events and checklists."""

from __future__ import annotations

import textwrap

from kvinspect.core.report.text_table import text_table
from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.units import fmt_bytes

STATUS_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


def _fmt_s(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _fmt_ms(v) -> str:
    # Milliseconds: a tiny model's first token comes in 3 ms, which "0.00 s" would hide.
    if v is None:
        return "-"
    ms = v * 1e3
    return f"{ms:.1f}" if ms < 10 else f"{ms:.0f}"


def turn_table(record: TraceRecord) -> str:
    cols = ["turn", "status", "prompt", "reused", "prefill", "new", "TTFT ms", "total s", "tok/s", "cache", "KV bytes"]
    rows = []
    for t in record.turns:
        rows.append([
            str(t.index + 1), t.status, str(t.prompt_tokens), str(t.reused_tokens), str(t.prefill_tokens),
            str(t.new_tokens), _fmt_ms(t.ttft_s), _fmt_s(t.total_s),
            "-" if t.tokens_per_s is None else f"{t.tokens_per_s:.1f}",
            f"#{t.cache_id}" if t.cache_id else "none", fmt_bytes(t.kv_bytes),
        ])
    return text_table(cols, rows, left=())


def events_text(record: TraceRecord, width: int = 100) -> str:
    if not record.events:
        return "events: none"
    out = ["events:"]
    for e in record.events:
        head = f"  [{e.severity}] turn {e.turn + 1} step {e.step} {e.kind}: "
        body = _fill(e.message, width=width, initial_indent=head, subsequent_indent=" " * 6)
        out.append(body)
        if e.advice and e.is_problem:
            out.append(_fill(e.advice, width=width, initial_indent="      → ", subsequent_indent=" " * 8))
    return "\n".join(out)


def _fill(text: str, width: int, initial_indent: str = "", subsequent_indent: str = "") -> str:
    """textwrap.fill without a stranded last word: "(prompt 53 + 32 new −" / "1)" reads badly."""
    lines = textwrap.wrap(text, width=width, initial_indent=initial_indent, subsequent_indent=subsequent_indent)
    if len(lines) >= 2:
        tail = lines[-1][len(subsequent_indent):]
        if len(tail) <= 12 and len(lines[-2]) + 1 + len(tail) <= width + 12:
            lines[-2:] = [f"{lines[-2]} {tail}"]
    return "\n".join(lines)


def checklist_text(record: TraceRecord, width: int = 100) -> str:
    out = []
    for t in record.turns:
        out.append(f"checklist, turn {t.index + 1}:")
        for item in t.checklist:
            head = f"  {STATUS_MARK.get(item['status'], item['status'].upper())}  {item['title']}: "
            out.append(_fill(item["evidence"], width=width, initial_indent=head,
                                     subsequent_indent=" " * 8))
    return "\n".join(out)


#: The old name of :func:`kvinspect.core.units.fmt_bytes`, for callers not yet moved to it.
human_bytes = fmt_bytes
