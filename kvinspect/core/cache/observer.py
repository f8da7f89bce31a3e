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
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.compat import cache_from_call


@dataclass
class StepSample:
    t: float
    cache_id: int  # 0: no cache object this forward
    new_cache: bool
    q_len: int
    use_cache: bool | None
    seen: np.ndarray
    stored: np.ndarray
    dev: np.ndarray
    nbytes: np.ndarray
    rss: int = 0
    accel_allocated: int = 0
    accel_reserved: int = 0
    input_ids: Any = None  # tensor reference, only when keep_input_ids (no copy, no sync)
    cache: Any = None  # the cache object itself (not serialised)


def _query_tensor(args, kwargs):
    ids = kwargs.get("input_ids")
    if ids is None and args:
        ids = args[0]
    if ids is not None and hasattr(ids, "shape"):
        return ids, ids
    emb = kwargs.get("inputs_embeds")
    return None, emb


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
        if not self.enabled:
            return None
        t0 = time.perf_counter()
        ids, q = _query_tensor(args, kwargs)
        q_len = int(q.shape[1]) if q is not None and q.dim() >= 2 else 0
        use_cache = kwargs.get("use_cache")
        cache = cache_from_call(kwargs, output)
        cache_id, new = self.probe.identify(cache)
        seen, stored, dev, nbytes = self.probe.lengths(cache, q_len)
        mem = self.memory.sample().as_tuple() if self.memory is not None else (0, 0, 0)
        sample = StepSample(
            t=t0, cache_id=cache_id, new_cache=new, q_len=q_len,
            use_cache=None if use_cache is None else bool(use_cache),
            seen=seen, stored=stored, dev=dev, nbytes=nbytes,
            rss=mem[0], accel_allocated=mem[1], accel_reserved=mem[2],
            input_ids=ids if self.keep_input_ids else None,
            cache=cache,
        )
        self.calls += 1
        self.sink(sample)
        self.time_in_hook += time.perf_counter() - t0
        return None
