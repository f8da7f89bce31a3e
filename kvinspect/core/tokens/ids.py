"""The token ids a turn fed the cache, as the trace keeps them (the turn line's ``ids`` field).

A turn's prompt usually repeats the previous turn's prompt and most of its reply, so it is
stored as a reference to that turn's sequence (``base_turn``, ``base_len``: the first
``base_len`` ids of turn ``base_turn``'s prompt + generated ids) plus the ids after it. A
2-turn chat then costs its new tokens once, and a 100-turn one stays linear. ``pieces`` maps
each id first seen in this turn to its decoded text, so a trace shows its tokens without the
tokenizer (the viewer and ``kvinspect tokens`` never load a model). ``-1`` is an id the
observer could not see (``inputs_embeds``, a cache filled before observation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

UNKNOWN = -1
#: Keys of the turn line's ``ids`` object.
IDS_KEYS = ("base_turn", "base_len", "prompt", "generated", "pieces")


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the common prefix of two id sequences (numpy; no per-token Python loop)."""
    n = min(len(a), len(b))
    if not n:
        return 0
    diff = np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64)
    hit = np.flatnonzero(diff)
    return int(hit[0]) if len(hit) else n


def pack_ids(prompt: Sequence[int], generated: Sequence[int], *, prev: tuple[int, Sequence[int]] | None,
             known: set[int], decode: Callable[[list[int]], str] | None) -> dict:
    """The ``ids`` object of one turn. ``prev``: (index, prompt + generated ids) of the turn before.

    ``known``: ids whose piece an earlier turn already wrote; updated in place.
    """
    prompt = [int(i) for i in prompt]
    generated = [int(i) for i in generated]
    base_turn, base_len = -1, 0
    if prev is not None:
        base_len = common_prefix(prev[1], prompt)
        base_turn = prev[0] if base_len else -1
    pieces: dict[str, str] = {}
    if decode is not None:
        for i in sorted(set(prompt[base_len:]) | set(generated)):
            if i == UNKNOWN or i in known:
                continue
            try:
                pieces[str(i)] = decode([i])
            except Exception:  # noqa: BLE001 - a piece that does not decode is shown as its id
                continue
            known.add(i)
    return {"base_turn": base_turn, "base_len": base_len, "prompt": prompt[base_len:], "generated": generated,
            "pieces": pieces}


def iter_turn_sequences(turns: Sequence) -> Iterator[tuple[np.ndarray, np.ndarray] | None]:
    """Per turn, (prompt ids, generated ids) rebuilt from the ``ids`` fields; None where not recorded.

    A turn whose base turn is missing (a v1 trace, a lost line, a redacted copy) is None too. Only
    the previous turn's sequence is kept while iterating: every prompt holds the whole conversation,
    so keeping them all would grow with the square of its length.
    """
    last: tuple[int, np.ndarray] | None = None  # (index, prompt + generated) of the turn before
    for i, t in enumerate(turns):
        seq = _one(t)
        if seq is not None:
            base_turn, base_len, rest, gen = seq
            if base_turn >= 0 and base_len:
                base: np.ndarray | None
                if last is not None and last[0] == base_turn:
                    base = last[1]
                elif 0 <= base_turn < i:  # not the turn before (a writer may skip one): rebuild it
                    old = list(iter_turn_sequences(turns[: base_turn + 1]))[base_turn]
                    base = np.concatenate(old) if old is not None else None
                else:
                    base = None
                if base is None or len(base) < base_len:
                    seq = None
                else:
                    rest = np.concatenate([base[:base_len], rest])
            if seq is not None:
                yield rest, gen
                last = (i, np.concatenate([rest, gen]))
                continue
        yield None
        last = None


def turn_sequences(turns: Sequence) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """:func:`iter_turn_sequences` as a list (small traces, tests)."""
    return list(iter_turn_sequences(turns))


def _one(t) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    ids = getattr(t, "ids", None)
    if not isinstance(ids, dict):
        return None
    try:
        rest = np.asarray(ids.get("prompt") or [], dtype=np.int64).reshape(-1)
        gen = np.asarray(ids.get("generated") or [], dtype=np.int64).reshape(-1)
        return int(ids.get("base_turn", -1)), int(ids.get("base_len", 0)), rest, gen
    except (TypeError, ValueError, OverflowError):
        return None


def pieces_of(turns: Sequence) -> dict[int, str]:
    """Every decoded piece the turns recorded, id -> text."""
    out: dict[int, str] = {}
    for t in turns:
        ids = getattr(t, "ids", None)
        if isinstance(ids, dict) and isinstance(ids.get("pieces"), dict):
            for k, v in ids["pieces"].items():
                try:
                    out[int(k)] = str(v)
                except (TypeError, ValueError):
                    continue
    return out
