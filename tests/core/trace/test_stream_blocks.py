"""The step blocks a stream sends are views of the record's rows, not copies: they must stay as sent."""

from __future__ import annotations

import numpy as np

from kvinspect.core.trace.messages import DTYPES, Steps
from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.trace.stream import Stream


def _block(rec: TraceRecord, first: int, k: int) -> None:
    rows = np.arange(first, first + k)
    rec.append_steps(rows * 0.01, {"turn": 0, "cache_id": 1, "q_len": 1, "use_cache": 1, "rss": rows * 10,
                                   "accel_allocated": 0, "accel_reserved": 0,
                                   "seen": np.repeat(rows[:, None], 3, axis=1), "stored": rows[:, None],
                                   "dev": 0, "nbytes": rows[:, None] * 64})


def test_blocks_sent_keep_their_rows_while_the_record_grows_past_its_buffers():
    rec = TraceRecord(3)
    sent: list[Steps] = []
    stream = Stream(rec, [lambda m: sent.append(m) if isinstance(m, Steps) else None])
    n = 0
    for k in (100, 100, 100, 300, 700):  # the 256-row buffers are replaced three times
        _block(rec, n, k)
        n += k
        stream.flush_steps()
    assert [(s.first, s.n) for s in sent] == [(0, 100), (100, 100), (200, 100), (300, 300), (600, 700)]
    for name in DTYPES:
        got = np.concatenate([s.cols[name] for s in sent])
        assert np.array_equal(got, rec.col(name)), name
    assert list(sent[0].cols["seen"][-1]) == [99, 99, 99] and sent[0].cols["rss"][-1] == 990


def test_a_stream_without_sinks_sends_nothing_and_later_blocks_start_after_it():
    rec = TraceRecord(3)
    stream = Stream(rec)
    _block(rec, 0, 10)
    stream.flush_steps()
    got: list[Steps] = []
    stream.sinks.append(lambda m: got.append(m) if isinstance(m, Steps) else None)
    _block(rec, 10, 5)
    stream.flush_steps()
    assert [(s.first, s.n) for s in got] == [(10, 5)]
