"""Observe every forward pass of a model through one forward hook; no patching.

A forward hook on the top-level model (``register_forward_hook(..., with_kwargs=True)``)
sees each prefill and decode forward that ``generate()`` or a manual loop makes, with the
cache object it used or returned, even when ``generate`` built that cache itself. After each
forward it reads cheap per-layer lengths (see :mod:`.probe`) and hands a :class:`StepSample`
to a sink. Measured cost: tens of microseconds per forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np

from kvinspect.core.cache.layer_groups import LayerGroups
from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.compat import cache_from_call


class StepSample:
    """One forward as the hook read it. Per-layer arrays are built when first used.

    The hook runs right after the forward has flushed the CPU caches, so it keeps a grouped read's
    few representative numbers (``reps``: the groups' seen, stored, device codes and bytes, in one
    list) and builds the per-layer arrays only when asked: one sample at the end of a turn, or
    many at once (:func:`stack`) when the pipeline appends steps to the record.
    """

    __slots__ = ("t", "cache_id", "new_cache", "q_len", "use_cache", "rss", "accel_allocated", "accel_reserved",
                 "input_ids", "cache", "groups", "reps", "_arrays")

    def __init__(self, t: float, cache_id: int, new_cache: bool, q_len: int, use_cache: bool | None,
                 seen: np.ndarray | None = None, stored: np.ndarray | None = None, dev: np.ndarray | None = None,
                 nbytes: np.ndarray | None = None, rss: int = 0, accel_allocated: int = 0, accel_reserved: int = 0,
                 input_ids: Any = None, cache: Any = None, *, groups: LayerGroups | None = None,
                 reps: list | None = None):
        self.t = t
        self.cache_id = cache_id  # 0: no cache object this forward
        self.new_cache = new_cache
        self.q_len = q_len
        self.use_cache = use_cache
        self.rss = rss
        self.accel_allocated = accel_allocated
        self.accel_reserved = accel_reserved
        self.input_ids = input_ids  # tensor reference, only when keep_input_ids (no copy, no sync)
        self.cache = cache  # the cache object itself (not serialised)
        self.groups = groups
        self.reps: list = reps if reps is not None else []
        self._arrays = None if groups is not None else (seen, stored, dev, nbytes)

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(seen, stored, dev, nbytes)``, one entry per layer."""
        a = self._arrays
        if a is None:
            assert self.groups is not None
            a = self._arrays = self.groups.spread(self.reps)
        return a  # type: ignore[return-value]

    @property
    def seen(self) -> np.ndarray:
        return self.arrays[0]

    @property
    def stored(self) -> np.ndarray:
        return self.arrays[1]

    @property
    def dev(self) -> np.ndarray:
        return self.arrays[2]

    @property
    def nbytes(self) -> np.ndarray:
        return self.arrays[3]


def stack(samples: list[StepSample], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The per-layer rows of many samples as four ``(len(samples), n)`` arrays, a run of one grouping at a time.

    The usual block, every sample read by one grouping, is one ``fromiter`` and one gather, and the
    four arrays are views of it (int64: the record's columns take them as they are appended)."""
    k = len(samples)
    g = samples[0].groups if k else None
    if g is not None and all(s.groups is g and s._arrays is None for s in samples):
        full = _expand_run(samples, g)
        return full[:, 0], full[:, 1], full[:, 2], full[:, 3]
    seen = np.empty((k, n), dtype=np.int32)
    stored = np.empty((k, n), dtype=np.int32)
    dev = np.empty((k, n), dtype=np.int8)
    nbytes = np.empty((k, n), dtype=np.int64)
    j = 0
    while j < k:
        g = samples[j].groups
        if g is None or samples[j]._arrays is not None:
            seen[j], stored[j], dev[j], nbytes[j] = samples[j].arrays
            j += 1
            continue
        e = j + 1
        while e < k and samples[e].groups is g and samples[e]._arrays is None:
            e += 1
        full = _expand_run(samples[j:e], g)
        seen[j:e], stored[j:e], dev[j:e], nbytes[j:e] = full[:, 0], full[:, 1], full[:, 2], full[:, 3]
        j = e
    return seen, stored, dev, nbytes


def _expand_run(run: list[StepSample], g: LayerGroups) -> np.ndarray:
    """``(len(run), 4, layers)``: seen, stored, device codes and bytes of samples read by the grouping ``g``."""
    width = len(g.reps)
    flat = np.fromiter(chain.from_iterable(s.reps for s in run), np.int64, len(run) * 4 * width)
    return g.expand(flat.reshape(len(run), 4, width))


_NO_MEMORY = (0, 0, 0)


class StepObserver:
    """Attach to ``model``; every forward calls ``sink(StepSample)``. Use as a context manager."""

    def __init__(
        self,
        model,
        probe: CacheProbe,
        sink: Callable[[StepSample], None],
        memory: MemorySampler | None = None,
        keep_input_ids: bool = False,
    ):
        self.model = model
        self.probe = probe
        self.sink = sink
        self.memory = memory
        self.keep_input_ids = keep_input_ids
        self.enabled = True
        self._handle = None
        self.calls = 0
        self.time_in_hook = 0.0

    def attach(self) -> StepObserver:
        if self._handle is None:
            self._handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    @property
    def attached(self) -> bool:
        return self._handle is not None

    def __enter__(self) -> StepObserver:
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    def _hook(self, module, args, kwargs, output) -> None:
        # One function on the fast path: it runs with the CPU caches cold, where each call costs (docs/probe.md).
        if not self.enabled:
            return None
        t0 = time.perf_counter()
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is not None and hasattr(ids, "shape"):
            q = ids
        else:
            ids, q = None, kwargs.get("inputs_embeds")
        q_len = int(q.shape[1]) if q is not None and q.dim() >= 2 else 0
        use_cache = kwargs.get("use_cache")
        if use_cache is not None:
            use_cache = bool(use_cache)
        cache = cache_from_call(kwargs, output)
        cache_id, new, groups, row = self.probe.observe(cache, q_len)
        rss, alloc, reserved = self.memory.sample_tuple() if self.memory is not None else _NO_MEMORY
        if not self.keep_input_ids:
            ids = None
        if groups is None:
            sample = StepSample(t0, cache_id, new, q_len, use_cache, row[0], row[1], row[2], row[3], rss, alloc, reserved,
                                ids, cache)
        else:
            sample = StepSample(t0, cache_id, new, q_len, use_cache, None, None, None, None, rss, alloc, reserved,
                                ids, cache, groups=groups, reps=row)
        self.calls += 1
        self.sink(sample)
        self.time_in_hook += time.perf_counter() - t0
        return None
