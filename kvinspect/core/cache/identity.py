"""Which cache object a forward used: a stable small integer id per object, and what the probe keeps per cache.

A cache is found by a weak reference (its state dies with it); the latest forward's cache by one
identity test, not a weak-dict lookup. Legacy tuples cannot be weakly referenced: they are keyed by
``id()``.
"""

from __future__ import annotations

import weakref
from itertools import count

from kvinspect.core.cache.layer_groups import LayerGroups
from kvinspect.core.cache.layer_shapes import LayerShape, cls_name
from kvinspect.core.errors import UnsupportedCacheError


class CacheState:
    """Per-cache bookkeeping: layer shapes and counters for static layers on accelerators."""

    __slots__ = ("cache_id", "shapes", "readers", "est_seen", "row_bytes", "groups", "hybrid", "state_bytes",
                 "plain", "__weakref__")

    def __init__(self, cache_id: int):
        self.cache_id = cache_id
        self.shapes: list[LayerShape] = []
        self.readers: list = []
        self.est_seen: dict[int, int] = {}
        self.row_bytes: dict[int, int] = {}
        self.groups: LayerGroups | None = None  # set after the first full read where every layer had tensors
        self.hybrid: frozenset[int] = frozenset()  # layers holding K/V and a conv/recurrent state (Falcon-H1)
        self.state_bytes: dict[int, int] = {}  # their state's size, fixed once it exists (like row_bytes)
        # The step hook's read when every group's representative is a plain dynamic layer:
        # ``(groups, layer count, ((index, row bytes, sliding, device code), ...))``; None: the general read
        # (:meth:`.step_read.StepRead._read`). Indices, not layers: the state outlives its cache in ``_last``.
        self.plain: tuple | None = None


class CacheIdentity:
    """Ids of the cache objects one probe has seen, and each one's :class:`CacheState`."""

    _ids = count(1)

    def __init__(self) -> None:
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._legacy: dict[int, CacheState] = {}
        # The cache of the latest forward: one identity test finds its state, not a weak-dict lookup.
        self._last: tuple[weakref.ref, CacheState] | None = None

    def identify(self, cache) -> tuple[int, bool]:
        """``(cache_id, first_time_seen)``; ids are stable for the life of the object."""
        if cache is None:
            return 0, False
        st, new = self._lookup(cache)
        return st.cache_id, new

    def _state(self, cache) -> CacheState:
        return self._lookup(cache)[0]

    def _lookup(self, cache) -> tuple[CacheState, bool]:
        """The state of ``cache`` and whether it is new to this probe; the latest cache's is one identity test."""
        last = self._last
        if last is not None and last[0]() is cache:
            return last[1], False
        try:
            st = self._states.get(cache)
        except TypeError:  # legacy tuples are not weak-referenceable
            st = self._legacy.get(id(cache))
            if st is None:
                st = self._legacy[id(cache)] = CacheState(next(self._ids))
                return st, True
            return st, False
        new = st is None
        if st is None:
            if cls_name(cache) == "EncoderDecoderCache":
                raise UnsupportedCacheError(
                    "encoder-decoder caches (EncoderDecoderCache) are not supported: kvinspect inspects decoder-only models"
                )
            st = CacheState(next(self._ids))
            self._states[cache] = st
        self._last = (weakref.ref(cache), st)
        return st, new

    def known_id(self, cache) -> int | None:
        try:
            st = self._states.get(cache)
        except TypeError:
            st = self._legacy.get(id(cache))
        return st.cache_id if st is not None else None
