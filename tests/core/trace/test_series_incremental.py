"""A record's series grown step by step (a live session) equal the series built from scratch."""

from __future__ import annotations

import numpy as np

from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.trace.series import RecordSeries

LAYERS = 5


def _columns(n: int, rng) -> dict[str, np.ndarray]:
    seen = rng.integers(-1, 3000, (n, LAYERS)).astype(np.int32)
    stored = np.where(seen >= 0, np.minimum(seen, rng.integers(0, 3000, (n, LAYERS))), -1).astype(np.int32)
    return {
        "turn": np.zeros(n, np.int32), "t": np.arange(n, dtype=np.float64),
        "cache_id": rng.integers(1, 3, n).astype(np.int32), "q_len": np.ones(n, np.int32),
        "use_cache": np.ones(n, np.int8), "rss": rng.integers(1, 10**9, n).astype(np.int64),
        "accel_allocated": rng.integers(0, 10**9, n).astype(np.int64),
        "accel_reserved": rng.integers(0, 10**9, n).astype(np.int64),
        "seen": seen, "stored": stored, "dev": rng.integers(0, 2, (n, LAYERS)).astype(np.int8),
        "nbytes": rng.integers(0, 10**7, (n, LAYERS)).astype(np.int64),
    }


def _windows(s: RecordSeries, n: int):
    out = []
    for a, b, cols in ((0, n, 40), (0, n, 3), (n // 3, n // 2 + 1, 25), (5, n - 2, 10_000), (n - 70, n, 16)):
        for pyr in (s.stored, s.curves, s.layer(0), s.layer(LAYERS - 1)):
            x0, stride, hi, lo = pyr.window(a, b, cols)
            out.append((x0, stride, hi.tolist(), None if lo is None else lo.tolist()))
    return out


def test_series_grown_step_by_step_equal_the_series_built_at_once():
    rng = np.random.default_rng(3)
    total = 3000
    cols = _columns(total, rng)
    live = TraceRecord(LAYERS, {})
    live.set_devices(["cuda:0", "cpu"])
    grown = RecordSeries(live)
    grown.layer(0)  # a lane shown from the start: its pyramid grows with the record
    n = 0
    while n < total:
        # Mostly one step a frame (the live fast path), sometimes a burst, across pyramid growths.
        k = int(rng.choice([1, 1, 1, 2, 5, 9, 64, 300]))
        live.append_columns({name: v[n: n + k] for name, v in cols.items()})
        n = min(total, n + k)
        grown.update()
        if n in (1, 2, 33, 64, 65, 129) or rng.random() < 0.03:
            whole = TraceRecord(LAYERS, {})
            whole.set_devices(["cuda:0", "cpu"])
            whole.append_columns({name: v[:n] for name, v in cols.items()})
            fresh = RecordSeries(whole)
            fresh.update()
            assert _windows(grown, n) == _windows(fresh, n), n
            assert np.array_equal(grown._curve_raw.view, fresh._curve_raw.view)
            assert grown.vmax == fresh.vmax and grown.at(n - 1, 2) == fresh.at(n - 1, 2)
    # And each window column is the true max/min of the raw steps it covers.
    x0, stride, hi, lo = grown.layer(LAYERS - 1).window(0, total, 50)
    assert stride > 1
    for j in range(len(hi)):
        seg = slice(x0 + j * stride, min(x0 + (j + 1) * stride, total))
        assert hi[j].tolist() == [cols["seen"][seg, LAYERS - 1].max(), cols["stored"][seg, LAYERS - 1].max()]
        assert lo[j].tolist() == [cols["seen"][seg, LAYERS - 1].min(), cols["stored"][seg, LAYERS - 1].min()]
