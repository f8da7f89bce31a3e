"""``compare.md``: GitHub-friendly tables from the compare.json document (no other input)."""

from __future__ import annotations

from kvinspect.core.report.md_snippets import md_fence
from kvinspect.core.report.text_table import md_table
from kvinspect.core.text_safety import md_code, md_text
from kvinspect.core.units import fmt_bytes

DASH = "–"


def _time_unit(v: float) -> tuple[float, str, int]:
    """(scale, unit, decimals) for a time in seconds: ms below 1 s; about three significant digits."""
    v = abs(v)
    if v < 1:
        ms = v * 1000
        return 1000.0, "ms", 1 if ms < 10 else 0
    return 1.0, "s", 2 if v < 10 else 1 if v < 100 else 0


def _rate_decimals(v: float) -> int:
    v = abs(v)
    return 2 if v < 10 else 1 if v < 100 else 0


def fmt_s(v) -> str:
    """One time, in ms below a second (``93.1 ms``, ``100 ms``) and in s above (``2.37 s``)."""
    if v is None:
        return DASH
    scale, unit, dec = _time_unit(float(v))
    return f"{float(v) * scale:.{dec}f} {unit}"


def fmt_rate(v) -> str:
    """A rate (tokens/s): about three significant digits (``40.8``, ``925``, ``1064``)."""
    return DASH if v is None else f"{float(v):.{_rate_decimals(float(v))}f}"


def spread(st: dict | None, fmt=fmt_s) -> str:
    """``median [min–max]`` in one unit and one precision, both taken from the median
    (``100 ms [93–110]``, ``925 [901–1064]``); just the value when there is one sample."""
    if not st:
        return DASH
    med_v, lo_v, hi_v = float(st["median"]), float(st["min"]), float(st["max"])
    if fmt is fmt_s:
        scale, unit, dec = _time_unit(med_v)
        suffix = f" {unit}"
    elif fmt is fmt_rate:
        scale, dec, suffix = 1.0, _rate_decimals(med_v), ""
    else:  # any other formatter: values as it writes them
        if st["n"] == 1 or lo_v == hi_v:
            return fmt(med_v)
        return f"{fmt(med_v)} [{fmt(lo_v)}–{fmt(hi_v)}]"

    def num(x: float) -> str:
        return f"{x * scale:.{dec}f}"

    if st["n"] == 1 or num(lo_v) == num(hi_v):
        return num(med_v) + suffix
    return f"{num(med_v)}{suffix} [{num(lo_v)}–{num(hi_v)}]"


def med(st: dict | None):
    return None if not st else st["median"]


def ratio(a, b) -> str:
    if a is None or b is None or b <= 0:
        return DASH
    return f"{a / b:.2f}×"


def _bytes(v) -> str:
    return DASH if v is None else fmt_bytes(v)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list], align: str | None = None) -> list[str]:
    """compare.md's tables: the first column left, numbers right, unless ``align`` (``"lrl…"``) says otherwise."""
    al = align or ("l" + "r" * (len(head) - 1))
    right = {i for i, a in enumerate(al) if a == "r"}
    table = md_table(head, rows, right, left=set(range(len(al))) - right, cell=_cell, padded_rule=True)
    return table.split("\n")


def _list(v: list | None) -> str:
    return ", ".join(DASH if x is None else str(x) for x in (v or [])) or DASH


