"""Markdown for GitHub issues: table/fence primitives and the copy-to-clipboard snippets.

Pure functions over a :class:`~.record.TraceRecord`: the per-turn table, one event's
explanation, the per-layer table at a step (the replay slider's) and at the end of a turn.
The GUI copies them to the clipboard; the report bundle (:mod:`.report`) is built from them.
"""

from __future__ import annotations

import json
import math

from kvinspect.core.cache.layer_kinds import MEANING, base_kind
from kvinspect.core.detect.events import Event, _ranges
from kvinspect.core.report.text_table import md_cell, md_table  # noqa: F401 - md_cell re-exported
from kvinspect.core.text_safety import Markdown, md_block, md_code, md_text
from kvinspect.core.trace.record import TraceRecord, TurnRecord
from kvinspect.core.units import fmt_bytes

LAYER_KEYS = ("kind", "cls", "seen", "stored", "capacity", "window", "device", "dtype", "bytes", "held_bytes")


# -- Markdown primitives ------------------------------------------------------------------------

def md_fence(text: str, lang: str = "text") -> Markdown:
    """A fenced block that survives backticks in ``text`` (model output can hold any); controls escaped."""
    text = md_block(text)
    run, longest = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return Markdown(f"{fence}{lang}\n{text}\n{fence}")


def code_span(v) -> Markdown:
    """An inline code span of ``v`` (inert whatever it holds); a dash for nothing."""
    return md_code(v) if v not in (None, "") else Markdown("–")


def _num(v, nd: int = 2) -> str:
    return "–" if not _known(v) else f"{v:.{nd}f}"


def _known(v) -> bool:
    """A number worth printing: a damaged or partial turn can hold None, and averages NaN."""
    return isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))


def _size(v) -> str:
    """Bytes for a table cell; unknown is a dash, never ``None``/``nan``."""
    return fmt_bytes(v) if _known(v) else "–"


def count_noun(n: int, noun: str) -> str:
    """``1 turn``, ``2 turns``: a report is prose, not ``turn(s)``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def turn_phrase(numbers, capital: bool = False) -> str:
    """``turn 2``, ``turns 2 and 3``, ``turns 1–4``, ``turns 1, 3 and 5`` (1-based turn numbers)."""
    ns = sorted(set(numbers))
    if len(ns) == 1:
        out = f"turn {ns[0]}"
    elif len(ns) == 2:
        out = f"turns {ns[0]} and {ns[1]}"
    else:
        head, sep, tail = _ranges(ns).rpartition(", ")
        out = f"turns {head} and {tail}" if sep else f"turns {tail}"
    return out[0].upper() + out[1:] if capital else out


def cache_label(turn: TurnRecord) -> str:
    """The Cache cell of a turn. The trace writes the class ``"None"`` for a turn that ended with no
    cache object (a failed first forward): shown as ``none``, as the terminal table does."""
    cls = md_text(turn.cache_class) if turn.cache_class not in ("", "None", None) else ""
    if turn.cache_id:
        return Markdown(f"#{int(turn.cache_id)} {cls}".strip())
    return Markdown(cls or "none")


def run_lengths(values: list) -> str:
    """``['s', 's', 'f']`` → ``s ×2, f`` (a 48-layer ``layer_types`` list stays one line)."""
    out, prev, n = [], object(), 0
    for v in [*values, object()]:
        if v == prev:
            n += 1
            continue
        if n:
            out.append(f"{prev} ×{n}" if n > 1 else str(prev))
        prev, n = v, 1
    return ", ".join(out)


def collapse_layers(rows: list[dict], keys: tuple[str, ...]) -> list[tuple[list[int], dict]]:
    """Group consecutive layers whose ``keys`` are equal: a 30-layer model fits in one row."""
    groups: list[tuple[list[int], dict]] = []
    for i, r in enumerate(rows):
        sig = {k: r.get(k) for k in keys}
        idx = r.get("index", i)
        if groups and groups[-1][1] == sig and groups[-1][0][-1] == idx - 1:
            groups[-1][0].append(idx)
        else:
            groups.append(([idx], sig))
    return groups


# -- copy-to-clipboard snippets ---------------------------------------------------------------------

def turns_markdown(record: TraceRecord) -> str:
    """The per-turn metrics table, as Markdown."""
    accel = any(t.peak_accel_bytes for t in record.turns)
    header = ["Turn", "Status", "Policy", "Cache", "Prompt", "Reused", "Prefill", "New", "TTFT (s)", "Total (s)",
              "Decode (tok/s)", "KV logical", "KV held", "Peak RSS"] + (["Peak accel"] if accel else []) + ["Prefix"]
    rows = []
    for t in record.turns:
        if t.divergence_at is not None:
            prefix = f"diverged at {t.divergence_at}" + (f", cropped {t.cropped_from}→{t.reused_tokens}"
                                                          if t.cropped_from is not None else "")
        else:
            prefix = "matches" if t.reused_tokens else "–"
        row = [t.index + 1, t.status, t.policy, cache_label(t), t.prompt_tokens, t.reused_tokens, t.prefill_tokens,
               t.new_tokens, _num(t.ttft_s), _num(t.total_s), _num(t.tokens_per_s, 1), _size(t.kv_bytes),
               _size(t.kv_held_bytes), _size(t.peak_rss)]
        row += [_size(t.peak_accel_bytes)] if accel else []
        rows.append(row + [prefix])
    if not rows:
        return "*No turns recorded.*"
    return md_table(header, rows, right={0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} | ({14} if accel else set()))


def event_markdown(event: Event, record: TraceRecord | None = None) -> str:
    """One event's explanation, with its numbers and (given ``record``) the versions that produced it."""
    out = event.markdown()
    if event.data:
        out += "\n\n*Numbers:* " + " ".join(md_code(f"{k}={json.dumps(v, ensure_ascii=False)}")
                                             for k, v in event.data.items())
    if record is not None:
        out += "\n\n<sub>" + context_line(record) + "</sub>"
    return out


