"""Observe every forward pass of a model through one forward hook; no patching.

A forward hook on the top-level model (``register_forward_hook(..., with_kwargs=True)``)
sees each prefill and decode forward that ``generate()`` or a manual loop makes, with the
cache object it used or returned, even when ``generate`` built that cache itself. After each
forward it reads cheap per-layer lengths (see :mod:`.probe`) and hands a :class:`StepSample`
to a sink. Measured cost: tens of microseconds per forward.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

import numpy as np

from kvinspect.core.cache.layer_groups import LayerGroups
from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.compat import cache_from_call, compiling_test


class StepSample:
    """One forward as the hook read it. Per-layer arrays are built when first used.

    The hook runs right after the forward has flushed the CPU caches, so it keeps a grouped read's
    few representative numbers (``reps``: the groups' seen, stored, device codes and bytes, in one
    list) and builds the per-layer arrays only when asked (one sample at the end of a turn); the
    pipeline appends many at once to the record as a :func:`block`.
    """

    __slots__ = ("t", "cache_id", "new_cache", "q_len", "use_cache", "rss", "accel_allocated", "accel_reserved",
                 "input_ids", "cache", "groups", "reps", "_arrays")

    def __init__(self, t: float, cache_id: int, new_cache: bool, q_len: int, use_cache: bool | None,
                 seen: np.ndarray | None = None, stored: np.ndarray | None = None, dev: np.ndarray | None = None,
                 nbytes: np.ndarray | None = None, rss: int = 0, accel_allocated: int = 0, accel_reserved: int = 0,
                 input_ids: Any = None, cache: Any = None, groups: LayerGroups | None = None,
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


def block(samples: list[StepSample]) -> tuple[tuple, dict[str, Any], list[tuple]]:
    """Many samples as the record's ``append_steps`` takes them: ``(t, scalar columns, per-layer parts)``.

    Python tuples and lists, not numpy arrays: this runs right after a forward, where each numpy call
    costs ten times its warm cost, and a list assigned to a record column is one call where an array
    built first and then assigned is two or three. The parts are ``(first, end, layers, (seen, stored,
    dev, bytes))``: a run of samples read by one grouping is a part per group
    (:meth:`~.layer_groups.LayerGroups.parts`), a sample read in full a part of its own, whose ``end``
    is None and whose values are its per-layer arrays."""
    t, cache_id, q_len, use_cache, rss, alloc, reserved = zip(*[
        (s.t, s.cache_id, s.q_len, -1 if s.use_cache is None else s.use_cache, s.rss, s.accel_allocated,
         s.accel_reserved) for s in samples])
    parts: list[tuple] = []
    k = len(samples)
    j = 0
    while j < k:
        g = samples[j].groups
        if g is None or samples[j]._arrays is not None:
            parts.append((j, None, _EVERY_LAYER, samples[j].arrays))
            j += 1
            continue
        e = j + 1
        while e < k and samples[e].groups is g and samples[e]._arrays is None:
            e += 1
        parts += g.parts(list(zip(*[s.reps for s in samples[j:e]])), j, e)
        j = e
    return t, {"cache_id": cache_id, "q_len": q_len, "use_cache": use_cache, "rss": rss, "accel_allocated": alloc,
               "accel_reserved": reserved}, parts


_EVERY_LAYER = slice(None)
_dict_get = dict.get
_new = object.__new__


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
        self._out_key: str | None = None  # the output field the last cache came in ("cache" in 5.x)
        self._compiling = compiling_test()

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
        # One function on the fast path, common case first: it runs with the CPU caches cold, where
        # every call and attribute read costs (docs/probe.md). Inside a compiled graph it steps aside.
        if self._compiling() or not self.enabled:
            return None
        t0 = perf_counter()
        ids = kwargs.get("input_ids")
        try:
            shape = ids.shape
        except AttributeError:  # positional ids, or inputs_embeds
            ids, shape = _query(args, kwargs)
        q_len = shape[1] if len(shape) > 1 else 0
        use_cache = kwargs.get("use_cache")
        if use_cache is not None and use_cache.__class__ is not bool:
            use_cache = bool(use_cache)
        try:
            cache = _dict_get(output, self._out_key)  # a ModelOutput is a dict: its own get() warns, [] copies
        except TypeError:  # a tuple (return_dict=False), or no output
            cache = None
        if cache is None:
            cache = self._cache_of(kwargs, output)
        cache_id, new, groups, row = self.probe.observe(cache, q_len)
        mem = self.memory
        if mem is None:
            rss = alloc = reserved = 0
        elif t0 < mem.rss_until:  # the CPU's RSS, read at most every rss_every_s; no accelerator counters
            rss, alloc, reserved = mem.rss, 0, 0
        else:
            rss, alloc, reserved = mem.sample_tuple(t0)
        if not self.keep_input_ids:
            ids = None
        if groups is None:
            sample = StepSample(t0, cache_id, new, q_len, use_cache, row[0], row[1], row[2], row[3], rss, alloc, reserved,
                                ids, cache)
        else:  # StepSample's fields set here, without its __init__'s frame and arguments: 2 µs of 20, cold
            sample = _new(StepSample)
            sample.t, sample.cache_id, sample.new_cache, sample.q_len, sample.use_cache = t0, cache_id, new, q_len, use_cache
            sample.rss, sample.accel_allocated, sample.accel_reserved = rss, alloc, reserved
            sample.input_ids, sample.cache, sample.groups, sample.reps, sample._arrays = ids, cache, groups, row, None
        self.calls += 1
        self.sink(sample)
        self.time_in_hook += perf_counter() - t0
        return None

    def _cache_of(self, kwargs, output):
        """The cache of a call whose output field is not the one of the last call (or has none)."""
        cache = cache_from_call(kwargs, output)
        if cache is not None and isinstance(output, dict):
            for key in ("cache", "past_key_values"):
                if dict.get(output, key) is cache:
                    self._out_key = key
        return cache


def _query(args, kwargs):
    """``(input ids or None, query shape)`` of a call not given ``input_ids`` by keyword."""
    ids = args[0] if args else None
    if ids is not None and hasattr(ids, "shape"):
        return ids, ids.shape
    q = kwargs.get("inputs_embeds")
    return None, (q.shape if q is not None and hasattr(q, "shape") else ())