def markdown(d: dict) -> str:
    m = d["model"]
    plan = d["plan"]
    s = plan["settings"]
    ver = d.get("versions") or {}
    mem = d["memory_label"]
    out = [f"# kvinspect compare: {md_text(m['name'])} on {md_text(d['device'])}", ""]
    facts = [
        f"Model {md_code(m['spec'])} ({md_text(m['class'])}, {md_text(m['dtype'])}, {m['n_layers']} layers) on "
        f"{md_code(d['device'])}",
        f"transformers {md_text(ver.get('transformers', '?'))}, torch {md_text(ver.get('torch', '?'))}",
        f"max_new_tokens {s['max_new_tokens']}, {'sampling' if s['do_sample'] else 'greedy'}",
        f"{plan['repeat']} repeat(s), interleaved (configuration order rotated every repeat)",
        f"created {md_text(d['created'])}",
    ]
    if d.get("script"):
        facts.insert(2, f"script {md_text(plan.get('script') or '(inline)')}: {len(d['script']['turns'])} turns")
    envs = d.get("environments") or []
    if envs:
        facts[1] = f"{len(envs)} environments (each configuration in its own engine child)"
    out += [" · ".join(facts), ""]
    if envs:
        out += ["| environment | kvinspect | transformers | torch | device | python |", "|---|---|---|---|---|---|"]
        out += [f"| **{md_text(e['name'])}** | {md_text(e.get('kvinspect') or DASH)} | "
                f"{md_text(e.get('transformers') or DASH)} | {md_text(e.get('torch') or DASH)} | "
                f"{md_text(e.get('device') or DASH)} | "
                + (md_code(e.get("python")).replace("|", "\\|") if e.get("python") else DASH)
                + ("" if not e.get("host") else f" on {md_code(e['host']).replace('|', '&#124;')}")
                + (f" (not started: {md_text(e['error'])})" if e.get("error") else "") + " |" for e in envs]
        out.append("")
    if d.get("cancelled"):
        out += ["> **Cancelled**: the figures below cover only what finished before Cancel.", ""]
    if d.get("nothing_measured"):
        head, _, why = d["nothing_measured"].partition(": ")
        out += [f"> **{head[:1].upper()}{head[1:]}**: {why}.", ""]
    if d.get("command"):
        out += [md_fence(" ".join(d["command"])), ""]
    configs = d["configs"]
    base = d.get("baseline")
    if plan.get("conversation"):
        out += _conversation(configs, base, mem)
        out += _correctness(d.get("correctness"))
    out += _diffs(d.get("diff") or [])
    skipped = [c for c in configs if c["status"] != "ran"]
    if skipped:
        out += ["## Skipped", ""]
        out += [f"- **{md_text(c['name'])}** ({md_text(c['status'])}): {md_text(c['reason'])}" for c in skipped]
        out.append("")
    if d.get("stress"):
        out += _stress(d["stress"])
    if d.get("lengths"):
        out += _lengths(d["lengths"], base, mem)
    if d.get("plots"):
        out += ["## Plots", ""]
        out += [f"![{p.rsplit('/', 1)[-1].rsplit('.', 1)[0].replace('_', ' ')}]({p})" for p in d["plots"]
                if p.endswith(".png")]
        out.append("")
    out += ["## Notes", ""]
    out += [f"- {n}" for n in _standard_notes(d)] + [f"- {md_text(n)}" for n in d.get("notes") or []]
    out.append("")
    return "\n".join(out)


def _diffs(diffs: list[dict]) -> list[str]:
    """Where two environments' (or two configurations') repeat-1 traces part (:mod:`.trace_diff`)."""
    if not diffs:
        return []
    from kvinspect.core.compare.trace_diff import diff_markdown

    out = ["## Where they part", "",
           "The first repeat's traces compared by what the cache did (never timings): `kvinspect diff` prints "
           "the same for any two traces.", ""]
    for d in diffs:
        if d.get("skip"):
            out += [f"### {md_text(d['config'])}", "", f"Not compared: {md_text(d['skip'])}.", ""]
        else:
            out += [diff_markdown(d, "###", label=d["config"]), ""]
    return out


def _env_col(configs: list[dict]) -> bool:
    return any(c.get("env") for c in configs)


