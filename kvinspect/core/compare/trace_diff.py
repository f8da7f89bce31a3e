"""Where two traces of one conversation part: the diff section of ``kvinspect diff`` and of a comparison.

Two runs of the same script (two transformers versions, two machines, two policies) are compared
by what the cache did, not by timings: per layer kind, the first turn and step where a layer's
seen, stored or bytes differ; the first generated token that differs, with context; the events
one side raised and the other did not; the cache and layer classes; the checklist items that
differ; turns that ended differently. :func:`diff_records` returns plain JSON data (the
``diff`` field of ``compare.json``); :func:`diff_markdown` and :func:`diff_text` render it, with
every piece of trace text escaped (it is data, never Markdown or terminal control).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvinspect.core.compare.correctness import reply_tokens
from kvinspect.core.text_safety import md_code, md_text, terminal_text
from kvinspect.core.trace.record import TraceRecord, TurnRecord

DIFF_FORMAT = "kvinspect-diff"
CONTEXT = 16  # generated tokens shown before and after the first differing one
FIELDS = (("seen", "seen"), ("stored", "stored"), ("nbytes", "bytes"))
NO_DIFFERENCE = "no difference"
#: Points per side kept for the overlay figure (cache.png); longer traces are strided.
SERIES_POINTS = 2000


def _side(name: str, record: TraceRecord, where: str | None) -> dict:
    h = record.header
    ver = h.get("versions") or {}
    model = h.get("model") or {}
    return {"name": name, "trace": where, "kvinspect": ver.get("kvinspect"), "transformers": ver.get("transformers"),
            "torch": ver.get("torch"), "device": h.get("device") or model.get("device"),
            "model": model.get("spec") or model.get("name"), "steps": record.n_steps, "turns": len(record.turns)}


def _layer_kinds(a: TraceRecord, b: TraceRecord) -> dict[str, list[int]]:
    """Layers grouped by what the model config asks for (the same on both sides for one model).

    The cache's own kind (``static-sliding`` vs ``sliding``) can differ between versions, which is
    a difference to report, not a reason to group the layers differently.
    """
    n = min(a.n_layers, b.n_layers)
    info = a.header.get("layers") or b.header.get("layers") or []
    groups: dict[str, list[int]] = {}
    for i in range(n):
        kind = info[i].get("config_attention") if i < len(info) and isinstance(info[i], dict) else None
        groups.setdefault(str(kind or "layer"), []).append(i)
    return groups


def _layer_parts(a: TraceRecord, b: TraceRecord) -> list[dict]:
    out = []
    turns = min(len(a.turns), len(b.turns))
    for kind, layers in _layer_kinds(a, b).items():
        entry: dict[str, Any] = {"kind": kind, "layers": layers, "same": True}
        for k in range(turns):
            ta, tb = a.turns[k], b.turns[k]
            found = _first_step_diff(a, b, ta, tb, layers)
            if found is not None:
                entry.update(same=False, turn=k, **found)
                break
        else:
            if len(a.turns) != len(b.turns):
                entry.update(same=False, turn=turns, step=0, field="turns", layer=None,
                             a=len(a.turns), b=len(b.turns), step_a=None, step_b=None)
        out.append(entry)
    return out


def _steps(record: TraceRecord, turn: TurnRecord) -> tuple[int, int]:
    # A turn still running has no end yet; a failed turn can end where it began (no forward at all).
    end = record.n_steps if turn.status == "running" else turn.end_step
    return turn.first_step, min(end, record.n_steps)


def _first_step_diff(a, b, ta: TurnRecord, tb: TurnRecord, layers: list[int]) -> dict | None:
    a0, a1 = _steps(a, ta)
    b0, b1 = _steps(b, tb)
    n = min(a1 - a0, b1 - b0)
    for j in range(n):
        for col, label in FIELDS:
            va = a.col(col)[a0 + j, layers]
            vb = b.col(col)[b0 + j, layers]
            diff = (va != vb).nonzero()[0]
            if len(diff):
                i = int(diff[0])
                return {"step": j, "step_a": a0 + j, "step_b": b0 + j, "field": label, "layer": layers[i],
                        "a": int(va[i]), "b": int(vb[i])}
    if a1 - a0 != b1 - b0:
        return {"step": n, "step_a": a0 + n if n < a1 - a0 else None, "step_b": b0 + n if n < b1 - b0 else None,
                "field": "steps", "layer": None, "a": a1 - a0, "b": b1 - b0}
    return None


def _sampled(turn: TurnRecord) -> bool:
    s = turn.settings or {}
    return bool(s.get("do_sample")) or s.get("mode") == "sample"


def _tokens(a: TraceRecord, b: TraceRecord) -> dict:
    for k in range(min(len(a.turns), len(b.turns))):
        ta, tb = a.turns[k], b.turns[k]
        if _sampled(ta) or _sampled(tb):
            return {"same": None, "skip": "sampled decoding: replies differ by chance", "turn": k}
        ia, pa = reply_tokens(ta, a)
        ib, pb = reply_tokens(tb, b)
        if ia is None or ib is None:
            return {"same": None, "skip": "token ids not recorded in a trace", "turn": k}
        n = min(len(ia), len(ib))
        pos = next((i for i in range(n) if ia[i] != ib[i]), None)
        if pos is None and len(ia) != len(ib):
            pos = n
        if pos is not None:
            lo = max(0, pos - CONTEXT)
            return {"same": False, "skip": None, "turn": k, "position": pos,
                    "before": "".join(pa[lo:pos]),
                    "a": "".join(pa[pos:pos + CONTEXT]), "b": "".join(pb[pos:pos + CONTEXT]),
                    "a_ids": ia[pos:pos + CONTEXT], "b_ids": ib[pos:pos + CONTEXT]}
    return {"same": True, "skip": None, "turn": None}


def _event_key(e) -> tuple:
    return (e.kind, e.turn)


def _events(a: TraceRecord, b: TraceRecord) -> dict:
    ca, cb = Counter(_event_key(e) for e in a.events), Counter(_event_key(e) for e in b.events)

    def only(rec: TraceRecord, mine: Counter, other: Counter) -> list[dict]:
        left = mine - other
        out = []
        for e in rec.events:
            key = _event_key(e)
            if left[key] > 0:
                left[key] -= 1
                out.append({"kind": e.kind, "severity": e.severity, "turn": e.turn, "step": e.step,
                            "layer": e.layer, "message": e.message})
        return out

    return {"only_a": only(a, ca, cb), "only_b": only(b, cb, ca)}


def _unique(values) -> list:
    out: list = []
    for v in values:
        if v and v not in out:
            out.append(v)
    return out


def _classes(rec: TraceRecord, groups: dict[str, list[int]]) -> dict:
    layers: dict[str, list[str]] = {}
    for kind, idx in groups.items():
        wanted = set(idx)
        layers[kind] = _unique(str(row.get("cls")) for t in rec.turns for row in t.layers
                               if isinstance(row, dict) and row.get("index") in wanted and row.get("cls"))
    return {"cache": _unique(str(t.cache_class) for t in rec.turns), "layers": layers}


def _checklist(a: TraceRecord, b: TraceRecord) -> list[dict]:
    out = []
    for k in range(min(len(a.turns), len(b.turns))):
        ia = {c.get("key"): c for c in a.turns[k].checklist if isinstance(c, dict)}
        ib = {c.get("key"): c for c in b.turns[k].checklist if isinstance(c, dict)}
        for key in _unique(list(ia) + list(ib)):
            sa, sb = (ia.get(key) or {}).get("status"), (ib.get(key) or {}).get("status")
            if sa != sb:
                item = ia.get(key) or ib.get(key) or {}
                out.append({"turn": k, "key": key, "title": item.get("title") or key, "a": sa, "b": sb,
                            "evidence_a": (ia.get(key) or {}).get("evidence"),
                            "evidence_b": (ib.get(key) or {}).get("evidence")})
    return out


def _turns(a: TraceRecord, b: TraceRecord) -> list[dict]:
    out = []
    for k in range(max(len(a.turns), len(b.turns))):
        ta = a.turns[k] if k < len(a.turns) else None
        tb = b.turns[k] if k < len(b.turns) else None
        sa, sb = (ta.status if ta else None), (tb.status if tb else None)
        if sa != sb:
            out.append({"turn": k, "a": sa, "b": sb, "error_a": ta.error if ta else None,
                        "error_b": tb.error if tb else None})
    return out


def _series(a: TraceRecord, b: TraceRecord, groups: dict[str, list[int]]) -> list[dict]:
    """Per layer kind, the stored rows of its first layer at every step on each side (the overlay figure's)."""
    n = max(a.n_steps, b.n_steps)
    stride = max(1, -(-n // SERIES_POINTS))
    out = []
    for kind, layers in groups.items():
        i = layers[0]
        out.append({
            "kind": kind, "layer": i, "stride": stride,
            "a": [int(v) for v in a.stored[::stride, i]], "b": [int(v) for v in b.stored[::stride, i]],
            "turn_starts_a": [t.first_step for t in a.turns], "turn_starts_b": [t.first_step for t in b.turns],
        })
    return out


def diff_records(a: TraceRecord, b: TraceRecord, names: tuple[str, str] = ("A", "B"),
                 where: tuple[str | None, str | None] = (None, None), *, series: bool = False) -> dict:
    """The diff section as JSON data. ``names`` label the sides (environments, configurations); ``series``
    adds each layer kind's stored rows per step on both sides (compare.json keeps them for cache.png)."""
    groups = _layer_kinds(a, b)
    d: dict[str, Any] = {
        "format": DIFF_FORMAT, "version": 1,
        "a": _side(names[0], a, where[0]), "b": _side(names[1], b, where[1]),
        "layers": _layer_parts(a, b), "tokens": _tokens(a, b), "events": _events(a, b),
        "classes": {"a": _classes(a, groups), "b": _classes(b, groups)},
        "checklist": _checklist(a, b), "turns": _turns(a, b),
    }
    if series:
        d["series"] = _series(a, b, groups)
    notes = []
    if a.n_layers != b.n_layers or d["a"]["model"] != d["b"]["model"]:
        # Still compared layer by layer (the first min(n) layers): say so rather than refuse a fork's checkpoint.
        notes.append(f"the traces are of different models: {d['a']['model']} ({a.n_layers} layers) and "
                     f"{d['b']['model']} ({b.n_layers} layers)")
    d["notes"] = notes
    classes_same = d["classes"]["a"] == d["classes"]["b"]
    d["same"] = (not notes and all(p["same"] for p in d["layers"]) and d["tokens"]["same"] is not False
                 and not d["events"]["only_a"] and not d["events"]["only_b"] and classes_same
                 and not d["checklist"] and not d["turns"])
    d["classes_same"] = classes_same
    return d


def comparison_diffs(result) -> list[dict]:
    """Where the traces part: each configuration across two environments, or two configurations of one."""
    from kvinspect.core.trace.tracefile import read_trace

    out = result.out_dir
    if not result.plan.conversation:
        return []  # stress and the sweep are not one conversation on both sides
    pairs: list[tuple] = []
    envs = list(dict.fromkeys(c.env for c in result.configs if c.env))
    if len(envs) == 2:
        for cfg in result.plan.configs:
            a = next((c for c in result.configs if c.env == envs[0] and c.config.name == cfg.name), None)
            b = next((c for c in result.configs if c.env == envs[1] and c.config.name == cfg.name), None)
            if a is not None and b is not None:
                pairs.append((cfg.name, a, b))
    elif len(envs) <= 1 and len(result.configs) == 2:
        a, b = result.configs
        pairs.append((f"{a.name} vs {b.name}", a, b))
    out_list = []
    for label, a, b in pairs:
        if not (a.runs and b.runs):
            out_list.append({"config": label, "skip": f"{a.name if not a.runs else b.name} has no run to compare",
                             "same": None})
            continue
        ra, rb = a.runs[0], b.runs[0]
        try:
            ta, tb = read_trace(out / ra.dir), read_trace(out / rb.dir)
        except Exception as exc:  # noqa: BLE001 - a missing trace (the engine died first) is said, not raised
            out_list.append({"config": label, "skip": f"a trace could not be read: {exc}", "same": None})
            continue
        names = (a.env, b.env) if a.env and b.env and a.env != b.env else (a.name, b.name)
        d = diff_records(ta, tb, (str(names[0]), str(names[1])), (ra.dir, rb.dir), series=True)
        out_list.append({"config": label, "skip": None, **d})
    return out_list


# -- rendering --------------------------------------------------------------------------------------

def _where(p: dict) -> str:
    # Turns are 1-based as every report counts them; steps count from the turn's first forward.
    at = f"turn {p['turn'] + 1}, step {p['step']}"
    ga, gb = p.get("step_a"), p.get("step_b")
    if ga is not None and ga == gb:
        return f"{at} (global step {ga})"
    if ga is not None or gb is not None:
        return f"{at} (global steps {'-' if ga is None else ga} and {'-' if gb is None else gb})"
    return at


def _layer_line(p: dict, na: str, nb: str) -> tuple[str, str]:
    if p["field"] == "turns":
        what = f"{na} has {p['a']} turns, {nb} has {p['b']}"
    elif p["field"] == "steps":
        what = f"the turn has {p['a']} steps in {na}, {p['b']} in {nb}"
    else:
        what = f"layer {p['layer']} {p['field']}: {na} {p['a']}, {nb} {p['b']}"
    return _where(p), what


def _versions(s: dict) -> str:
    return (f"kvinspect {s.get('kvinspect') or '?'}, transformers {s.get('transformers') or '?'}, "
            f"torch {s.get('torch') or '?'}, device {s.get('device') or '?'}")


def _classes_line(c: dict) -> str:
    lay = "; ".join(f"{k}: {', '.join(v) or '-'}" for k, v in c["layers"].items())
    return f"cache {', '.join(c['cache']) or '-'}; layers {lay or '-'}"


def diff_markdown(d: dict, heading: str = "##", label: str | None = None) -> str:
    """The section as Markdown; ``label`` (a configuration's name) goes in front of its heading."""
    na, nb = d["a"]["name"], d["b"]["name"]
    lead = f"{md_text(label)}: where" if label else "Where"
    out = [f"{heading} {lead} {md_text(na)} and {md_text(nb)} part", ""]
    out += [f"- **{md_text(s['name'])}**: {md_text(_versions(s))}" + (f", trace {md_code(s['trace'])}" if s.get("trace")
                                                                    else "") for s in (d["a"], d["b"])]
    out.append("")
    out += [f"> {md_text(n)}" for n in d.get("notes") or []] + ([""] if d.get("notes") else [])
    if d["same"]:
        out += [f"{NO_DIFFERENCE.capitalize()}: the caches, replies, events, classes and checklists are the same.", ""]
        return "\n".join(out)
    out += ["| layer kind | layers | first difference | what |", "|---|---|---|---|"]
    for p in d["layers"]:
        if p["same"]:
            out.append(f"| {md_text(p['kind'])} | {len(p['layers'])} | – | the same |")
        else:
            at, what = _layer_line(p, na, nb)
            out.append(f"| {md_text(p['kind'])} | {len(p['layers'])} | {md_text(at)} | {md_text(what)} |")
    out.append("")
    t = d["tokens"]
    if t["same"] is False:
        out += [f"First differing generated token: turn {t['turn'] + 1}, token {t['position']}.", "",
                "| | tokens |", "|---|---|", f"| before (both) | {_code_cell(t['before'])} |",
                f"| {md_text(na)} | {_code_cell(t['a'])} |", f"| {md_text(nb)} | {_code_cell(t['b'])} |", ""]
    elif t["same"] is None:
        out += [f"Replies not compared: {md_text(t['skip'])}.", ""]
    else:
        out += ["The generated tokens are the same.", ""]
    ev = d["events"]
    for side, key in ((na, "only_a"), (nb, "only_b")):
        if ev[key]:
            out.append(f"Events only in **{md_text(side)}**:")
            out += [f"- turn {e['turn'] + 1} (global step {e['step']}): {md_code(e['kind'])} ({md_text(e['severity'])}): "
                    f"{md_text(e['message'])}" for e in ev[key]]
            out.append("")
    if not ev["only_a"] and not ev["only_b"]:
        out += ["Both raised the same events.", ""]
    same = "" if d["classes_same"] else " (they differ)"
    out += [f"Classes{same}:", ""] + [f"- **{md_text(s)}**: {md_text(_classes_line(d['classes'][k]))}"
                                      for s, k in ((na, "a"), (nb, "b"))] + [""]
    if d["checklist"]:
        out += ["Checklist items that differ:", "", f"| turn | item | {md_text(na)} | {md_text(nb)} |", "|---|---|---|---|"]
        out += [f"| {c['turn'] + 1} | {md_text(c['title'])} | {md_text(c['a'] or '–')} | {md_text(c['b'] or '–')} |"
                for c in d["checklist"]]
        out.append("")
    if d["turns"]:
        out += ["Turns that ended differently:", ""]
        out += [f"- turn {x['turn'] + 1}: {md_text(na)} {md_text(x['a'] or 'absent')}"
                + (f" ({md_text(x['error_a'])})" if x.get("error_a") else "")
                + f", {md_text(nb)} {md_text(x['b'] or 'absent')}"
                + (f" ({md_text(x['error_b'])})" if x.get("error_b") else "") for x in d["turns"]]
        out.append("")
    return "\n".join(out)


def _code_cell(text: str):
    return md_code(text).replace("|", "\\|") if text else md_text("(nothing)")


def diff_text(d: dict) -> str:
    """The same section for a terminal (the caller prints it through the escaping echo)."""
    na, nb = d["a"]["name"], d["b"]["name"]
    lines = [f"{s['name']}: {_versions(s)}" + (f" ({s['trace']})" if s.get("trace") else "") for s in (d["a"], d["b"])]
    lines += [f"note: {n}" for n in d.get("notes") or []]
    if d["same"]:
        return "\n".join(lines + [f"{NO_DIFFERENCE}: the caches, replies, events, classes and checklists are the same"])
    for p in d["layers"]:
        if p["same"]:
            lines.append(f"{p['kind']} layers ({len(p['layers'])}): the same")
        else:
            at, what = _layer_line(p, na, nb)
            lines.append(f"{p['kind']} layers ({len(p['layers'])}): first differ at {at}: {what}")
    t = d["tokens"]
    if t["same"] is False:
        lines += [f"first differing generated token: turn {t['turn'] + 1}, token {t['position']}",
                  f"  before: {t['before']!r}", f"  {na}: {t['a']!r}", f"  {nb}: {t['b']!r}"]
    elif t["same"] is None:
        lines.append(f"replies not compared: {t['skip']}")
    else:
        lines.append("generated tokens: the same")
    for side, key in ((na, "only_a"), (nb, "only_b")):
        for e in d["events"][key]:
            lines.append(f"only in {side}: turn {e['turn'] + 1} (global step {e['step']}): {e['kind']}: {e['message']}")
    for s, k in ((na, "a"), (nb, "b")):
        lines.append(f"classes in {s}: {_classes_line(d['classes'][k])}")
    for c in d["checklist"]:
        lines.append(f"checklist, turn {c['turn'] + 1}, {c['title']}: {na} {c['a'] or '-'}, {nb} {c['b'] or '-'}")
    for x in d["turns"]:
        lines.append(f"turn {x['turn'] + 1} ended {x['a'] or 'absent'} in {na}"
                     + (f" ({x['error_a']})" if x.get("error_a") else "")
                     + f", {x['b'] or 'absent'} in {nb}" + (f" ({x['error_b']})" if x.get("error_b") else ""))
    return "\n".join(terminal_text(x, keep="\t") for x in lines)
