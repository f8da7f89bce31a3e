"""Is each configuration's reply still the baseline's? Speed means nothing for a wrong answer.

A quantized or otherwise lossy cache can be fast and small and give different output
(huggingface/transformers #34848, #40099, #35185: 0/120 correct answers). For each configuration
and turn, the greedy reply's token ids are compared with the baseline's (the first
configuration, or ``--baseline NAME``): equal, or the first differing token position and both
continuations from there. Where no comparison is possible (sampling, a turn that failed, a
configuration that could not run here, ids not recorded) the entry says why, never raises.
"""

from __future__ import annotations

from collections.abc import Sequence

CONTINUATION = 16  # tokens of each continuation shown from the first difference


def reply_tokens(turn, record) -> tuple[list[int] | None, list[str]]:
    """The generated ids of ``turn`` and each one's text, from the trace's ``ids`` fields."""
    ids = getattr(turn, "ids", None)
    if not isinstance(ids, dict) or not isinstance(ids.get("generated"), list):
        return None, []
    generated = [int(i) for i in ids["generated"]]
    pieces: dict[str, str] = {}
    for t in record.turns[:turn.index + 1]:
        d = getattr(t, "ids", None)
        if isinstance(d, dict):
            pieces.update(d.get("pieces") or {})
    return generated, [pieces.get(str(i), f"<{i}>") for i in generated]


def _text(pieces: Sequence[str], start: int) -> str:
    return "".join(pieces[start:start + CONTINUATION])


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def compare_turns(base_turns: list[dict], turns: list[dict]) -> list[dict]:
    """Per turn: ``{turn, same, first_diff, baseline_continuation, continuation, skip}``."""
    out = []
    for k, t in enumerate(turns):
        entry: dict = {"turn": k, "same": None, "first_diff": None, "baseline_continuation": None,
                       "continuation": None, "skip": None}
        b = base_turns[k] if k < len(base_turns) else None
        if b is None:
            entry["skip"] = "the baseline has no such turn"
        elif t.get("status") != "ok" or b.get("status") != "ok":
            entry["skip"] = "the turn did not finish here" if t.get("status") != "ok" else \
                "the baseline's turn did not finish"
        elif t.get("reply_ids") is None or b.get("reply_ids") is None:
            entry["skip"] = "reply ids not recorded in this trace"
        else:
            pos = first_difference(b["reply_ids"], t["reply_ids"])
            entry["same"] = pos is None
            if pos is not None:
                entry["first_diff"] = pos
                entry["baseline_continuation"] = _text(b.get("reply_pieces") or [], pos)
                entry["continuation"] = _text(t.get("reply_pieces") or [], pos)
        out.append(entry)
    return out


def correctness(configs, baseline: str | None, *, sampling: bool) -> dict:
    """compare.json's ``correctness``: the baseline's name and, per configuration, its turns vs the baseline's."""
    ran = [c for c in configs if c.runs]
    base = next((c for c in ran if c.name == baseline), None) if baseline else (ran[0] if ran else None)
    doc: dict = {"baseline": base.name if base is not None else baseline, "skip": None, "configs": []}
    if sampling:
        doc["skip"] = "sampling (do_sample=True): replies differ by chance, only greedy replies are compared"
        return doc
    if base is None:
        doc["skip"] = (f"the baseline {baseline!r} did not run" if baseline else "no configuration ran")
        return doc
    base_turns = base.runs[0].turns
    for c in configs:
        if c is base:
            continue
        if not c.runs:
            doc["configs"].append({"name": c.name, "skip": c.reason or f"configuration {c.status}", "turns": []})
            continue
        turns = compare_turns(base_turns, c.runs[0].turns)
        compared = [t for t in turns if t["same"] is not None]
        doc["configs"].append({
            "name": c.name, "skip": None, "turns": turns,
            "same_turns": sum(1 for t in compared if t["same"]), "compared_turns": len(compared),
        })
    return doc
