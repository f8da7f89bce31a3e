"""The project's two table writers: Markdown pipe tables (reports, compare.md, clipboard
snippets) and aligned plain-text tables (the terminal). Every table goes through one of them.

Columns are aligned by index: ``right`` (numbers) and ``left`` are sets of column indexes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from kvinspect.core.text_safety import Markdown, md_text


def md_cell(v) -> str:
    """One Markdown table cell, None as an en dash.

    Plain text (a value from a trace or a model) is made inert by :func:`~kvinspect.core.text_safety.md_text`;
    :class:`~kvinspect.core.text_safety.Markdown` built by kvinspect (code spans, bold names) keeps its
    markup, with its ``|`` escaped for the table and newlines as ``<br>``.
    """
    if v is None or v == "":
        return "–"
    if isinstance(v, Markdown):
        return v.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")
    return md_text(v)


def md_table(header: Sequence, rows: Iterable[Sequence], right: Collection[int] = frozenset(), *,
             left: Collection[int] = frozenset(), cell: Callable[[object], str] = md_cell,
             padded_rule: bool = False) -> str:
    """A GitHub pipe table, one line per row.

    Parameters
    ----------
    header, rows
        Cell values; each goes through ``cell`` (header included).
    right, left
        Column indexes aligned right (``---:``) or explicitly left (``:---``); others are ``---``.
    cell
        Formats one cell (escaping); :func:`md_cell` by default.
    padded_rule
        ``| --- | ---: |`` rather than ``|---|---:|`` for the rule under the header.
    """
    rule = ["---:" if i in right else ":---" if i in left else "---" for i in range(len(header))]
    out = ["| " + " | ".join(cell(h) for h in header) + " |",
           "| " + " | ".join(rule) + " |" if padded_rule else "|" + "|".join(rule) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]], left: Collection[int] = (0,), *,
               rule: str | None = "-", gap: str = "  ") -> str:
    """Columns padded to their widest cell, for a terminal: right-aligned but for ``left``.

    ``rule`` draws a line of that character under the header (None: none). Lines carry no
    trailing blanks, so a left-aligned last column may be as wide as it likes.
    """
    rows = [[str(v) for v in r] for r in rows]
    header = [str(h) for h in header]
    widths = [max([len(h)] + [len(r[i]) for r in rows if i < len(r)]) for i, h in enumerate(header)]

    def line(values) -> str:
        return gap.join(v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [line(header)]
    if rule:
        out.append(gap.join(rule * w for w in widths))
    out += [line(r) for r in rows]
    return "\n".join(out)
