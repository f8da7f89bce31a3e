"""The in-memory trace: per-step, per-layer series in doubling numpy arrays, plus turns and events.

One :class:`TraceRecord` feeds everything: the CLI's table, ``summary.json``, the trace
file, the GUI's plots and the replay slider. Appending a step is O(layers) and allocation
free except when a buffer doubles. Readers take views (``record.seen``) sized to the data.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvinspect.core.detect.events import Event

STEP_SCALARS = {  # name -> dtype; one value per forward pass
    "turn": np.int32,
    "t": np.float64,  # seconds since the record started
    "cache_id": np.int32,  # 0: no cache object
    "q_len": np.int32,
    "use_cache": np.int8,  # -1 unknown, 0 False, 1 True
    "rss": np.int64,
    "accel_allocated": np.int64,
    "accel_reserved": np.int64,
}
STEP_LAYER = {  # name -> dtype; one value per layer per forward pass
    "seen": np.int32,
    "stored": np.int32,
    "dev": np.int8,  # index into record.devices, -1 none
    "nbytes": np.int64,
}
#: Turns whose prompt token ids stay in memory (:meth:`TraceRecord.add_turn`).
KEEP_PROMPT_IDS = 8
_APPEND_ORDER = ("turn", "t", "cache_id", "q_len", "use_cache", "rss", "accel_allocated", "accel_reserved",
                 "seen", "stored", "dev", "nbytes")
assert set(_APPEND_ORDER) == set(STEP_SCALARS) | set(STEP_LAYER)


@dataclass
class TurnRecord:
    """One user turn and what the cache did during it. Field names follow summary.json."""

    index: int
    user: str = ""
    policy: str = "reuse"
    cache_impl: str = "dynamic"
    status: str = "running"  # running | ok | stopped | failed | interrupted
    error: str = ""
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_tokens: int = 0
    new_tokens: int = 0
    ttft_s: float | None = None
    total_s: float = 0.0
    tokens_per_s: float | None = None
    reply: str = ""
    cache_id: int = 0
    cache_class: str = ""
    first_step: int = 0
    end_step: int = 0  # exclusive
    peak_accel_bytes: int = 0
    peak_rss: int = 0
    kv_bytes: int = 0
    kv_held_bytes: int = 0
    kv_bytes_by_device: dict[str, int] = field(default_factory=dict)
    layers: list[dict] = field(default_factory=list)
    checklist: list[dict] = field(default_factory=list)
    divergence_at: int | None = None
    cropped_from: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] | None = None  # kept in memory for detectors; not written to summaries
    ids: dict | None = None  # the ids fed, in the trace's turn line (core/tokens/ids.py); None: not recorded
    media: list[dict] = field(default_factory=list)  # the prompt's images: spans, hashes, rows held per layer
    vision_calls: int = 0  # times the vision tower ran during the turn

    def to_dict(self, with_ids: bool = False) -> dict:
        d = asdict(self)
        if not with_ids:
            d.pop("prompt_ids", None)
        return d

    def rejected_drafts(self) -> list[tuple[int, int]]:
        """(global step, tokens cropped) for each verification forward whose rejected drafts generate()
        cropped off the cache afterwards (assisted and prompt-lookup decoding; ``settings.draft.crops``).

        Read defensively: a trace from elsewhere may carry anything there."""
        draft = self.settings.get("draft") if isinstance(self.settings, dict) else None
        crops = draft.get("crops") if isinstance(draft, dict) else None
        out = []
        for c in crops if isinstance(crops, list) else ():
            if (isinstance(c, list | tuple) and len(c) == 2 and all(type(v) is int for v in c)
                    and c[0] >= 0 and c[1] > 0):
                out.append((c[0], c[1]))
        return out

    @classmethod
    def from_dict(cls, d: dict) -> TurnRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


class _Grow:
    """A numpy buffer that doubles; ``view`` is the filled part."""

    __slots__ = ("buf", "n")

    def __init__(self, dtype, width: int | None, cap: int = 256):
        shape = (cap,) if width is None else (cap, width)
        self.buf = np.zeros(shape, dtype=dtype)
        self.n = 0

    def reserve(self, n: int) -> None:
        if n > len(self.buf):
            cap = max(n, 2 * len(self.buf))
            new = np.zeros((cap,) + self.buf.shape[1:], dtype=self.buf.dtype)
            new[: self.n] = self.buf[: self.n]
            self.buf = new

    @property
    def view(self) -> np.ndarray:
        return self.buf[: self.n]


class TraceRecord:
    """Steps, turns and events of one session. Thread-safe for one writer + readers."""

    def __init__(self, n_layers: int, header: dict | None = None):
        self.n_layers = int(n_layers)
        self.header: dict = dict(header or {})
        self.devices: list[str] = []
        self.turns: list[TurnRecord] = []
        self.events: list[Event] = []
        self.lock = threading.RLock()
        self._cols = {k: _Grow(dt, None) for k, dt in STEP_SCALARS.items()}
        self._cols.update({k: _Grow(dt, self.n_layers) for k, dt in STEP_LAYER.items()})
        self._order = [self._cols[k] for k in _APPEND_ORDER]
        self.version = 0  # bumps on every change: the GUI repaints when it moved
        self.t0: float | None = None
        self.notes: list[str] = []  # what a reader could not recover, for the UI

    # -- sizes & views --------------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        return self._cols["turn"].n

    def col(self, name: str) -> np.ndarray:
        return self._cols[name].view

    def __getattr__(self, name: str):
        cols = self.__dict__.get("_cols")
        if cols is not None and name in cols:
            return cols[name].view
        raise AttributeError(name)

    # -- appending ------------------------------------------------------------------------
    def append_step(self, *, turn: int, t: float, cache_id: int, q_len: int, use_cache: bool | None,
                    seen, stored, dev, nbytes, rss: int = 0, accel_allocated: int = 0,
                    accel_reserved: int = 0) -> int:
        with self.lock:
            c = self._cols
            i = c["turn"].n
            if i >= len(c["turn"].buf):  # every column grows together (this runs once per forward)
                for g in c.values():
                    g.reserve(i + 1)
            if self.t0 is None:
                self.t0 = t
            row = (turn, t - self.t0, cache_id, q_len, -1 if use_cache is None else int(bool(use_cache)),
                   rss, accel_allocated, accel_reserved, seen, stored, dev, nbytes)
            order = self._order
            for g, v in zip(order, row):
                g.buf[i] = v
            for g in order:  # lengths last: a lock-free reader never sees a half-written row
                g.n = i + 1
            self.version += 1
            return i

    def append_steps(self, t, cols: dict[str, Any], parts: Iterable[tuple] = ()) -> None:
        """Append live forwards in one block: ``t`` in ``perf_counter`` seconds, ``cols`` other columns
        (sequences, arrays or one value each), ``parts`` per-layer values for some rows and layers.

        A part is ``(first, end, layers, (seen, stored, dev, nbytes))``: rows ``first:end`` of the block and
        ``layers`` (a slice or an index array of the layer axis) take one number per row from each value,
        or, where ``end`` is None, row ``first`` takes the values as they are
        (:func:`kvinspect.core.cache.observer.block`). The turn pipeline calls this every few forwards
        rather than once per forward (see docs/probe.md).
        """
        k = len(t)
        if not k:
            return
        with self.lock:
            c = self._cols
            i = c["turn"].n
            if i + k > len(c["turn"].buf):  # every column grows together
                for g in c.values():
                    g.reserve(i + k)
            if self.t0 is None:
                self.t0 = float(t[0])
            t0 = self.t0
            c["t"].buf[i : i + k] = t - t0 if isinstance(t, np.ndarray) else [x - t0 for x in t]
            for name, v in cols.items():
                c[name].buf[i : i + k] = v
            layer_bufs = (c["seen"].buf, c["stored"].buf, c["dev"].buf, c["nbytes"].buf)
            for first, end, layers, values in parts:
                if end is None:
                    for buf, v in zip(layer_bufs, values):
                        buf[i + first, layers] = v
                    continue
                rows = slice(i + first, i + end)
                for buf, v in zip(layer_bufs, values):
                    buf[rows].T[layers] = v  # transposed: one number per row, broadcast over ``layers``
            for g in self._order:  # lengths last: a lock-free reader never sees a half-written row
                g.n = i + k
            self.version += 1

    def append_columns(self, cols: dict[str, np.ndarray]) -> None:
        """Bulk append (trace reader). All columns must have the same length."""
        with self.lock:
            k = len(next(iter(cols.values())))
            start = self.n_steps
            for name, g in self._cols.items():
                g.reserve(start + k)
                if name in cols:
                    g.buf[start : start + k] = cols[name]
                elif name == "dev":
                    g.buf[start : start + k] = -1
                g.n = start + k
            self.version += 1

    def add_turn(self, turn: TurnRecord) -> None:
        with self.lock:
            if turn.index < len(self.turns):
                self.turns[turn.index] = turn
            else:
                self.turns.append(turn)
                # Every turn's prompt holds the whole conversation: kept for all turns, the ids grow
                # with the square of its length (1,000 turns: ~14M Python ints, hundreds of MB).
                # Detectors need the current turn only; the last few stay for callers and tests.
                old = len(self.turns) - 1 - KEEP_PROMPT_IDS
                if old >= 0:
                    self.turns[old].prompt_ids = None
            self.version += 1

    def add_event(self, event: Event) -> None:
        with self.lock:
            self.events.append(event)
            self.version += 1

    def set_devices(self, devices: list[str]) -> None:
        with self.lock:
            if devices != self.devices:
                self.devices = list(devices)
                self.version += 1

    # -- derived --------------------------------------------------------------------------
    def kv_bytes_by_device(self, upto: int | None = None) -> dict[str, np.ndarray]:
        """Per-step KV bytes summed per device name."""
        n = self.n_steps if upto is None else upto
        dev = self.dev[:n]
        nb = self.nbytes[:n]
        out = {}
        for code, name in enumerate(self.devices):
            out[name] = np.where(dev == code, nb, 0).sum(axis=1)
        return out

    def turn_of_step(self, step: int) -> int:
        return int(self.turn[step]) if 0 <= step < self.n_steps else -1

    def events_for_turn(self, index: int) -> list[Event]:
        return [e for e in self.events if e.turn == index]

    def layer_table_at(self, step: int) -> list[dict]:
        """Per-layer state at ``step`` (replay): series values plus static facts from the header."""
        info = self.header.get("layers") or []
        out: list[dict] = []
        if not (0 <= step < self.n_steps):
            return out
        for i in range(self.n_layers):
            base = dict(info[i]) if i < len(info) else {"index": i}
            code = int(self.dev[step, i])
            seen = int(self.seen[step, i])
            stored = int(self.stored[step, i])
            base.update(
                index=i,
                seen=None if seen < 0 else seen,
                stored=None if stored < 0 else stored,
                device=self.devices[code] if 0 <= code < len(self.devices) else "-",
                bytes=int(self.nbytes[step, i]),
            )
            out.append(base)
        return out
