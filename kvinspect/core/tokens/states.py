"""Where each token of the conversation stands in the cache at one step: the token view's model.

Built from the record alone: the turns' recorded ids (:mod:`.ids`), the per-step ``seen``,
``stored``, ``q_len``, ``cache_id`` and ``use_cache`` series and the layers' kinds. The cache's
content is replayed turn by turn (a handful of numpy concatenations per turn): what the cache
held before the turn's first forward (``seen − q_len``) is kept, anything past it was cropped,
the prefill's ``q_len`` ids and the decode steps' ids follow. A layer of the step holds cache
positions ``[seen − stored, seen)``; how many layers hold each position is one difference array
over the layers, so the cost is O(tokens + layers), never tokens × layers in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvinspect.core.cache.layer_kinds import STATE, base_kind, layer_kinds, layer_windows
from kvinspect.core.tokens.ids import UNKNOWN, common_prefix, iter_turn_sequences, pieces_of

# -- states (one per cell) -----------------------------------------------------------------------
HELD = 0  # every layer with a token axis holds it
WINDOWED_OUT = 1  # evicted from the sliding/chunked layers, still held by the others (full)
EVICTED = 2  # no layer holds it any more (every layer is windowed)
NOT_CACHED = 3  # fed without a cache (nocache, or a cache fed with use_cache=False)
CROPPED = 4  # cropped away at a divergence: no longer in the cache, replaced by what follows
PENDING = 5  # generated at this step, not fed back yet (generate() never feeds its last token)
STATE_NAMES = ("held", "windowed_out", "evicted", "not_cached", "cropped", "pending")
STATE_TEXT = {
    HELD: "held by every layer",
    WINDOWED_OUT: "evicted from the sliding/chunked layers, held by the full ones",
    EVICTED: "evicted from every layer",
    NOT_CACHED: "never cached",
    CROPPED: "cropped away at a divergence",
    PENDING: "generated, not fed back yet",
}

# -- flags (bits, several per cell) -----------------------------------------------------------
GENERATED = 1  # a reply token
DUPLICATE = 2  # the second copy of context the cache already held (duplicate_context)
DUPLICATED = 4  # the first copy of that context
REPLACEMENT = 8  # fed where cropped tokens were

NOT_RECORDED = ("token ids were not recorded in this trace (written before kvinspect kept them, "
                "or redacted)")


@dataclass(frozen=True)
class Band:
    """Layers of one kind and window holding the same span of cache positions ``[start, end)``."""

    kind: str
    window: int | None
    layers: tuple[int, ...]
    start: int
    end: int


@dataclass
class TokenView:
    """The cells of the view at ``step``: cache positions in order, cropped cells where they were cut."""

    step: int
    turn: int
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # cache position (cropped: the old one)
    turn_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    state: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    flags: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    pieces: dict[int, str] = field(default_factory=dict)
    bands: list[Band] = field(default_factory=list)
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per layer; -1 no token axis
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    kinds: list[str] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)  # cell -> label drawn before it (a divergence)
    media: dict[int, tuple[int, str]] = field(default_factory=dict)  # an image's first cell -> (cells, its label)
    recurrent: list[int] = field(default_factory=list)  # layers holding a recurrent state
    note: str = ""  # why there are no cells, or what is only partly known

    def __len__(self) -> int:
        return len(self.ids)

    def layers_holding(self, cell: int) -> list[int]:
        """Layers whose K/V rows include this cell's position (none for cropped, uncached, pending)."""
        if not 0 <= cell < len(self) or self.state[cell] in (NOT_CACHED, CROPPED, PENDING):
            return []
        p = int(self.pos[cell])
        return [int(i) for i in np.flatnonzero((self.starts >= 0) & (self.starts <= p) & (p < self.ends))]

    def cell_at(self, position: int) -> int | None:
        """The (non-cropped) cell at a cache position."""
        live = np.flatnonzero((self.pos == position) & (self.state != CROPPED))
        return int(live[0]) if len(live) else None

    @property
    def cache_len(self) -> int:
        """Positions the cache has at this step (the layers' ``seen``), known even without ids."""
        return int(self.ends.max()) if len(self.ends) and self.ends.max() > 0 else 0

    def counts(self) -> dict[str, int]:
        bc = np.bincount(self.state, minlength=len(STATE_NAMES)) if len(self) else np.zeros(len(STATE_NAMES), int)
        return {name: int(bc[i]) for i, name in enumerate(STATE_NAMES)}


def _turn_span(turn_col: np.ndarray, u: int) -> tuple[int, int]:
    return int(np.searchsorted(turn_col, u, "left")), int(np.searchsorted(turn_col, u, "right"))


