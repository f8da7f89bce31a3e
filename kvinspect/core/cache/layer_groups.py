"""Groups of cache layers that grow together, so a forward's read costs one layer per group.

Layers of one kind and one storage in one cache object are updated by the same code with the
same query, so they hold the same rows: reading a representative per group and copying its
numbers to the others gives what reading every layer would, at a cost that does not grow with
the layer count. The grouping is built from one full read in which every layer looked the same as
the others of its kind, and the end-of-turn snapshot (which reads every layer) checks it:
``layers_disagree`` (:mod:`kvinspect.core.detect.layers`) fires when a layer has drifted.
"""

from __future__ import annotations

import numpy as np

NA = -1


class LayerGroups:
    """Which layers the per-step read takes, and which layer each series entry copies."""

    __slots__ = ("members", "reps", "of_layer", "rep_readers", "_every_layer_read")

    def __init__(self, members: list[list[int]], n: int, readers: list | None = None):
        self.members = members
        self.reps = [m[0] for m in members]
        #: ``(layer, reader)`` of each representative, in group order: the per-step read's whole loop.
        self.rep_readers = [(i, readers[i] if readers is not None else "") for i in self.reps]
        # Layers without a read (shared, beyond the cache) point at a constant last row.
        of = np.full(n, len(members), dtype=np.intp)
        for g, m in enumerate(members):
            of[m] = g
        self.of_layer = of
        self._every_layer_read = bool((of < len(members)).all())

    @classmethod
    def build(cls, shapes, readers, row_bytes: dict[int, int], seen, stored, dev, nbytes) -> LayerGroups | None:
        """Group the layers of one full read, or None while some layer has no tensors yet (lazy init)
        or the cache cannot be grouped (legacy tuples are a new object every forward)."""
        keyed: dict[tuple, list[int]] = {}
        for i, shape in enumerate(shapes[: len(seen)]):
            reader = readers[i]
            if reader == "na":
                continue
            if reader == "legacy" or dev[i] < 0:
                return None
            # Same kind and storage, same device, and the same numbers right now.
            key = (reader, shape.cls, shape.attention, shape.config_attention, shape.storage, shape.window,
                   shape.capacity, shape.reads_from, int(dev[i]), row_bytes.get(i), int(seen[i]), int(stored[i]),
                   int(nbytes[i]))
            keyed.setdefault(key, []).append(i)
        return cls(list(keyed.values()), len(seen), readers)

    def spread(self, reps: list):
        """The per-layer arrays from a read's ``reps``: seen, stored, device code and bytes of each group, in turn."""
        of, g = self.of_layer, len(self.reps)
        return (np.array([*reps[:g], NA], dtype=np.int32)[of],
                np.array([*reps[g:2 * g], NA], dtype=np.int32)[of],
                np.array([*reps[2 * g:3 * g], -1], dtype=np.int8)[of],
                np.array([*reps[3 * g:], 0], dtype=np.int64)[of])

    def expand(self, reps: np.ndarray) -> np.ndarray:
        """Many forwards at once: ``reps`` of shape ``(k, 4, groups)`` to ``(k, 4, layers)`` (seen, stored, dev, bytes)."""
        k, _, g = reps.shape  # reps.reshape(k, 4, groups) of k reads' ``reps`` one after the other
        if self._every_layer_read:
            return reps[:, :, self.of_layer]
        ext = np.empty((k, 4, g + 1), dtype=np.int64)
        ext[:, :, :g] = reps
        ext[:, :, g] = (NA, NA, -1, 0)  # layers without a read: shared, beyond the cache
        return ext[:, :, self.of_layer]

def kind_groups(rows) -> list[list[int]]:
    """Layers that should agree at a snapshot: ``rows`` of ``(index, key)``; groups of two or more."""
    keyed: dict = {}
    for index, key in rows:
        keyed.setdefault(key, []).append(index)
    return [m for m in keyed.values() if len(m) > 1]
