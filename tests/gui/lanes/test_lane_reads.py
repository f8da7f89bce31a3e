"""What the lanes read from a :class:`RecordSeries`, through its public reads only: a raw column, the
unbinned curves at a step, the per-layer series kept for the tokens lane's picks."""

from __future__ import annotations

import numpy as np
import pytest

from kvinspect.core.trace.series import MEAN_SEEN, MEAN_STORED, RSS, RecordSeries
from kvinspect.core.trace.tracefile import read_trace
from tests.gui.helpers import headless_run


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    run = headless_run(tmp_path_factory.mktemp("run"), "tiny-gemma3", ["Hello there! Tell me about caches.", "More?"],
                       max_new_tokens=24)
    s = RecordSeries(read_trace(run))
    assert s.column("cache_id") is None  # nothing read before the first update
    assert s.update()
    return s


def test_column_and_curve_row_are_the_records_values(series):
    rec = series.record
    assert np.array_equal(series.column("cache_id"), rec.col("cache_id"))
    assert series.column("no such column") is None
    for k in (0, rec.n_steps // 2, rec.n_steps - 1):
        row = series.curve_row(k)
        seen, stored = rec.seen[k], rec.stored[k]
        ok = seen >= 0
        assert row[MEAN_SEEN] == pytest.approx(seen[ok].mean())
        assert row[MEAN_STORED] == pytest.approx(np.where(stored >= 0, stored, 0).sum() / max(ok.sum(), 1))
        assert row[RSS] == rec.col("rss")[k]


def test_keep_layers_drops_every_other_layer_series(series):
    for i in (0, 2, 5):
        series.layer(i)
    series.keep_layers([2, 3])
    assert set(series._layers) == {2}  # only what was built and is still picked
    lengths = series.layer(5).window(0, series.n, 10_000)
    assert lengths is not None  # a dropped layer is built again on demand
