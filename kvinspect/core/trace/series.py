"""What the plots draw, derived from a TraceRecord incrementally and decimated to screen width.

A redraw must cost O(pixels), never O(steps): 80 layers × 100k steps is 8M cells, far too
many to upload per frame. Every series therefore keeps a *pyramid* of max (and min)
reductions at strides 2, 4, 8, …, updated only for the rows appended since the last frame;
a view of any x-range picks the level whose column count fits the plot's pixel width and
slices it (``Pyramid.window``). Rows of a record never change once written (append-only),
so the views taken under ``record.lock`` stay valid after the lock is released.

Nothing here interprets the cache: the per-step aggregates (mean seen/stored over layers
with a token axis, KV bytes per device, RSS, accelerator counters) are plain reductions of
the record's columns, the same sums ``TraceRecord.kv_bytes_by_device`` makes.
"""

from __future__ import annotations

import numpy as np

MIN_COLUMNS = 32  # the coarsest level a window uses has about this many columns


class _Buf:
    """A 2-D array that grows by doubling; ``view`` is the filled part."""

    __slots__ = ("a", "n")

    def __init__(self, width: int, dtype, cap: int = 256):
        self.a = np.zeros((cap, width), dtype=dtype)
        self.n = 0

    def reserve(self, end: int) -> None:
        """Room for ``end`` rows."""
        if end > len(self.a):
            new = np.zeros((max(end, 2 * len(self.a)), self.a.shape[1]), dtype=self.a.dtype)
            new[: self.n] = self.a[: self.n]
            self.a = new

    def put(self, at: int, rows: np.ndarray) -> None:
        """Write ``rows`` from row ``at`` on; the buffer then ends after them."""
        end = at + len(rows)
        self.reserve(end)
        self.a[at:end] = rows
        self.n = end

    @property
    def view(self) -> np.ndarray:
        return self.a[: self.n]