def token_view(record, step: int | None = None) -> TokenView:
    """The token view of ``record`` at ``step`` (None: the last step)."""
    with record.lock:
        n = record.n_steps
        if not n:
            return TokenView(0, 0, note="no forward pass yet")
        step = n - 1 if step is None else max(0, min(int(step), n - 1))
        turn_col = record.turn[:n]
        t = int(turn_col[step])
        turns = list(record.turns)
        seen = record.seen[step].astype(np.int64)
        stored = record.stored[step].astype(np.int64)
        q_len = record.q_len[:n]
        cache_col = record.cache_id[:n]
        use_col = record.use_cache[:n]
        events = list(record.events)
        seen_at = {}  # first step of each replayed turn -> its seen row (before = seen - q_len)
        for u in range(min(t + 1, len(turns))):
            s0, _ = _turn_span(turn_col, u)
            if s0 < n and int(turn_col[s0]) == u:
                seen_at[u] = record.seen[s0].astype(np.int64)
    view = TokenView(step, t, pieces=pieces_of(turns[: t + 1]))
    if t >= len(turns):
        view.note = "this turn has not started in the record yet"
        return view
    recorded = [isinstance(getattr(x, "ids", None), dict) for x in turns[: t + 1]]
    if not recorded[t] and turns[t].status == "running" and t > 0 and recorded[t - 1]:
        # A live turn's ids come with its closing line: until then, the view at the previous turn's end.
        first = int(np.searchsorted(turn_col, t, "left"))
        if first > 0:
            prev = token_view(record, first - 1)
            prev.note = f"turn {t + 1} is running: its tokens show when it ends (the view is at step {first - 1})"
            return prev
    if not recorded[t]:
        view.note = (NOT_RECORDED if not any(recorded)
                     else f"turn {t + 1}'s ids arrive when it ends" if turns[t].status == "running"
                     else f"token ids of turn {t + 1} were not recorded")
        _layers(view, record, seen, stored, t)
        return view

    # The cache's content as cells: ids, turn, flags, state, position; cropped cells stay inline.
    ids = np.zeros(0, np.int64)
    tof = np.zeros(0, np.int32)
    flags = np.zeros(0, np.uint8)
    state = np.zeros(0, np.uint8)
    oldpos = np.zeros(0, np.int64)
    labels: dict[int, str] = {}
    prev_cid = 0
    for u, seq in zip(range(t + 1), iter_turn_sequences(turns[: t + 1])):
        if u not in seen_at:
            continue  # no forward pass in this turn (it failed first)
        s0, s1 = _turn_span(turn_col, u)
        last = step if u == t else s1 - 1
        if seq is None and u == t:
            view.note = f"token ids of turn {t + 1} could not be rebuilt (an earlier turn's are missing)"
            _layers(view, record, seen, stored, t)
            return view
        if seq is None:  # an earlier turn without ids: its cache content is unknown
            ids, tof, flags, state, oldpos, labels = (ids[:0], tof[:0], flags[:0], state[:0], oldpos[:0], {})
            prev_cid = int(cache_col[s1 - 1])
            continue
        prompt, gen = seq
        cid, uc = int(cache_col[s0]), int(use_col[s0])
        if not cid or uc == 0:
            # No cache (or one fed with use_cache=False): every forward re-reads the whole sequence.
            k = min(last - s0 + 1, len(gen))
            ids = np.concatenate([prompt, gen[:k]])
            tof = np.full(len(ids), u, np.int32)
            flags = np.zeros(len(ids), np.uint8)
            flags[len(prompt):] = GENERATED
            state = np.full(len(ids), NOT_CACHED, np.uint8)
            oldpos = np.arange(len(ids), dtype=np.int64)
            labels = {}
            prev_cid = 0
            if u == t:
                view.note = ("no cache: every forward pass re-reads the whole sequence" if not cid else
                             "a cache fed with use_cache=False: no token list describes what it holds")
            continue
        if cid != prev_cid:  # another cache object: what the old one held is not in this one
            ids, tof, flags, state, oldpos, labels = (ids[:0], tof[:0], flags[:0], state[:0], oldpos[:0], {})
        row = seen_at[u]
        valid = row[row >= 0]
        q = int(q_len[s0])
        before = int(valid.max()) - q if len(valid) else int(turns[u].reused_tokens)
        live = np.flatnonzero(state != CROPPED)
        held = len(live)
        cropped = 0
        if before < held:
            # Cropped cells stay inline, struck through; what the turn feeds follows them.
            cropped = held - max(before, 0)
            sel = live[max(before, 0):]
            state[sel] = CROPPED
            oldpos[sel] = np.arange(max(before, 0), held)
        elif before > held:  # filled before anything recorded it
            pad = before - held
            ids = np.concatenate([ids, np.full(pad, UNKNOWN, np.int64)])
            tof = np.concatenate([tof, np.full(pad, -1, np.int32)])
            flags = np.concatenate([flags, np.zeros(pad, np.uint8)])
            state = np.concatenate([state, np.zeros(pad, np.uint8)])
            oldpos = np.concatenate([oldpos, np.zeros(pad, np.int64)])
        fed = prompt[max(len(prompt) - q, 0):]
        fed_flags = np.zeros(len(fed), np.uint8)
        if cropped:
            fed_flags[: min(cropped, len(fed))] |= REPLACEMENT
        turn_events = [e for e in events if e.turn == u]
        div = next((e for e in turn_events if e.kind == "prefix_divergence"), None)
        start_cell = len(ids)
        if cropped or div is not None:
            at = (div.data or {}).get("position", before) if div is not None else before
            cause = (div.data or {}).get("cause") if div is not None else None
            where = start_cell
            if not cropped and isinstance(at, int) and 0 <= at < before:
                # Not cropped (generate() sliced the prompt by length): the stale tokens stay in the
                # cache from that position on, and the label goes where they begin.
                where = int(np.flatnonzero(state != CROPPED)[at])
            text = f"diverged at position {at}" + (f" ({cause})" if cause else "")
            labels[where] = f"{labels[where]}; turn {u + 1} too" if where in labels else text
        if any(e.kind == "duplicate_context" for e in turn_events) and before > 0:
            dup = next(e for e in turn_events if e.kind == "duplicate_context")
            live = np.flatnonzero(state != CROPPED)
            m = int((dup.data or {}).get("count") or 0) or common_prefix(ids[live], fed)
            m = min(m, len(live), len(fed))
            flags[live[:m]] |= DUPLICATED
            fed_flags[:m] |= DUPLICATE
            if m:
                dup_label = f"fed twice: repeats positions 0–{m - 1}"
                labels[start_cell] = f"{labels[start_cell]}; {dup_label}" if start_cell in labels else dup_label
        k = int(q_len[s0 + 1: last + 1].sum()) if last > s0 else 0
        k = min(k, len(gen))
        add = np.concatenate([fed, gen[:k]])
        add_flags = np.concatenate([fed_flags, np.full(k, GENERATED, np.uint8)])
        ids = np.concatenate([ids, add])
        tof = np.concatenate([tof, np.full(len(add), u, np.int32)])
        flags = np.concatenate([flags, add_flags])
        state = np.concatenate([state, np.zeros(len(add), np.uint8)])
        oldpos = np.concatenate([oldpos, np.zeros(len(add), np.int64)])
        if u == t and k < len(gen):
            ids = np.concatenate([ids, gen[k:k + 1]])
            tof = np.concatenate([tof, np.array([u], np.int32)])
            flags = np.concatenate([flags, np.array([GENERATED], np.uint8)])
            state = np.concatenate([state, np.array([PENDING], np.uint8)])
            oldpos = np.concatenate([oldpos, np.zeros(1, np.int64)])
        prev_cid = int(cache_col[s1 - 1])

    view.ids, view.turn_of, view.flags, view.labels = ids, tof, flags, labels
    _layers(view, record, seen, stored, t)
    cached = (state != CROPPED) & (state != NOT_CACHED)
    pos = oldpos.copy()
    idx = np.flatnonzero(cached)
    pos[idx] = np.arange(len(idx))
    positional = idx[state[idx] != PENDING]
    # How many token layers hold each position: +1 at each layer's start, -1 at its end.
    tok = view.starts >= 0
    n_tok = int(tok.sum())
    if n_tok and len(positional):
        npos = len(positional)
        diff = np.zeros(npos + 1, np.int64)
        np.add.at(diff, np.clip(view.starts[tok], 0, npos), 1)
        np.add.at(diff, np.clip(view.ends[tok], 0, npos), -1)
        count = np.cumsum(diff)[:npos]
        state[positional] = np.where(count >= n_tok, HELD, np.where(count > 0, WINDOWED_OUT, EVICTED))
    view.pos, view.state = pos, state
    view.media = _media_cells(view, getattr(turns[t], "media", None) or [])
    if turns[t].status == "running":
        view.note = f"turn {t + 1} is running: its ids arrive when it ends"
    return view