def _correctness(doc: dict | None) -> list[str]:
    """Whether each configuration's greedy replies equal the baseline's (absent in older compare.json)."""
    if not doc:
        return []
    out = ["## Correctness", ""]
    if doc.get("skip"):
        return out + [f"Not compared: {md_text(doc['skip'])}.", ""]
    out += [f"Greedy replies compared token by token with **{md_text(doc['baseline'])}**'s.", "",
            "| configuration | same replies | first difference |", "|---|---|---|"]
    for c in doc.get("configs") or []:
        if c.get("skip"):
            out.append(f"| {md_text(c['name'])} | – | not compared: {md_text(c['skip'])} |")
            continue
        diffs = [t for t in c["turns"] if t["same"] is False]
        where = "; ".join(
            f"turn {t['turn'] + 1}, token {t['first_diff']}: {_code(t['baseline_continuation'])} → "
            f"{_code(t['continuation'])}" for t in diffs[:3]) or "–"
        skipped = [t for t in c["turns"] if t["skip"]]
        if skipped:
            where += f" ({len(skipped)} turn(s) not compared: {md_text(skipped[0]['skip'])})"
        verdict = f"{c['same_turns']}/{c['compared_turns']} turns" + ("" if not diffs else " ⚠️")
        out.append(f"| {md_text(c['name'])} | {verdict} | {where} |")
    return out + [""]


def _code(text: str | None) -> str:
    """A continuation as inline code, in a table row: its ``|`` escaped for the table."""
    return md_code(text).replace("|", "\\|") if text else "(end)"


def _conversation(configs: list[dict], base: str | None, mem: str) -> list[str]:
    ran = [c for c in configs if c["summary"]]
    if not ran:
        return []
    out = ["## Summary", "",
           "Medians over measured turns (TTFT, decode) or whole conversations (latency) of every repeat; "
           "[min–max] across repeats. Failed and cancelled turns are left out of the timings.", ""]
    rows = []
    env = _env_col(ran)
    for c in ran:
        sm = c["summary"]
        fails = sm["turns_failed"]
        rows.append([
            f"**{md_text(c['name'])}**", *([md_text(c.get("env") or DASH)] if env else []),
            spread(sm["ttft_s"]), spread(sm["conversation_s"]),
            spread(sm["decode_tokens_per_s"], fmt_rate),
            _list(sm["prefill_tokens_per_turn"]), _bytes(sm["peak_kv_bytes"]), _bytes(sm["peak_memory_bytes"]),
            f"{fails}/{sm['turns_total']}" if fails else "0",
        ])
    out += _table(["configuration", *(["environment"] if env else []), "TTFT", "conversation latency",
                   "decode tok/s", "prefill tokens per turn", "peak KV", mem, "failed turns"], rows,
                  "ll" + "r" * 7 if env else None)
    out.append("")
    b = next((c for c in ran if c["name"] == base), None)
    if b is not None and len(ran) > 1:
        bs = b["summary"]
        out += [f"Relative to **{md_text(base)}** (median ÷ median; below 1× is faster or smaller):", ""]
        rows = [[f"**{md_text(c['name'])}**", *([md_text(c.get("env") or DASH)] if env else []),
                 ratio(med(c["summary"]["ttft_s"]), med(bs["ttft_s"])),
                 ratio(med(c["summary"]["conversation_s"]), med(bs["conversation_s"])),
                 ratio(med(c["summary"]["decode_tokens_per_s"]), med(bs["decode_tokens_per_s"])),
                 ratio(c["summary"]["peak_kv_bytes"], bs["peak_kv_bytes"])] for c in ran if c["name"] != base]
        out += _table(["configuration", *(["environment"] if env else []), "TTFT", "conversation latency",
                       "decode tok/s", "peak KV"], rows, "ll" + "r" * 4 if env else None)
        out.append("")
    fail_rows = []
    for c in ran:
        for f in c["summary"]["failures"]:
            fail_rows.append([f"**{md_text(c['name'])}**", *([md_text(c.get("env") or DASH)] if env else []), f["kind"], _list(f["turns"]), _list(f["repeats"]), f["count"],
                              md_text(f["reason"])])
    if fail_rows:
        out += ["### Failures", ""]
        out += _table(["configuration", *(["environment"] if env else []), "kind", "turns", "repeats", "count",
                       "reason"], fail_rows, "l" + ("l" if env else "") + "lllrl")
        out.append("")
    out += ["## Per configuration", ""]
    for c in ran:
        out += _per_config(c, mem)
    return out