class Pyramid:
    """Max (and optionally min) reductions of an append-only ``(n, w)`` array.

    All levels live in one array per reduction, level ``k`` (stride ``2 ** (k + 1)``) at rows
    ``off[k]:off[k] + cap >> (k + 1)``; bins not reached yet hold the reduction's identity
    (the dtype's lowest value for max, highest for min), so a bin is the max of the rows it
    has so far and a new row updates every level with one gather and one scatter. A live
    frame appends a row or two: a loop over levels (two dozen numpy calls per pyramid, six
    pyramids a frame) cost more than the rest of ``RecordSeries.update``.
    """

    def __init__(self, width: int, dtype, with_min: bool = False):
        self.width = int(width)
        self.dtype = np.dtype(dtype)
        self.with_min = with_min
        self.raw: np.ndarray = np.zeros((0, self.width), dtype=self.dtype)
        self.n = 0
        if self.dtype.kind == "f":
            self._lowest, self._highest = -np.inf, np.inf
        else:
            info = np.iinfo(self.dtype)
            self._lowest, self._highest = info.min, info.max
        self._alloc(0)

    def _alloc(self, cap: int) -> None:
        """Storage for ``cap`` (a power of two, or 0) raw rows; levels down to one bin."""
        self.cap = cap
        self.n_levels = max(cap.bit_length() - 1, 0)
        self._off = np.array([cap - (cap >> k) for k in range(self.n_levels)], dtype=np.intp)
        self._shift = np.arange(1, self.n_levels + 1, dtype=np.intp)
        self._hi = np.full((max(cap - 1, 0), self.width), self._lowest, dtype=self.dtype)
        self._lo = (np.full((max(cap - 1, 0), self.width), self._highest, dtype=self.dtype)
                    if self.with_min else None)

    def _grow(self, n: int) -> None:
        old_off, old_levels, hi, lo, old_n = self._off, self.n_levels, self._hi, self._lo, self.n
        self._alloc(max(1 << (n - 1).bit_length(), 2 * self.cap, 2))
        for k in range(old_levels):
            bins = ((old_n - 1) >> (k + 1)) + 1 if old_n else 0
            o, p = int(self._off[k]), int(old_off[k])
            self._hi[o: o + bins] = hi[p: p + bins]
            if lo is not None and self._lo is not None:
                self._lo[o: o + bins] = lo[p: p + bins]

    def update(self, raw: np.ndarray) -> None:
        """Take ``raw`` (all rows so far; rows before ``self.n`` unchanged) and refresh the levels."""
        n = len(raw)
        self.raw = raw
        a = self.n
        if n <= a:
            return
        first_new = self.n_levels  # levels a growth adds are built whole
        if n > self.cap:
            self._grow(n)
        if n - a <= 8 and first_new == self.n_levels:
            for i in range(a, n):  # a live frame: every level's bin of row i at once
                idx = self._off + (i >> self._shift)
                row = raw[i]
                self._hi[idx] = np.maximum(self._hi[idx], row)
                if self._lo is not None:
                    self._lo[idx] = np.minimum(self._lo[idx], row)
        else:
            self._build(raw, a, n, first_new)
        self.n = n

    def _build(self, raw: np.ndarray, a: int, n: int, first_new: int) -> None:
        """Bins of rows ``a:n`` level by level (levels from ``first_new`` on whole)."""
        for k in range(self.n_levels):
            b0 = 0 if k >= first_new else a >> (k + 1)
            b1 = ((n - 1) >> (k + 1)) + 1
            o = int(self._off[k])
            for dst, op in ((self._hi, np.maximum), (self._lo, np.minimum)):
                if dst is None:
                    continue
                if k == 0:
                    src = raw[2 * b0: n]
                    odd = len(src) % 2
                    dst[o + b0: o + b1 - odd] = op(src[0: len(src) - odd: 2], src[1::2])
                    if odd:
                        dst[o + b1 - 1] = src[-1]
                else:
                    p = int(self._off[k - 1])
                    src = dst[p + 2 * b0: p + 2 * b1]
                    dst[o + b0: o + b1] = op(src[0::2], src[1::2])

    def levels(self) -> int:
        """Levels a window may use: the coarsest has about ``MIN_COLUMNS`` columns."""
        return ((self.n - 1) // MIN_COLUMNS).bit_length() if self.n > 0 else 0

    def window(self, a: float, b: float, max_cols: int):
        """Columns covering steps ``[a, b]``, at most about ``2 * max_cols`` of them.

        Returns ``(x0, stride, hi, lo)``: column ``j`` covers steps ``x0 + j*stride`` to
        ``x0 + (j+1)*stride - 1``; ``hi``/``lo`` are its max/min rows (``lo`` is None
        without ``with_min``; at stride 1 both are the raw rows).
        """
        n = self.n
        i0 = max(0, min(n, int(np.floor(a))))
        i1 = max(i0, min(n, int(np.ceil(b)) + 1))
        level, stride, top = 0, 1, self.levels()
        while (i1 - i0) / stride > max_cols and level < top:
            level, stride = level + 1, stride * 2
        if level == 0:
            rows = self.raw[i0:i1]
            return i0, 1, rows, (rows if self.with_min else None)
        j0, j1 = i0 // stride, -(-i1 // stride)
        o = int(self._off[level - 1])
        hi = self._hi[o + j0: o + j1]
        lo = self._lo[o + j0: o + j1] if self._lo is not None else None
        return j0 * stride, stride, hi, lo


def envelope(x0: int, stride: int, hi: np.ndarray, lo: np.ndarray | None, col: int):
    """x/y arrays for one column as a curve: raw points, or a min/max zigzag per bin (peak mode)."""
    if stride == 1 or lo is None:
        h = hi[:, col].astype(np.float64)
        x = x0 + np.arange(len(h), dtype=np.float64) * stride + (stride - 1) / 2
        return x, h
    xc = x0 + np.arange(len(hi), dtype=np.float64) * stride + (stride - 1) / 2
    x = np.repeat(xc, 2)
    y = np.empty(2 * len(hi))
    y[0::2], y[1::2] = lo[:, col], hi[:, col]  # (astype's cast, without its two copies)
    return x, y


# Column layout of RecordSeries.curves
MEAN_SEEN, MEAN_STORED, KV_TOTAL, RSS, ACCEL_ALLOC, ACCEL_RESERVED = range(6)
FIXED = 6


def _project(first: float, last: float, span: int, steps: int) -> float:
    """``last`` ``steps`` steps on, at the mean rate from ``first`` ``span`` steps before it (never down)."""
    return last + max((last - first) / span, 0.0) * steps


class RecordSeries:
    """Everything the plots need from one record, kept up to date by :meth:`update`."""

    def __init__(self, record):
        self.record = record
        self.n_layers = record.n_layers
        self.n = 0
        self.devices: list[str] = []
        self.vmax = 1  # largest stored length so far (the heatmap's colour scale)
        self.stored = Pyramid(self.n_layers, np.int32)
        self._reset_curves()
        self._layers: dict[int, tuple[_Buf, Pyramid]] = {}
        self._raw_views: dict[str, np.ndarray] = {}

    def _reset_curves(self) -> None:
        self._curve_raw = _Buf(FIXED + len(self.devices), np.float64)
        self.curves = Pyramid(FIXED + len(self.devices), np.float64, with_min=True)
        self._curves_n = 0

    # -- update ------------------------------------------------------------------------------
    def update(self) -> bool:
        """Consume the rows appended since the last call. True when anything changed."""
        r = self.record
        with r.lock:
            n = r.n_steps
            devices = list(r.devices)
            if n == self.n and devices == self.devices:
                return False
            v = {name: r.col(name) for name in ("seen", "stored", "dev", "nbytes", "rss", "cache_id", "q_len",
                                                 "accel_allocated", "accel_reserved")}
        self._raw_views = v
        if devices != self.devices:
            # A device appeared (offloading, a device map): the stacked columns change; rebuild once.
            self.devices = devices
            self._reset_curves()
        self.stored.update(v["stored"])
        if n > self.n:
            new = v["stored"][self.n:n]
            if len(new):
                self.vmax = max(self.vmax, int(new.max()))
        self._extend_curves(v, n)
        for i, (buf, pyr) in self._layers.items():
            self._extend_layer(i, buf, pyr, v, n)
        self.n = n
        return True

    def _extend_curves(self, v: dict, n: int) -> None:
        a = self._curves_n
        if n <= a:
            return
        seen, stored = v["seen"][a:n], v["stored"][a:n]
        ok = seen >= 0  # layers without a token axis (linear, shared) report -1
        cnt = np.maximum(ok.sum(axis=1), 1)
        rows = np.zeros((n - a, FIXED + len(self.devices)), dtype=np.float64)
        rows[:, MEAN_SEEN] = np.where(ok, seen, 0).sum(axis=1) / cnt
        rows[:, MEAN_STORED] = np.where(stored >= 0, stored, 0).sum(axis=1) / cnt
        dev, nb = v["dev"][a:n], v["nbytes"][a:n]
        rows[:, KV_TOTAL] = nb.sum(axis=1)
        rows[:, RSS] = v["rss"][a:n]
        rows[:, ACCEL_ALLOC] = v["accel_allocated"][a:n]
        rows[:, ACCEL_RESERVED] = v["accel_reserved"][a:n]
        acc = np.zeros(n - a)
        for code in range(len(self.devices)):  # stacked: column FIXED+j = bytes on devices 0..j
            acc = acc + np.where(dev == code, nb, 0).sum(axis=1)
            rows[:, FIXED + code] = acc
        self._curve_raw.put(a, rows)
        self.curves.update(self._curve_raw.view)
        self._curves_n = n

    def _extend_layer(self, i: int, buf: _Buf, pyr: Pyramid, v: dict, n: int) -> None:
        a = buf.n
        if n > a and i < self.n_layers:
            buf.reserve(n)  # the two columns written in place: np.stack cost more than the pyramid
            buf.a[a:n, 0] = v["seen"][a:n, i]
            buf.a[a:n, 1] = v["stored"][a:n, i]
            buf.n = n
            pyr.update(buf.view)

    def layer(self, i: int) -> Pyramid:
        """Seen (column 0) and stored (column 1) of layer ``i``; built on first use."""
        if i not in self._layers:
            buf, pyr = _Buf(2, np.int32), Pyramid(2, np.int32, with_min=True)
            self._layers[i] = (buf, pyr)
            if self._raw_views:
                self._extend_layer(i, buf, pyr, self._raw_views, self.n)
        return self._layers[i][1]

    def drop_layer(self, i: int) -> None:
        self._layers.pop(i, None)

    def keep_layers(self, layers) -> None:
        """Drop the per-layer series of every layer not in ``layers`` (the tokens lane's picks changed)."""
        for i in [i for i in self._layers if i not in layers]:
            del self._layers[i]

    def column(self, name: str) -> np.ndarray | None:
        """The record's column ``name`` as of the last :meth:`update` (None before one, or unknown)."""
        return self._raw_views.get(name)

    def curve_row(self, step: int) -> np.ndarray:
        """The :attr:`curves` columns (``MEAN_SEEN``, ``RSS``, the stacked devices…) at one step, unbinned."""
        return self._curve_raw.view[step]

    def device_columns(self) -> list[tuple[str, int]]:
        return [(name, FIXED + j) for j, name in enumerate(self.devices)]

    # -- a running turn's reach ---------------------------------------------------------------
    def turn_ahead(self, horizon: int) -> tuple[int, int]:
        """(the steps the running turn may still take, at most ``horizon``; its first step).

        A turn takes at most ``max_new_tokens`` forward passes (its settings, from its turn_start
        line); (0, n) when no turn runs or its budget is unknown."""
        with self.record.lock:
            turn = self.record.turns[-1] if self.record.turns else None
        if turn is None or turn.status != "running":
            return 0, self.n
        budget = turn.settings.get("max_new_tokens") if isinstance(turn.settings, dict) else None
        if type(budget) is not int or budget <= 0:
            return 0, self.n
        return max(0, min(turn.first_step + budget - self.n, horizon)), turn.first_step

    def _rate_span(self, n: int, since: int) -> tuple[int, int] | None:
        """(the step a running turn's rate is measured from, the tokens since then) for a turn whose
        prefill is step ``since`` and whose last step is ``n - 1``.

        Its decode steps once it has one: a prompt's jump is not a rate. Until then, its prefill per
        prompt token, measured from the step before it when the prefill extended that step's cache
        (a turn's first frame has only its prefill: without it the y ranges would step a frame later,
        repainting the lanes whole once more). A new cache object's jump, a static cache's
        allocation for one, is not a rate either: then none."""
        if since < 0 or n - 1 < since:
            return None
        if n - 1 > since:
            return since, n - 1 - since
        cache, q = self._raw_views.get("cache_id"), self._raw_views.get("q_len")
        if since < 1 or cache is None or q is None or len(q) <= since or cache[since] != cache[since - 1]:
            return None
        return (since - 1, int(q[since])) if q[since] > 0 else None

    def projected(self, col: int, steps: int, since: int) -> float | None:
        """The curves' column ``col`` ``steps`` steps after the last one, at the running turn's rate
        (:meth:`_rate_span`; ``since`` is its prefill). None without a rate or steps to project; never
        below the last value."""
        n = self._curves_n
        if steps <= 0 or (span := self._rate_span(n, since)) is None:
            return None
        raw = self._curve_raw.view
        return _project(float(raw[span[0], col]), float(raw[n - 1, col]), span[1], steps)

    def projected_longest(self, steps: int, since: int) -> float | None:
        """:meth:`projected` for the longest stored length of any layer (the heatmap's scale)."""
        stored = self._raw_views.get("stored")
        n = self.n
        if stored is None or len(stored) < n or steps <= 0 or (span := self._rate_span(n, since)) is None:
            return None
        return _project(float(stored[span[0]].max(initial=0)), float(stored[n - 1].max(initial=0)), span[1], steps)

    # -- point reads (hover) -----------------------------------------------------------------
    def at(self, step: int, layer: int) -> dict | None:
        """Raw values at one cell, or None outside the data."""
        v = self._raw_views
        if not v or not (0 <= step < self.n) or not (0 <= layer < self.n_layers):
            return None
        code = int(v["dev"][step, layer])
        return {
            "seen": int(v["seen"][step, layer]),
            "stored": int(v["stored"][step, layer]),
            "bytes": int(v["nbytes"][step, layer]),
            "device": self.devices[code] if 0 <= code < len(self.devices) else "-",
        }