def _media_cells(view: TokenView, media: list[dict]) -> dict[int, tuple[int, str]]:
    """Each image of the turn whose whole span is in the view: its first cell, its cell count and label."""
    out = {}
    for m in media:
        cell = view.cell_at(int(m["first"]))
        n = int(m["tokens"])
        if cell is None or cell + n > len(view) or int(view.pos[cell + n - 1]) != int(m["last"]):
            continue
        out[cell] = (n, f"image {n} tok #{str(m.get('hash', ''))[:4]}")
    return out


def _layers(view: TokenView, record, seen: np.ndarray, stored: np.ndarray, t: int) -> None:
    kinds = [base_kind(k) for k in layer_kinds(record, t)]
    windows = layer_windows(record, t)
    # A state layer has no token axis: a recurrent state summarises every token it saw.
    recurrent = np.array([k == STATE for k in kinds], bool)
    # A recurrent state has no positions, whatever counts it reports: it is summarised, not banded.
    has_axis = (seen >= 0) & (stored >= 0) & ~recurrent
    view.kinds = kinds
    view.starts = np.where(has_axis, seen - stored, -1)
    view.ends = np.where(has_axis, seen, -1)
    view.recurrent = [i for i, k in enumerate(kinds) if k == STATE]
    groups: dict[tuple, list[int]] = {}
    for i in np.flatnonzero(has_axis):
        key = (kinds[i], windows[i], int(view.starts[i]), int(view.ends[i]))
        groups.setdefault(key, []).append(int(i))
    view.bands = [Band(k, w, tuple(ls), s, e) for (k, w, s, e), ls in groups.items()]
    view.bands.sort(key=lambda b: (b.kind != "full", b.kind, b.window or 0, b.layers))
