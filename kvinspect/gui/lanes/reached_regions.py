"""Where layers stopped growing, from a record: each window/chunk event's step to the end of its cache object."""

from __future__ import annotations

import numpy as np

from kvinspect.core.trace.series import RecordSeries
from kvinspect.gui.graphics.regions import merged_spans


def region_spans(record, series: RecordSeries, kinds=("window_reached", "chunk_reached"),
                 memo: dict | None = None) -> list:
    """Where layers stopped growing: from each event's step to the end of that cache object's life.

    ``memo`` (one dict per view, kept between frames) remembers how far each event's cache
    object was already followed, so a live frame scans only the new steps, not the whole run.
    """
    cid = series.column("cache_id")
    n = series.n
    memo = {} if memo is None else memo
    out = []
    for idx, e in enumerate(record.events):
        if e.kind not in kinds or not e.layers:
            continue
        end = n
        want = e.data.get("cache_id")
        if cid is not None and want is not None and e.step < n:
            key = (idx, e.step, want)
            done, found = memo.get(key, (e.step, None))
            if found is None and done < n:
                other = np.nonzero(cid[done:n] != want)[0]
                found = done + int(other[0]) if len(other) else None
                done = n
            if done > n:  # the record shrank (a new one): start over
                other = np.nonzero(cid[e.step:n] != want)[0]
                found, done = (e.step + int(other[0]) if len(other) else None), n
            memo[key] = (done, found)
            if found is not None and found < n:
                end = found
        runs = memo.get(("runs", idx, e.step))
        if runs is None:  # an event's layers never change: merged once, not on every frame
            runs = memo[("runs", idx, e.step)] = merged_spans(e.layers)
        for l0, l1 in runs:
            out.append((float(e.step), float(end), l0, l1))
    return out
