"""The token view as text: one piece per token, runs of one state wrapped in markers (or coloured).

``kvinspect tokens`` prints it; ``report.md`` quotes a strip of it around each divergence and
duplicate. Plain text (a pipe, ``NO_COLOR``, Markdown) marks states with brackets, so a strip
reads the same in a terminal, a bug report or an email; colours are added only on a TTY.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kvinspect.core.text_safety import terminal_text
from kvinspect.core.tokens.states import (
    CROPPED,
    DUPLICATE,
    DUPLICATED,
    EVICTED,
    HELD,
    NOT_CACHED,
    PENDING,
    STATE_TEXT,
    WINDOWED_OUT,
    TokenView,
)

#: Plain markers: (open, close) per state; HELD is bare text.
MARKS = {
    HELD: ("", ""),
    WINDOWED_OUT: ("[", "]"),
    EVICTED: ("[-", "-]"),
    NOT_CACHED: ("(", ")"),
    CROPPED: ("~~", "~~"),
    PENDING: ("{", "}"),
}
DUP_MARKS = {DUPLICATED: ("«", "»"), DUPLICATE: ("«dup:", "»")}
#: ANSI SGR per state (256-colour backgrounds, readable with the terminal's own text colour).
ANSI = {
    HELD: "48;5;22",
    WINDOWED_OUT: "48;5;94",
    EVICTED: "48;5;238",
    NOT_CACHED: "48;5;52",
    CROPPED: "9;2",
    PENDING: "7",
}
ANSI_DUP = {DUPLICATED: "4", DUPLICATE: "4;48;5;90"}
VISIBLE = str.maketrans({" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"})


def display_piece(piece: str | None, tid: int) -> str:
    """A token's text with whitespace made visible; ``?`` for an id the observer could not see."""
    if tid < 0:
        return "?"
    if piece is None:
        return f"<{tid}>"
    if not piece:
        return "∅"
    # Whitespace as symbols, then every other control, C1, ESC and bidi character escaped (\x1b, \u202e): a
    # shared trace's pieces are data and never drive the terminal. Special tokens (<|im_start|>) read as they are.
    return terminal_text(piece.translate(VISIBLE))


def ranges(items: Iterable[int]) -> str:
    """``[0, 1, 2, 4]`` -> ``0–2, 4``."""
    xs = sorted(set(int(i) for i in items))
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}–{xs[j]}")
        i = j + 1
    return ", ".join(out)


def legend(color: bool = False) -> str:
    parts = []
    for st, text in STATE_TEXT.items():
        o, c = MARKS[st]
        sample = _sgr("abc", ANSI[st]) if color else f"{o}abc{c}"
        parts.append(f"{sample} {text}")
    if color:
        parts.append(f"{_sgr('abc', ANSI_DUP[DUPLICATED])} fed twice (first copy)")
        parts.append(f"{_sgr('abc', ANSI_DUP[DUPLICATE])} fed twice (the duplicate)")
    else:
        parts.append("«abc» fed twice (first copy)")
        parts.append("«dup:abc» fed twice (the duplicate)")
    parts.append("<<…>> a divergence, |tN| turn N begins")
    return "  ".join(parts)


def header_lines(view: TokenView, n_turns: int) -> list[str]:
    cached = view.cache_len
    lines = [f"step {view.step} · turn {view.turn + 1} of {n_turns} · {cached} positions in the cache · "
             f"{len(view)} tokens shown"]
    for b in view.bands:
        w = f" {b.window}" if b.window else ""
        span = f"positions {b.start}–{b.end - 1}" if b.end > b.start else "nothing"
        lines.append(f"  {b.kind}{w} ×{len(b.layers)} (layers {ranges(b.layers)}): holds {span}")
    if view.recurrent:
        lines.append(f"  recurrent state (layers {ranges(view.recurrent)}): summarises all {cached} tokens, "
                     "no positions")
    if view.note:
        lines.append(f"  note: {view.note}")
    return lines


def token_text(view: TokenView, lo: int = 0, hi: int | None = None, *, color: bool = False) -> str:
    """Cells ``lo``…``hi`` as one string: pieces, state markers (or colours), turn starts and labels."""
    hi = len(view) if hi is None else min(hi, len(view))
    lo = max(0, lo)
    out: list[str] = []
    open_key: tuple[int, int] | None = None
    prev_turn = int(view.turn_of[lo - 1]) if lo > 0 else None

    def close() -> None:
        if open_key is not None and not color:
            st, dup = open_key
            out.append(DUP_MARKS[dup][1] if dup else "")
            out.append(MARKS[st][1])

    skip = -1  # the last cell of an image drawn as one block
    for i in range(lo, hi):
        if i <= skip:
            continue
        st = int(view.state[i])
        fl = int(view.flags[i])
        dup = DUPLICATE if fl & DUPLICATE else DUPLICATED if fl & DUPLICATED else 0
        tu = int(view.turn_of[i])
        label = view.labels.get(i)
        boundary = tu != prev_turn and tu >= 0
        key = (st, dup)
        if key != open_key or label or boundary:
            close()
            open_key = None
        if boundary:
            out.append(f" |t{tu + 1}| ")
        if label:
            out.append(f" <<{terminal_text(label)}>> ")
        prev_turn = tu
        tid = int(view.ids[i])
        piece = display_piece(view.pieces.get(tid), tid)
        image = view.media.get(i)
        if image is not None:  # an image's span as one block: its tokens are all the same placeholder
            piece = f"[{image[1]}]"
            skip = i + image[0] - 1
        if color:
            sgr = ANSI[st] + (";" + ANSI_DUP[dup] if dup else "")
            out.append(_sgr(piece, sgr))
            open_key = key
            continue
        if open_key is None:
            out.append(MARKS[st][0])
            out.append(DUP_MARKS[dup][0] if dup else "")
            open_key = key
        out.append(piece)
    close()
    return "".join(out)


def strip(view: TokenView, cell: int, radius: int = 20) -> str:
    """About ``radius`` tokens on each side of ``cell``, plain (for report.md)."""
    lo, hi = max(0, cell - radius), min(len(view), cell + radius + 1)
    text = token_text(view, lo, hi).strip()
    return ("… " if lo > 0 else "") + text + (" …" if hi < len(view) else "")


def _sgr(text: str, code: str) -> str:
    return f"\x1b[{code}m{text}\x1b[0m"


STRIP_KINDS = ("prefix_divergence", "duplicate_context")
STRIP_LEGEND = ("`[…]` evicted from the sliding/chunked layers · `~~…~~` cropped · `«…»` fed twice "
                "(`«dup:…»` the duplicate) · `(…)` never cached · `<<…>>` divergence · `|tN|` turn N")


def event_strip(record, event, radius: int = 20) -> str | None:
    """The tokens around a divergence or duplicate event at its step, plain; None without ids."""
    from kvinspect.core.tokens.states import token_view

    if event.kind not in STRIP_KINDS:
        return None
    view = token_view(record, event.step)
    if not len(view):
        return None
    cell: int | None = None
    if event.kind == "duplicate_context":
        dup = np.flatnonzero(view.flags & DUPLICATE)
        cell = int(dup[0]) if len(dup) else None
    else:
        labelled = [c for c, text in view.labels.items() if text.startswith("diverged")]
        if labelled:
            cell = labelled[0]
        elif isinstance((event.data or {}).get("position"), int):
            cell = view.cell_at(int(event.data["position"]))
    if cell is None:
        return None
    return strip(view, cell, radius)
