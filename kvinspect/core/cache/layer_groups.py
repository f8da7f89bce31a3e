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

    __slots__ = ("members", "reps", "of_layer", "rep_readers", "targets")

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
        #: Where each group's numbers go in a record row (a slice where its layers are contiguous), and
        #: the layers without a read, whose numbers are ``(NA, NA, -1, 0)``.
        self.targets: list = [_index(m) for m in members]
        unread = np.flatnonzero(of == len(members))
        if len(unread):
            self.targets.append(_index(unread.tolist()))

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
        """The per-layer arrays from a read's ``reps``: each group's seen, stored, device code and bytes, group after group."""
        a = np.array([*reps, NA, NA, -1, 0], dtype=np.int64).reshape(-1, 4)[self.of_layer]
        return a[:, 0].astype(np.int32), a[:, 1].astype(np.int32), a[:, 2].astype(np.int8), a[:, 3].copy()

    def parts(self, columns: list[tuple], first: int, end: int) -> list[tuple]:
        """The rows ``first:end`` of a block, read by this grouping, as the record's ``append_steps`` takes them:
        ``(first, end, layers, (seen, stored, dev, bytes))`` per group, each value one number per row,
        which numpy broadcasts over the group's layers. ``columns``: ``zip(*reps)`` of the rows' ``reps``."""
        out: list[tuple] = [(first, end, where, columns[4 * g:4 * g + 4])
                            for g, where in enumerate(self.targets[: len(self.members)])]
        if len(self.targets) > len(self.members):
            out.append((first, end, self.targets[-1], (NA, NA, -1, 0)))
        return out


def _index(layers: list[int]):
    """A slice where ``layers`` are contiguous (a cheaper assignment than a list of indices)."""
    if layers == list(range(layers[0], layers[-1] + 1)):
        return slice(layers[0], layers[-1] + 1)
    return np.asarray(layers, dtype=np.intp)


def kind_groups(rows) -> list[list[int]]:
    """Layers that should agree at a snapshot: ``rows`` of ``(index, key)``; groups of two or more."""
    keyed: dict = {}
    for index, key in rows:
        keyed.setdefault(key, []).append(index)
    return [m for m in keyed.values() if len(m) > 1]
