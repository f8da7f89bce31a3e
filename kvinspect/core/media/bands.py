"""Where each image sits in the cache over the run: per layer kind, a band of positions from the step the
image was prefilled to the step that kind's layers no longer hold it (what the window's lanes shade)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvinspect.core.cache.layer_kinds import base_kind, layer_kinds

#: The kinds whose layers keep token rows (a state or shared layer holds no image rows of its own).
_TOKEN_KINDS = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class ImageBand:
    kind: str  # base layer kind
    image: int
    x0: int  # the prefill step
    x1: int  # exclusive: the first step this kind's layers hold none of its rows, or the cache object's end
    first: int  # positions
    last: int
    hash: str = ""


def image_bands(record) -> list[ImageBand]:
    """One band per image a turn encoded and per token-keeping layer kind (its first layer of that kind read)."""
    with record.lock:
        turns = list(record.turns)
        seen, stored, cid = record.col("seen"), record.col("stored"), record.col("cache_id")
        n = len(cid)
    if not any(t.media for t in turns) or n == 0:
        return []
    reps: dict[str, int] = {}
    for i, k in enumerate(layer_kinds(record)):
        b = base_kind(k)
        if b in _TOKEN_KINDS:
            reps.setdefault(b, i)
    out = []
    for t in turns:
        x0 = int(t.first_step)
        if x0 >= n:
            continue
        other = np.nonzero(cid[x0:n] != cid[x0])[0]
        end = x0 + int(other[0]) if len(other) else n
        for m in t.media:
            if not m.get("encoded"):
                continue
            for kind, layer in reps.items():
                gone = np.nonzero(seen[x0:end, layer] - stored[x0:end, layer] > int(m["last"]))[0]
                # At least the prefill step: the layer attended the image then, even where it kept none of its rows.
                x1 = max(x0 + int(gone[0]) if len(gone) else end, x0 + 1)
                out.append(ImageBand(kind, int(m["image"]), x0, x1, int(m["first"]), int(m["last"]),
                                     str(m.get("hash", ""))))
    return out