def _per_config(c: dict, mem: str) -> list[str]:
    sm = c["summary"]
    out = [f"### {md_text(c['name'])}", "", f"{md_text(c['description'])} (policy {md_code(c['policy'])}, cache {md_code(c['cache_impl'])}"
           + (f", max_cache_len {c['max_cache_len']}" if c.get("max_cache_len") else "") + ")."
           + f" Cache objects per run: {sm['cache_objects_per_run']}.", ""]
    rows = []
    for t in c["per_turn"]:
        rows.append([
            t["index"] + 1, _v(t["prompt_tokens"]), _v(t["reused_tokens"]), _v(t["prefill_tokens"]),
            _v(t["new_tokens"]),
            spread(t["ttft_s"]), spread(t["total_s"]), spread(t["tokens_per_s"], fmt_rate), _bytes(t["kv_bytes"]),
            _bytes(t["peak_kv_bytes"]), _v(t["kv_capacity_rows"]), _bytes(t["peak_memory_bytes"]),
            f"{t['ok']} ok" + (f", {t['failed']} failed" if t["failed"] else ""),
        ])
    out += _table(["turn", "prompt", "reused", "prefill", "new", "TTFT", "turn latency", "decode tok/s",
                   "KV at end", "peak KV", "capacity rows", mem, "turns"], rows)
    out.append("")
    w = c.get("warmup")
    if w:
        conv = ", ".join(fmt_s(x) for x in w["conversation_s"])
        line = (f"Warm-up (not in the figures above): {w['runs']} untimed pass(es), {conv} per conversation; "
                f"first turn TTFT {fmt_s(w['first_turn_ttft_s'])}, total {fmt_s(w['first_turn_total_s'])}.")
        if w.get("extra_s_vs_steady") is not None:
            line += f" First pass minus steady-state median: {fmt_s(w['extra_s_vs_steady'])}"
            line += " (≈ compilation)." if c["compile"] else "."
        if w.get("compiled_graphs") is not None:
            line += f" Graphs compiled in warm-up: {w['compiled_graphs']}; during the measured repeats: " \
                    f"{c.get('steady_compiled_graphs')}."
        out += [line, ""]
    rl = c.get("recompile_limit")
    if rl:
        out += [recompile_note(c["name"], rl), ""]
    return out


def recompile_note(name: str, rl: dict) -> str:
    """One sentence: dynamo hit its recompile limit, so part of the decode step ran eagerly."""
    where = ", ".join(rl.get("runs") or []) or "a run"
    text = (f"{name}: torch._dynamo reached config.{rl.get('limit_type') or 'recompile_limit'} "
            f"({rl.get('limit')} graphs for one function) in {where}; dynamo compiled no more graphs for it, so "
            "decode steps those graphs did not cover ran eagerly and these figures are partly eager.")
    if rl.get("reason"):
        text += f" Last recompile reason: {md_code(rl['reason'])}."
    return text


def _v(x) -> str:
    return DASH if x is None else str(x)


def _stress(st: dict) -> list[str]:
    out = [f"## Long-conversation stress (up to {st['max_turns']} turns, script turns cycled)", ""]
    if not st["configs"]:
        return out + ["No configuration ran (see Skipped).", ""]
    out += ["A configuration fails at its first failed turn (static cache overflow, out of memory, any error) or "
            "when the conversation passes the model's max_position_embeddings (context limit). *Tokens at "
            "failure* is the failing turn's prompt + max_new_tokens (the conversation length had it finished); "
            "the cache needed one row less (*cache rows needed*), because generate never feeds back the last "
            "token.", ""]
    rows = []
    for c in st["configs"]:
        rows.append([f"**{md_text(c['name'])}**", c["status"], _v(c["failed_at_turn"]), _v(c["tokens_at_failure"]),
                     _v(c.get("cache_rows_needed")), _v(c["failure_kind"]), c["turns_completed"],
                     c["tokens_completed"], _v(c.get("max_cache_len")), md_text(c["reason"] or DASH)])
    out += _table(["configuration", "result", "failed at turn", "tokens at failure (prompt + new)",
                   "cache rows needed", "kind", "turns completed", "tokens completed", "max_cache_len", "reason"],
                  rows, "llrrrlrrrl")
    out.append("")
    return out