def layer_table_markdown(record: TraceRecord, step: int) -> str:
    """The per-layer state at ``step`` (what the replay slider shows), as Markdown."""
    rows = record.layer_table_at(step)
    if not rows:
        return f"*No step {step} in this trace ({record.n_steps} steps).*"
    turn = record.turn_of_step(step)
    cid = int(record.cache_id[step])
    head = (f"**Layers at step {step}** (turn {turn + 1}, "
            + (f"cache #{cid}" if cid else "no cache") + f", query length {int(record.q_len[step])})")
    for r in rows:
        r["attention"] = r.get("config_attention") or "full"
        r["bytes"] = _size(r.get("bytes"))
    body = []
    for idx, sig in collapse_layers(rows, ("attention", "window", "seen", "stored", "device", "bytes")):
        body.append([_ranges(idx), sig["attention"], sig["window"], sig["seen"], sig["stored"], sig["device"],
                     sig["bytes"]])
    return head + "\n\n" + md_table(["Layers", "Attention", "Window", "Seen", "Stored", "Device", "Bytes"], body,
                                    right={2, 3, 4, 6})


def turn_layers_markdown(turn: TurnRecord) -> str:
    """The end-of-turn cache snapshot of ``turn``, identical consecutive layers collapsed."""
    if not turn.layers:
        return "*No cache snapshot (no cache object at the end of this turn).*"
    rows = [dict(lay) for lay in turn.layers]
    differ = any(r.get("attention") != r.get("config_attention") for r in rows if r.get("config_attention"))
    # The batch dimension (beams, batched prompts) is shown when a row count is known: seen/stored are per row.
    batched = any((r.get("batch") or 1) > 1 for r in rows)
    keys = LAYER_KEYS + (("config_attention",) if differ else ()) + (("batch",) if batched else ())
    body = []
    for idx, sig in collapse_layers(rows, keys):
        row = [_ranges(idx), sig["kind"]] + ([sig["config_attention"]] if differ else [])
        row += [sig["cls"]] + ([sig["batch"] if sig["batch"] is not None else "-"] if batched else [])
        row += [sig["seen"], sig["stored"], sig["capacity"], sig["window"], sig["device"], sig["dtype"],
                _size(sig["bytes"]), _size(sig["held_bytes"])]
        body.append(row)
    header = ["Layers", "Kind"] + (["Config asks"] if differ else []) + ["Class"] + (["Rows"] if batched else []) + [
        "Seen", "Stored", "Capacity", "Window", "Device", "Dtype", "Logical", "Held"]
    off = (1 if differ else 0) + (1 if batched else 0)
    table = md_table(header, body, right={3 + off, 4 + off, 5 + off, 6 + off, 9 + off, 10 + off} | ({3} if batched and not differ else set()) | ({4} if batched and differ else set()))
    legend = kinds_legend(rows)
    return table + ("\n\n" + legend if legend else "")


def kinds_legend(rows: list[dict]) -> str:
    """One line per non-plain kind present, e.g. which layer each shared layer reads from."""
    out = []
    for kind, text in MEANING.items():
        idx = [r["index"] for r in rows if base_kind(r.get("kind")) == kind]
        if not idx:
            continue
        line = f"*{kind}* ({_ranges(idx)}): {text}"  # the kind is one of KIND_LEGEND's, not the trace's
        if kind == "shared":
            pairs = [f"{r['index']}→{r['reads_from']}" for r in rows
                     if r.get("kind") == "shared" and r.get("reads_from") is not None]
            if pairs:
                line += "; reads: " + ", ".join(pairs)
        out.append("- " + line)
    return "\n".join(out)


def context_line(record: TraceRecord) -> str:
    h = record.header
    v = h.get("versions") or {}
    m = h.get("model") or {}
    parts = [f"kvinspect {md_text(v.get('kvinspect', '?'))}", f"transformers {md_text(v.get('transformers', '?'))}",
             f"torch {md_text(v.get('torch', '?'))}",
             f"{md_text(m.get('name') or m.get('spec') or 'model')} on {md_text(h.get('device') or '?')}"]
    return Markdown(" · ".join(parts))
