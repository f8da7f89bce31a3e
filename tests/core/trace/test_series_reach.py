"""Where a running turn may get to: the steps its budget leaves, and its curves carried on at their rate."""

from __future__ import annotations

import numpy as np

from kvinspect.core.trace.record import TraceRecord, TurnRecord
from kvinspect.core.trace.series import KV_TOTAL, MEAN_SEEN, RecordSeries

LAYERS = 3
WINDOW = 8  # layer 2 slides: it stops growing at this length


def _steps(first: int, prompt: int, n: int, held: int = 0) -> dict[str, np.ndarray]:
    """``n`` steps of a turn from step ``first``: a prefill of ``prompt`` tokens, then one token a step."""
    seen = held + prompt + np.arange(n, dtype=np.int32)
    seen = np.repeat(seen[:, None], LAYERS, axis=1).astype(np.int32)
    stored = seen.copy()
    stored[:, 2] = np.minimum(stored[:, 2], WINDOW)
    q_len = np.ones(n, np.int32)
    q_len[:1] = prompt
    return {"turn": np.zeros(n, np.int32), "t": np.arange(first, first + n, dtype=np.float64),
            "cache_id": np.ones(n, np.int32), "q_len": q_len, "use_cache": np.ones(n, np.int8),
            "rss": np.full(n, 10**8, np.int64), "accel_allocated": np.zeros(n, np.int64),
            "accel_reserved": np.zeros(n, np.int64), "seen": seen, "stored": stored,
            "dev": np.zeros((n, LAYERS), np.int8), "nbytes": (stored * 100).astype(np.int64)}


def _record(settings: dict, steps: int, first: int = 0, status: str = "running", cache_id: int = 1):
    rec = TraceRecord(LAYERS, {})
    rec.set_devices(["cpu"])
    if first:
        rec.add_turn(TurnRecord(index=0, status="ok", first_step=0, end_step=first, settings={"max_new_tokens": first}))
        rec.append_columns(_steps(0, 5, first))
    rec.add_turn(TurnRecord(index=len(rec.turns), status=status, first_step=first, settings=settings))
    cols = _steps(first, 20, steps, held=first + 4 if first else 0)
    cols["cache_id"][:] = cache_id
    rec.append_columns(cols)
    s = RecordSeries(rec)
    s.update()
    return rec, s


def test_a_running_turn_may_still_take_what_its_budget_leaves_within_the_horizon():
    _, s = _record({"max_new_tokens": 100}, 30, first=50)
    assert s.turn_ahead(512) == (70, 50)
    assert s.turn_ahead(16) == (16, 50)
    for settings in ({}, {"max_new_tokens": "100"}, {"max_new_tokens": True}, {"max_new_tokens": 0}):
        _, t = _record(settings, 30, first=50)
        assert t.turn_ahead(512) == (0, t.n), settings
    _, done = _record({"max_new_tokens": 100}, 30, first=50, status="ok")
    assert done.turn_ahead(512) == (0, done.n)
    _, past = _record({"max_new_tokens": 10}, 30, first=50)  # (a budget the steps outgrew: nothing ahead)
    assert past.turn_ahead(512)[0] == 0


def test_a_turn_s_curves_carry_on_at_their_rate_since_its_prefill():
    _, s = _record({"max_new_tokens": 100}, 30, first=50)
    n = s.n
    last_seen = float(s.curve_row(n - 1)[MEAN_SEEN])
    # One token a step after the prefill (the prompt's jump is not counted as a rate).
    assert s.projected(MEAN_SEEN, 70, 50) == last_seen + 70
    # The KV bytes: two full layers grow 200 bytes a step, the sliding one none (it holds its window).
    last_kv = float(s.curve_row(n - 1)[KV_TOTAL])
    assert s.projected(KV_TOTAL, 70, 50) == last_kv + 70 * 200
    # The longest stored length of any layer: one a step.
    assert s.projected_longest(70, 50) == float(s.column("stored")[n - 1].max()) + 70
    assert s.projected(MEAN_SEEN, 0, 50) is None  # nothing to project


def test_a_turn_with_only_its_prefill_carries_on_at_the_prefill_s_rate_per_prompt_token():
    # The prefill's 20 tokens extended the cache the step before it held (54 tokens; 2 full layers,
    # 100 bytes a token each; the sliding one at its window): its rate a token is the decode's.
    _, s = _record({"max_new_tokens": 100}, 1, first=50)
    assert s.n == 51 and float(s.curve_row(50)[MEAN_SEEN]) == 74
    assert s.projected(MEAN_SEEN, 99, 50) == 74 + 99
    assert s.projected(KV_TOTAL, 99, 50) == float(s.curve_row(50)[KV_TOTAL]) + 99 * 200
    assert s.projected_longest(99, 50) == 74 + 99
    # A new cache object's prefill (a fresh policy, a static cache's allocation) is not a rate; nor is
    # a first turn's, with no step before it.
    _, fresh = _record({"max_new_tokens": 100}, 1, first=50, cache_id=2)
    assert fresh.projected(MEAN_SEEN, 99, 50) is None and fresh.projected_longest(99, 50) is None
    _, first = _record({"max_new_tokens": 100}, 1)
    assert first.projected(MEAN_SEEN, 99, 0) is None and first.projected_longest(99, 0) is None


def test_a_shrinking_curve_is_projected_flat_not_down():
    rec, s = _record({"max_new_tokens": 100}, 10)
    cols = _steps(10, 20, 5)
    cols["nbytes"] = np.zeros_like(cols["nbytes"])  # the cache was cropped: its bytes fell
    rec.append_columns(cols)
    s.update()
    assert s.projected(KV_TOTAL, 50, 0) == 0.0