def _lengths(lg: dict, base: str | None, mem: str) -> list[str]:
    lens = [int(k) for k in lg["prompt_tokens"]]
    cfgs = lg["configs"]
    skipped = [f"- length {s['length']} skipped: {md_text(s['reason'])}" for s in lg.get("skipped") or []]
    if not lens or not cfgs:
        why = "every length was skipped" if not lens else "no configuration ran (see Skipped)"
        return ([f"## Prompt-length sweep (one turn, {lg['max_new_tokens']} new tokens)", "",
                 f"Nothing was measured: {why}.", ""] + (skipped + [""] if skipped else []))
    out = [f"## Prompt-length sweep (one turn, {lg['max_new_tokens']} new tokens; static max_cache_len "
           f"{lg['max_cache_len']})", ""]
    out += ["Each cell: median [min–max] over repeats. Prompt tokens are the rendered prompt (template included): "
            + ", ".join(f"{k} → {v}" for k, v in lg["prompt_tokens"].items()) + ".", ""]

    def grid(title: str, key: str, fmt, with_ratio: bool):
        rows = []
        b = next((c for c in cfgs if c["name"] == base), None)
        for c in cfgs:
            pts = {p["length"]: p for p in c["points"]}
            row = [f"**{md_text(c['name'])}**"]
            for n in lens:
                p = pts.get(n)
                val = p.get(key) if p else None
                if isinstance(val, dict):
                    cell = spread(val, fmt)
                else:
                    cell = DASH if val is None else fmt(val)
                if with_ratio and b is not None and c is not b and p and isinstance(val, dict):
                    bp = next((q for q in b["points"] if q["length"] == n), None)
                    if bp:
                        cell += f" ({ratio(med(val), med(bp.get(key)))})"
                row.append(cell)
            rows.append(row)
        return [f"**{title}**", ""] + _table(["configuration"] + [f"{n} tokens" for n in lens], rows) + [""]

    out += grid(f"TTFT (ratio vs {md_text(base)})" if base else "TTFT", "ttft_s", fmt_s, True)
    out += grid(f"Turn latency (ratio vs {md_text(base)})" if base else "Turn latency", "total_s", fmt_s, True)
    out += grid("Decode tokens/s", "decode_tokens_per_s", fmt_rate, False)
    out += grid("Peak KV bytes", "peak_kv_bytes", _bytes, False)
    out += grid(mem, "peak_memory_bytes", _bytes, False)
    if skipped:
        out += skipped + [""]
    fails = [(c["name"], p["length"], f) for c in cfgs for p in c["points"] for f in p["failures"]]
    if fails:
        out += _table(["configuration", "length", "count", "reason"],
                      [[f"**{md_text(n)}**", ln, f["count"], md_text(f["reason"])] for n, ln, f in fails], "lrrl") + [""]
    return out


def _standard_notes(d: dict) -> list[str]:
    kind = d["memory_kind"]
    notes = []
    if kind == "rss":
        notes.append("Peak memory is the process RSS (no accelerator here): an upper bound that includes the "
                     "weights, activations and allocator caching, and it seldom falls between runs, so a later "
                     "configuration can inherit an earlier peak. Peak KV is the cache itself: exact bytes of the "
                     "K/V tensors (a static cache counts its whole allocated buffer).")
    elif kind == "cuda":
        notes.append("Peak memory is torch.cuda.max_memory_allocated, reset at every turn: weights + KV + "
                     "activations of that turn. Peak KV is the cache alone (a static cache counts its whole buffer).")
    notes.append(f"Every run is a complete trace folder under `{d.get('runs_dir', 'runs')}/<configuration>-r<k>/` "
                 "(open it with `kvinspect view` or `kvinspect report`).")
    notes.append("Timings are wall-clock on a machine that may be shared; compare medians and look at the spread, "
                 "and rerun with more --repeat when ranges overlap.")
    return notes
