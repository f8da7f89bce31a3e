"""``layers_disagree``: a layer that holds different numbers from the other layers of its group.

Layers of one kind and storage in one cache are updated by the same code with the same query, so
at the end of a turn they hold the same rows and bytes; the per-step series rely on it (they read
one layer per group, see :mod:`kvinspect.core.cache.layer_groups`). When one layer differs, the
cache itself is wrong: transformers #37574 (a wrong K/V update for sliding layers at the window),
or a ``get_seq_length()`` that reads the wrong layer (Gemma 3, PR #38156). The snapshot reads
every layer, so the check costs nothing per step.
"""

from __future__ import annotations

from collections import Counter

from kvinspect.core.detect.events import LAYERS_DISAGREE, Event, _ranges
from kvinspect.core.units import fmt_bytes


def _numbers(lay) -> tuple:
    return (lay.seen, lay.stored, lay.bytes)


def _say(n: tuple) -> str:
    seen, stored, nbytes = n
    rows = "no token axis" if seen is None else f"{stored} rows of {seen} tokens seen"
    return f"{rows}, {fmt_bytes(nbytes)}"


def layers_disagree(ctx) -> list[Event]:
    """One error event naming every layer whose seen, stored or bytes differ from its group's."""
    snap = ctx.snapshot
    # A forward that raised part-way through the model leaves its first layers one update ahead.
    if snap is None or not getattr(snap, "groups", None) or ctx.status in ("failed", "interrupted"):
        return []
    by_index = {lay.index: lay for lay in snap.layers}
    odd: list[dict] = []
    groups: list[dict] = []
    for members in snap.groups:
        nums = [_numbers(by_index[i]) for i in members]
        counts = Counter(nums)
        if len(counts) == 1:
            continue
        # The group's numbers: what most of its layers hold; a tie goes to the first layer,
        # the one the per-step series followed.
        top = max(counts.values())
        group_n = next(n for n in nums if counts[n] == top)
        lay0 = by_index[members[0]]
        groups.append({"kind": lay0.kind, "layers": list(members), "seen": group_n[0], "stored": group_n[1],
                       "bytes": group_n[2]})
        for i, n in zip(members, nums):
            if n != group_n:
                odd.append({"layer": i, "seen": n[0], "stored": n[1], "bytes": n[2], "group": len(groups) - 1,
                            "group_text": _say(group_n), "text": _say(n), "kind": lay0.kind,
                            "group_size": len(members)})
    if not odd:
        return []
    parts = [f"layer {o['layer']} holds {o['text']} where the other layers of its group ({o['kind']}, "
             f"{o['group_size']} layers) hold {o['group_text']}" for o in odd[:4]]
    more = f"; and {len(odd) - 4} more layers" if len(odd) > 4 else ""
    followed = [o["layer"] for o in odd if o["layer"] == groups[o["group"]]["layers"][0]]
    note = (f" The per-step series read layer {followed[0]} for its whole group, so they show its numbers."
            if followed else "")
    layers = [o["layer"] for o in odd]
    return [Event(
        LAYERS_DISAGREE, "error", ctx.turn_index, ctx.first_step,
        f"cache layers of one kind disagree at the end of turn {ctx.turn_index + 1}: " + "; ".join(parts) + more
        + "." + note,
        "Layers of one kind are updated together, so this is a cache bug, not a usage mistake: check the "
        "transformers version (e.g. #37574, sliding layers at the window) and anything that edits cache "
        f"layers by hand; layers {_ranges(layers)} hold the odd numbers.",
        layer=layers[0], layers=layers,
        data={"layers": [{k: o[k] for k in ("layer", "seen", "stored", "bytes", "group")} for o in odd],
              "groups": groups},
    )]
