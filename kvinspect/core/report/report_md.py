"""``report.md``: the bug-report page, section by section (GitHub-flavoured Markdown).

Built from a record that is already redacted when the report is; every section degrades to a
line saying what is missing rather than failing (a damaged trace still gets a report).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from kvinspect.core.cache.layer_kinds import base_kind, layer_kinds
from kvinspect.core.detect.provenance import shown
from kvinspect.core.report.md_snippets import (
    cache_label,
    code_span,
    count_noun,
    event_markdown,
    md_fence,
    md_table,
    run_lengths,
    turn_layers_markdown,
    turn_phrase,
    turns_markdown,
)
from kvinspect.core.report.reproduce import (
    OBSERVE,
    REBUILT,
    RERUN_DIR,
    SCRIPT_NAME,
    TRACE,
    Reproduction,
    reproduce,
    trace_origin,
)
from kvinspect.core.text_safety import Markdown, md_code, md_text
from kvinspect.core.tokens.text import STRIP_LEGEND, event_strip
from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.trace.tracefile import TRACE_NAME
from kvinspect.core.units import fmt_bytes

REPORT_NAME = "report.md"
SUMMARY_NAME = "summary.json"
WINDOW_NAME = "window.png"
PLOTS = {"cache": "KV cache per layer: stored tokens (heatmap) and totals",
         "memory": "Memory: KV bytes by device, process RSS and accelerator memory",
         "tokens": "Tokens at the last step: which tokens each layer still holds (kvinspect tokens TRACE)"}
STATUS_ICON = {"pass": "✅", "warn": "⚠️", "fail": "❌"}
SEVERITY_ICON = {"info": "ℹ️", "warn": "⚠️", "error": "❌"}


# -- the page --------------------------------------------------------------------------------------

def report_markdown(record: TraceRecord, *, reproduction: Reproduction | None = None,
                    images: dict[str, list[str]] | None = None, screenshot: str | None = None,
                    image_notes: Sequence[str] = (), files: Sequence[str] = ()) -> str:
    """The whole ``report.md`` (``record`` is already redacted when the report is)."""
    redacted = bool(record.header.get("redacted"))
    rep = reproduction or reproduce(record)
    parts = [
        _title(record), _sec_reproduce(record, rep, redacted), "## Environment\n\n" + _env_table(record),
        _sec_model(record), _sec_cache(record, rep), _sec_provenance(record), "## Turns\n\n" + turns_markdown(record),
        _sec_conversation(record, redacted), _sec_images(record), _sec_events(record), _sec_checklist(record),
        _sec_plots(images or {}, screenshot, image_notes), _sec_layers(record), _sec_notes(record),
        _sec_files(files),
        f"---\n<sub>Written by kvinspect {md_text((record.header.get('versions') or {}).get('kvinspect') or '')} from "
        f"`{TRACE_NAME}`. Every file here is plain text, JSON or an image: nothing needs the network or kvinspect "
        f"to read.</sub>",
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def _title(record: TraceRecord) -> str:
    h = record.header
    m = h.get("model") or {}
    sess = h.get("session") or {}
    name = md_text(m.get("name") or m.get("spec") or "model")
    n = len(record.turns)
    lines = [
        f"# kvinspect report: {name}, {count_noun(n, 'turn')}, policy {code_span(sess.get('policy') or '?')}",
        _verdict(record),
        f"Recorded {md_text(h.get('created') or '?')} · {record.n_steps} forward passes · trace format "
        f"{md_text(h.get('version') or '?')}" + (" · **conversation redacted**" if record.header.get("redacted") else ""),
        "Contents: [Reproduce](#reproduce) · [Environment](#environment) · [Model](#model) · "
        "[Cache and session](#cache-and-session) · [Turns](#turns) · [Events](#events) · "
        "[Checklist](#checklist) · [Plots](#plots) · [Layers at the end of each turn](#layers-at-the-end-of-each-turn)",
    ]
    return "\n\n".join(lines)


def _verdict(record: TraceRecord) -> str:
    """One bold sentence (problems or none), then the other facts as a list: read at a glance in an issue."""
    problems = [e for e in record.events if e.is_problem]
    if problems:
        by_kind: dict[str, list[int]] = {}
        for e in problems:
            by_kind.setdefault(e.kind, []).append(e.turn + 1)
        head = f"⚠️ **{count_noun(len(problems), 'problem event')}:** " + "; ".join(
            f"{code_span(k)} ({turn_phrase(ts)})" for k, ts in by_kind.items()) + "."
    else:
        head = "✅ **No problem events.**"
    facts = []
    info = len(record.events) - len(problems)
    if info:
        facts.append(f"{count_noun(info, 'informational event')} (expected behaviour, such as a window reached).")
    bad = [t for t in record.turns if t.status not in ("ok", "running")]
    if bad:
        statuses = {t.status for t in bad}
        why = md_text(bad[0].status) if len(statuses) == 1 else ", ".join(f"turn {t.index + 1} {md_text(t.status)}"
                                                                           for t in bad)
        facts.append(f"{turn_phrase([t.index + 1 for t in bad], capital=True)} did not complete normally ({why}): "
                     f"see [Turns](#turns).")
    if record.notes:
        facts.append("The trace is damaged: see [Trace notes](#trace-notes).")
    return head + ("\n\n" + "\n".join(f"- {f}" for f in facts) if facts else "")


def _sec_reproduce(record: TraceRecord, rep: Reproduction, redacted: bool) -> str:
    if rep.origin in (TRACE, OBSERVE):
        out = ["## Reproduce", *_reproduce_program(rep)]
    else:
        out = ["## Reproduce", "From this folder, with kvinspect installed:", md_fence(shlex.join(rep.command), "bash"),
               *_reproduce_script(record, rep, redacted)]
    if rep.caveats:
        out.append("Caveats:\n\n" + "\n".join(f"- {c}" for c in rep.caveats))
    return "\n\n".join(out)


def _rerun_writes(aside: str = "") -> str:
    return (f"writes `{RERUN_DIR}/{TRACE_NAME}` and `{RERUN_DIR}/{SUMMARY_NAME}`{aside}: compare their per-turn, "
            f"per-layer `seen`/`stored` with `{SUMMARY_NAME}` here")


def _reproduce_script(record: TraceRecord, rep: Reproduction, redacted: bool) -> list[str]:
    """``kvinspect run`` (recorded or rebuilt): the command replays the bundled chat script."""
    tpl = f" with the chat template {code_span(rep.template_name)} saved next to it" if rep.template_name else ""
    out = []
    if redacted:
        n = len(record.turns)
        skeleton = {"turns": [f"<your turn {i + 1}>" for i in range(n)]}
        if rep.script:
            skeleton.update(rep.script.settings.to_dict())
        out.append(f"The conversation is redacted, so `{SCRIPT_NAME}` cannot be included. To rerun, write a "
                   f"`{SCRIPT_NAME}` with {count_noun(n, 'turn')} of your own (and your system prompt, if any), "
                   f"with the same settings as this session:")
        out.append(md_fence(json.dumps(skeleton, indent=2), "json"))
        out.append(f"The command then runs it{tpl} and {_rerun_writes()}.")
    elif rep.script:
        n = len(rep.script.turns)
        out.append(f"It replays `{SCRIPT_NAME}` (the {count_noun(n, 'user turn')} and generation settings of "
                   f"this session){tpl}, and {_rerun_writes()}.")
    else:
        out.append(f"No turn kept its text in this trace, so there is no `{SCRIPT_NAME}`: write one with your own "
                   f"turns before running the command.")
    if rep.origin == REBUILT:
        out.append("This session was not started by `kvinspect run` (e.g. the window): the command is rebuilt from "
                   "the session settings recorded in the trace.")
    return out


def _reproduce_program(rep: Reproduction) -> list[str]:
    """A traced or observed program: rerun the program. There is no chat script, and the words say why."""
    where = f" ({code_span(rep.run_in)} when it was recorded)" if rep.run_in else ""
    no_script = (f"There is no `{SCRIPT_NAME}`: the program decides the conversation, and its turns are its "
                 f"`generate()` (or forward) calls, named here by call site.")
    if rep.origin == TRACE:
        return [f"From the folder the program ran in{where}, with kvinspect installed:",
                md_fence(shlex.join(rep.command), "bash"),
                f"It runs the program again, unchanged, under `kvinspect trace`, which observes every causal LM it "
                f"runs, and {_rerun_writes(' (a trace per model)')}.", no_script]
    intro = ("This trace was written by `kvinspect.observe()` inside the program, so no kvinspect command "
             "reproduces it by itself.")
    if not rep.command:
        return [intro + " Run the program again; its `observe()` block writes a new trace (and its "
                "`summary.json`) to compare with `summary.json` here.", no_script]
    return [intro + f" Run the program again, from the folder it ran in{where}:",
            md_fence(shlex.join(rep.command), "bash"),
            f"Its `observe()` block writes a new trace (and its `{SUMMARY_NAME}`): compare their per-turn, per-layer "
            f"`seen`/`stored` with `{SUMMARY_NAME}` here.", no_script]


def _env_table(record: TraceRecord) -> str:
    h = record.header
    v = dict(h.get("versions") or {})
    mach = h.get("machine") or {}
    m = h.get("model") or {}
    dev = [str(h.get("device") or m.get("device") or "?"), str(m.get("dtype") or "?")]
    if mach.get("gpus"):
        dev.append("GPUs: " + ", ".join(mach["gpus"]))
    if mach.get("cuda"):
        dev.append(f"CUDA {mach['cuda']}")
    if mach.get("mps_available"):
        dev.append("MPS available")
    if mach.get("torch_threads"):
        dev.append(f"{mach['torch_threads']} torch threads")
    os_ = " · ".join(str(x) for x in (mach.get("os"), mach.get("platform"), mach.get("machine")) if x)
    rows = [["kvinspect", v.pop("kvinspect", None) or "?"], ["transformers", v.pop("transformers", None) or "?"],
            ["torch", v.pop("torch", None) or "?"],
            ["Python", f"{v.pop('python', None) or '?'} ({mach.get('python_impl') or '?'})"],
            ["OS", os_ or "?"], ["Device", " · ".join(dev)]]
    if v:
        rows.append(["Other packages", ", ".join(f"{k} {x}" for k, x in v.items() if x)])
    return md_table(["Component", "Version"], rows)


def _sec_model(record: TraceRecord) -> str:
    h = record.header
    m = h.get("model") or {}
    layers = h.get("layers") or []
    kinds = run_lengths([f"{d.get('config_attention') or 'full'}" + (f" {d['window']}" if d.get("window") else "")
                         for d in layers]) or "–"
    rows: list[list[Any]] = [["Spec", code_span(m.get("spec"))], ["Name", m.get("name")], ["Class", code_span(m.get("class"))],
            ["Source", m.get("source")], ["Dtype", m.get("dtype")], ["Load time", _seconds(m.get("load_seconds"))],
            ["Layers", f"{record.n_layers}: {kinds}"]]
    out = ["## Model", md_table(["Field", "Value"], rows)]
    if m.get("notes"):
        out.append("Loading notes:\n\n" + "\n".join(f"- {md_text(n)}" for n in m["notes"]))
    cfg = m.get("config") or {}
    if cfg:
        crow = [[code_span(k), run_lengths([x if isinstance(x, str) else json.dumps(x) for x in v])
                 if isinstance(v, list) and len(v) > 4 else json.dumps(v, ensure_ascii=False)]
                for k, v in cfg.items()]
        out.append("Config fields that govern caching (text config):\n\n" + md_table(["Field", "Value"], crow))
    gc = m.get("generation_config") or {}
    if gc:
        grow = [[code_span(k), json.dumps(v, ensure_ascii=False)] for k, v in gc.items()]
        out.append("`generation_config` cache fields (a set `cache_implementation` collides with a cache passed "
                   "to `generate()`):\n\n" + md_table(["Field", "Value"], grow))
    return "\n\n".join(out)


def _seconds(v) -> str:
    """Load time: kvinspect did not load an observed model, so it has none; a dash, not ``None s``."""
    return f"{v:.2f} s" if isinstance(v, (int, float)) and v == v else "–"


def _sec_cache(record: TraceRecord, rep: Reproduction) -> str:
    h = record.header
    sess = h.get("session") or {}
    classes: dict[str, list[int]] = {}
    for t in record.turns:
        if t.cache_class:  # "None": the turn ended without a cache object
            name = "no cache object" if cache_label(t) == "none" else code_span(t.cache_class)
            classes.setdefault(name, []).append(t.index + 1)
    cls = Markdown("; ".join(f"{c} ({turn_phrase(ts)})" for c, ts in classes.items()) or "–")
    tpl = sess.get("chat_template")
    tpl_text = Markdown(f"{code_span(tpl)}" + (f", saved here as {code_span(rep.template_name)}"
                                               if rep.template_name else "")) if tpl else "the tokenizer's own"
    settings = sess.get("settings") or {}
    rows = [["Policy", code_span(sess.get("policy"))], ["Cache implementation", code_span(sess.get("cache_impl"))],
            ["Cache class", cls], ["Chat template", tpl_text],
            ["System prompt", sess.get("system") or "none"],
            ["Generation settings", ", ".join(f"{k}={json.dumps(v)}" for k, v in settings.items()) or "–"]]
    if sess.get("max_cache_len") or sess.get("cache_impl") == "static":
        rows.append(["max_cache_len", sess.get("max_cache_len") or "default: min(max positions, 2048)"])
    if sess.get("generation_config_overrides"):
        rows.append(["generation_config overrides", json.dumps(sess["generation_config_overrides"])])
    if sess.get("respect_generation_config"):
        rows.append(["Colliding cache_implementation", "respected (not cleared)"])
    mem = h.get("memory") or {}
    if mem:
        rows.append(["Memory counters", ", ".join(f"{k}={v}" for k, v in mem.items() if v is not None)])
    return "## Cache and session\n\n" + md_table(["Setting", "Value"], rows)


def _sec_provenance(record: TraceRecord) -> str:
    """Where each turn's cache_implementation / cache_config / use_cache came from (turn settings' config_sources)."""
    groups: dict[tuple, list[int]] = {}
    for t in record.turns:
        for key, entry in ((t.settings or {}).get("config_sources") or {}).items():
            if isinstance(entry, dict):
                sig = (key, shown(entry.get("value")), str(entry.get("source", "")), str(entry.get("path") or ""))
                groups.setdefault(sig, []).append(t.index + 1)
    if not groups:
        return ""
    rows = [[code_span(key), value if value == "unset" else code_span(value),
             Markdown(md_text(source) + (f" ({code_span(path)})" if path else "")), turn_phrase(ts)]
            for (key, value, source, path), ts in groups.items()]
    return ("## Generation config provenance\n\nWhere each effective value came from: a `generate()` kwarg, a "
            "`GenerationConfig` passed in, the checkpoint's `generation_config.json`, code that set "
            "`model.generation_config`, kvinspect's `--generation-config`, or the default.\n\n"
            + md_table(["Setting", "Value", "Source", "Turns"], rows))


def _sec_conversation(record: TraceRecord, redacted: bool) -> str:
    if not record.turns:
        return ""
    out = ["## Conversation"]
    # An observed program's turns are its calls, labelled by call site: not user messages.
    observed = trace_origin(record.header) in (TRACE, OBSERVE)
    if observed:
        out.append("The program's own calls: each turn is labelled by where it was made; the prompt text stays the "
                   "program's and is not recorded.")
    if redacted:
        out.append("Redacted: each message is replaced by its token count.")
    for t in record.turns:
        out.append(f"**Turn {t.index + 1}, {'call' if observed else 'user'}**" + (" (redacted)" if redacted else ""))
        out.append(md_fence(t.user or ""))
        new = count_noun(t.new_tokens, "new token") if isinstance(t.new_tokens, int) else "new tokens unknown"
        label = f"**{'Output' if observed else 'Assistant'}** ({new}, {md_text(t.status or 'status unknown')})"
        reply = t.reply if t.reply else "(no reply recorded)"
        if not redacted and reply.count("\n") > 12:
            out.append(f"<details><summary>{label}</summary>\n\n{md_fence(reply)}\n\n</details>")
        else:
            out += [label, md_fence(reply)]
        if t.error:
            out.append(f"Error: {md_text(t.error)}")
    return "\n\n".join(out)


def _sec_events(record: TraceRecord) -> str:
    if not record.events:
        return "## Events\n\nNo detector fired."
    out = ["## Events"]
    for n, e in enumerate(sorted(record.events, key=lambda e: (e.step, e.turn)), 1):
        out.append(f"### {n}. {SEVERITY_ICON.get(e.severity, '')} {md_text(e.kind)} (turn {e.turn + 1})")
        out.append(event_markdown(e))
        tokens = event_strip(record, e)
        if tokens:
            out.append(f"Tokens at step {e.step} ({STRIP_LEGEND}):\n\n" + md_fence(tokens))
    return "\n\n".join(out)


def _sec_checklist(record: TraceRecord) -> str:
    turns = [t for t in record.turns if t.checklist]
    if not turns:
        return "## Checklist\n\nNo checklist (no turn finished)."
    keys: dict[str, str] = {}
    for t in turns:
        for item in t.checklist:
            keys.setdefault(item["key"], item["title"])
    rows = []
    for key, title in keys.items():
        row = [title]
        for t in turns:
            cell = next((i for i in t.checklist if i["key"] == key), None)
            row.append(f"{STATUS_ICON.get(cell['status'], '')} {cell['status']}" if cell else "–")
        rows.append(row)
    out = ["## Checklist", "The four observables, per turn: cache object, length, window, where the KV lives; and "
           "whether the cache object matches the generation config.",
           md_table(["Check"] + [f"Turn {t.index + 1}" for t in turns], rows)]
    for t in turns:
        ev = "\n".join(f"- {STATUS_ICON.get(i['status'], '')} **{md_text(i['title'])}**: {md_text(i['evidence'])}"
                       for i in t.checklist)
        out.append(f"<details><summary>Evidence, turn {t.index + 1}</summary>\n\n{ev}\n\n</details>")
    return "\n\n".join(out)


def _sec_plots(images: dict[str, list[str]], screenshot: str | None, notes: Sequence[str]) -> str:
    out = ["## Plots"]
    for kind, caption in PLOTS.items():
        files = images.get(kind) or []
        png = next((f for f in files if f.endswith(".png")), None)
        svg = next((f for f in files if f.endswith(".svg")), None)
        if png:
            out.append(f"**{caption}**" + (f" ([SVG]({svg}))" if svg else "") + f"\n\n![{caption}]({png})")
    if screenshot:
        out.append(f"**The inspector window at export**\n\n![kvinspect window]({screenshot})")
    if notes:
        out.append("\n".join(f"- {md_text(n)}" for n in notes))
    if len(out) == 1:
        out.append("No images in this bundle.")
    return "\n\n".join(out)


def _sec_images(record: TraceRecord) -> str:
    """Each image of a vision-language conversation at its last turn: its span, pixel hash and who still holds it."""
    last: dict[int, tuple[int, dict]] = {}
    for t in record.turns:
        for m in getattr(t, "media", None) or []:
            last[int(m.get("image", 0))] = (t.index, m)
    if not last:
        return ""
    kinds = [base_kind(k) for k in layer_kinds(record)]
    rows = []
    for image, (turn, m) in sorted(last.items()):
        held = m.get("held") or []
        by_kind: dict[str, list[int]] = {}
        for i, n in enumerate(held):
            by_kind.setdefault(kinds[i] if i < len(kinds) else "?", []).append(int(n))
        where = ", ".join(f"{k}: {min(v)}" + (f"–{max(v)}" if max(v) != min(v) else "") for k, v in by_kind.items())
        size = m.get("size")
        rows.append([str(image + 1), str(int(m.get("turn", 0)) + 1), f"{m.get('first')}–{m.get('last')}",
                     str(m.get("tokens")), md_code(f"#{m.get('hash', '')}"),
                     f"{size[0]}×{size[1]}" if isinstance(size, list) and len(size) == 2 else "–",
                     f"{where} rows (turn {turn + 1})"])
    return ("## Images\n\nEach image's span in the cache (positions of its image tokens) and how many of its rows each "
            "layer kind still held at its last turn; the hash is over the processed pixels.\n\n"
            + md_table(["Image", "Sent in turn", "Positions", "Tokens", "Pixel hash", "Size", "Rows held"], rows))


def _sec_layers(record: TraceRecord) -> str:
    if not record.turns:
        return ""
    out = ["## Layers at the end of each turn",
           "Consecutive layers with identical values share a row. Logical = bytes of the visible K/V rows; "
           "held = bytes of the storage those tensors keep alive."]
    for t in record.turns:
        summ = f"Turn {t.index + 1}: " + (count_noun(len(t.layers), "layer") if t.layers else "no cache object")
        if t.layers:
            seen = [v for lay in t.layers if (v := lay.get("seen")) is not None]
            stored = [v for lay in t.layers if (v := lay.get("stored")) is not None]
            if seen:
                summ += f", seen {min(seen)}–{max(seen)}" if min(seen) != max(seen) else f", seen {seen[0]}"
            if stored:
                summ += f", stored {min(stored)}–{max(stored)}" if min(stored) != max(stored) else f", stored {stored[0]}"
            summ += f", {fmt_bytes(t.kv_bytes) if isinstance(t.kv_bytes, (int, float)) else 'size unknown'}"
        out.append(f"<details{' open' if t.index == len(record.turns) - 1 else ''}><summary>{summ}</summary>\n\n"
                   f"{turn_layers_markdown(t)}\n\n</details>")
    return "\n\n".join(out)


def _sec_notes(record: TraceRecord) -> str:
    notes = list(record.notes)
    src = (record.header.get("notes") or {}).get("source_trace_notes")
    if src:
        notes += [f"(in the original trace) {n}" for n in src]
    body = "\n".join(f"- {md_text(n)}" for n in notes) if notes else "The trace was read completely; nothing was damaged."
    return "## Trace notes\n\n" + body


def _sec_files(files: Sequence[str]) -> str:
    what = {REPORT_NAME: "this report", SUMMARY_NAME: "the per-turn digest (stable JSON contract)",
            TRACE_NAME: "the full trace: JSON Lines, every forward pass × layer (format in kvinspect's "
                        "docs/trace-format.md)",
            SCRIPT_NAME: "the chat script the reproduce command runs", WINDOW_NAME: "the window at export"}
    rows = []
    for f in files:
        desc = what.get(f)
        if desc is None and f.endswith(".jinja"):
            desc = "the chat template the session used"
        elif desc is None and f.endswith((".png", ".svg")):
            desc = PLOTS.get(f.rsplit(".", 1)[0], "image")
        rows.append([code_span(f), desc or ""])
    return "## Files in this bundle\n\n" + md_table(["File", "What"], rows) if rows else ""
