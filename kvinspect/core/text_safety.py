"""Untrusted text made inert for where it goes: a terminal or Markdown (docs/errors.md, "Hostile text").

Text from a trace or a model is data. A shared trace can hold a terminal escape that sets the
title, clears the screen or writes the clipboard (OSC 52), C1 controls, NULs, bidi overrides
that show text in another order than it is stored, and Markdown or HTML that a bug report would
render as images, links or headings. Every place that prints such text to a terminal goes through
:func:`terminal_text`; every field ``report.md`` or ``compare.md`` takes from a trace or a model
goes through :func:`md_text` (prose and table cells), :func:`md_code` (inline code) or
:func:`md_block` (the inside of a fenced block). The window escapes its own HTML with
:func:`html.escape` (Qt rich text), and relays engine output to its terminal through
:func:`terminal_text` too.

Escapes are visible and unambiguous (``\\x1b``, ``\\u202e``), so a reader sees that the text held
a control and which one, and nothing is dropped silently.
"""

from __future__ import annotations

import re

# Cc (C0, DEL, C1), every Cf (format: bidi embeddings, overrides, isolates and marks, zero-width
# space, word joiner, BOM, invisible operators, tag characters that can smuggle hidden ASCII), the
# line and paragraph separators, and lone surrogates. ZWNJ/ZWJ (U+200C/D) stay: scripts and emoji
# sequences need them and they reorder nothing. The Cf list is Unicode 15's.
_UNSAFE = (
    "\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b\u200e\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_KEEP_CACHE: dict[str, re.Pattern] = {}


def escape_char(ch: str) -> str:
    """``\\x1b``, ``\\u202e``, ``\\U000e0041``: the code point, spelled in ASCII."""
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    if n < 0x10000:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def _pattern(keep: str) -> re.Pattern:
    pat = _KEEP_CACHE.get(keep)
    if pat is None:
        if keep:
            pat = re.compile(f"(?![{re.escape(keep)}])[{_UNSAFE}]")
        else:
            pat = _UNSAFE_RE
        _KEEP_CACHE[keep] = pat
    return pat


def terminal_text(text: object, keep: str = "") -> str:
    """``text`` with every control, format and bidi character shown escaped; safe to write to a terminal.

    ``keep`` names characters to leave as they are (``"\\n\\t"`` for multi-line output). ESC and CSI
    are escaped, so no escape sequence survives; what followed them is printed as plain text.
    """
    s = text if isinstance(text, str) else str(text)
    pat = _pattern(keep)
    if pat.search(s) is None:
        return s
    return pat.sub(lambda m: escape_char(m.group()), s)


def is_terminal_safe(text: str, keep: str = "") -> bool:
    """True when :func:`terminal_text` would leave ``text`` unchanged."""
    return _pattern(keep).search(text) is None


def utf8_safe(text: str) -> str:
    """``text`` with lone surrogates escaped, so it encodes as UTF-8 (a pipe, a file, JSON for the wire)."""
    if not _SURROGATE_RE.search(text):
        return text
    return _SURROGATE_RE.sub(lambda m: escape_char(m.group()), text)


_SURROGATE_RE = re.compile("[\ud800-\udfff]")
#: A lone surrogate (a str that cannot be UTF-8), for the checks that refuse one.
LONE_SURROGATE = _SURROGATE_RE


def json_dumps_utf8(obj, **kwargs) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` that can always be written as UTF-8.

    A lone surrogate (a trace's ``"\\ud800"``) becomes its JSON escape, so the file reads back as the
    same string instead of failing to write (``summary.json``, ``script.json``, ``compare.json``).
    """
    import json

    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    if _SURROGATE_RE.search(text) is None:
        return text
    return _SURROGATE_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# -- Markdown ----------------------------------------------------------------------------------------

class Markdown(str):
    """A string that is already Markdown, built by kvinspect from escaped parts: written as it is.

    :func:`~kvinspect.core.report.text_table.md_cell` passes it through (escaping only what a table
    needs), and escapes every plain ``str``.
    """


#: Characters with a Markdown or HTML meaning anywhere in a line. ``<``, ``>``, ``&`` and ``|`` become
#: entities (no tag, entity or table cell survives, in a table or out), the rest a backslash escape.
_MD_ENTITY = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "|": "&#124;"}
#: ``_`` only at a word's edge (``snake_case`` never emphasises); parentheses mean nothing once ``]`` is escaped.
_MD_INLINE_RE = re.compile(r"[\\`*\[\]!#~$<>&|@]|(?<!\w)_|_(?!\w)|://|(?<![\w.])www\.|\n")
#: What starts a block at the beginning of a line: lists, numbered lists, setext rules, indented code.
_MD_LINE_START_RE = re.compile(r"^(?:[-+](?=[\s\-]|$)|\d{1,9}(?=[.)](?:\s|$)))")


def _md_inline(m: re.Match) -> str:
    s = m.group()
    if s == "\n":
        return "<br>"
    if s == "://":
        return "\\://"
    if s == "www.":
        return "www\\."
    return _MD_ENTITY.get(s) or "\\" + s


def md_text(text: object) -> Markdown:
    """``text`` as inert Markdown inline text: it renders as exactly these characters.

    HTML tags, entities, links, images, autolinks (``<…>``, ``http://…``, ``www.…``), emphasis,
    code spans, strikethrough, math, footnotes, mentions and table pipes are escaped; a newline
    becomes ``<br>``, so the text never starts a block (no heading, list, quote or fence), and a
    list or heading marker at its start is escaped too. Controls are shown escaped as in a terminal.
    """
    s = text if isinstance(text, str) else str(text)
    s = terminal_text(s.replace("\r\n", "\n"), keep="\n")
    s = _MD_INLINE_RE.sub(_md_inline, s)
    lead = len(s) - len(s.lstrip(" "))
    if lead:  # four spaces would start an indented code block in some contexts; one is enough to read
        s = "&#32;" * min(lead, 1) + s[lead:]
    m = _MD_LINE_START_RE.match(s)
    if m:
        s = m.group() + "\\" + s[m.end():] if m.group()[0].isdigit() else "\\" + s
    return Markdown(s)


def md_code(text: object) -> Markdown:
    """``text`` as an inline code span (rendered verbatim): backticks inside cannot close it.

    A newline becomes ``↵`` (a code span cannot hold one); controls are escaped. In a table cell,
    :func:`~kvinspect.core.report.text_table.md_cell` escapes its ``|``.
    """
    s = text if isinstance(text, str) else str(text)
    s = terminal_text(s.replace("\r\n", "\n").replace("\n", "↵"))
    run = longest = 0
    for ch in s:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ") and s.strip()) else ""
    return Markdown(f"{fence}{pad}{s}{pad}{fence}")


def md_block(text: object) -> str:
    """The inside of a fenced code block: controls escaped, newlines and tabs kept (the fence is the caller's)."""
    s = text if isinstance(text, str) else str(text)
    return terminal_text(s.replace("\r\n", "\n"), keep="\n\t")
