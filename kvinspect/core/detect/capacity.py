"""Capacity: a cache with a fixed number of rows, and a conversation that will not fit in it.

A ``StaticCache`` (also hybrid static and offloaded static) allocates ``max_cache_len`` rows per
full-attention layer up front and never grows; a sliding layer's static buffer holds
``min(window, max_cache_len)`` rows, so one smaller than the window drops context the model was
trained to see. A loop that reuses a static cache sized for its first turn dies in a later turn
inside transformers (``IndexError: index_copy_(): index N is out of bounds``; transformers #37269,
#39593). Two events, from token counts only:

- ``capacity_near`` (warn): after a turn that fit, the next one (the rows held now, plus this
  turn's new input again, plus ``max_new_tokens``) would not;
- ``capacity_exceeded`` (error): a turn needed more rows than exist (it failed, or a layer has
  seen more positions than it has rows).

Both speak only of a cache that outlives its call: one the program passed in, holds, or got back.
One that ``generate(cache_implementation="static")`` built for itself is sized for that call and
dropped after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvinspect.core.detect.events import CAPACITY_EXCEEDED, CAPACITY_NEAR, Event, _ranges


@dataclass(frozen=True)
class Bound:
    """The tightest fixed capacity among a snapshot's layers, and which layers have it."""

    capacity: int
    layers: list[int]
    held: int  # rows of the conversation those layers hold now (their seen length)


def bound_of(snapshot) -> Bound | None:
    """The fixed capacity that limits the conversation, None for caches that grow."""
    if snapshot is None:
        return None
    caps: dict[int, list] = {}
    for lay in snapshot.layers:
        if lay.storage != "static" or not lay.capacity:
            continue
        windowed = lay.attention in ("sliding", "chunked")
        # A sliding buffer that holds its whole window rolls over by design; only a smaller one is a limit.
        if windowed and (not lay.window or lay.capacity >= lay.window):
            continue
        caps.setdefault(int(lay.capacity), []).append(lay)
    if not caps:
        return None
    cap = min(caps)
    lays = caps[cap]
    return Bound(cap, [lay.index for lay in lays], max(int(getattr(lay, "seen", 0) or 0) for lay in lays))


def _fix(need: int) -> str:
    return (f"Build the cache with max_cache_len of at least {need} (the longest conversation you will run plus "
            "max_new_tokens), or use a DynamicCache, which grows; a static cache never does.")


def capacity_events(ctx, status: str, prompt_tokens: int, reused: int, made: int) -> list[Event]:
    """``capacity_exceeded`` for a turn that needed more rows than exist, else ``capacity_near`` for the next."""
    bound = bound_of(ctx.snapshot) if ctx.cache_outlives_call else None
    if bound is None:
        return []
    cap, max_new = bound.capacity, ctx.max_new_tokens
    layers = bound.layers
    base = {"capacity": cap, "prompt_tokens": prompt_tokens, "max_new_tokens": max_new}
    if status == "failed":
        need = prompt_tokens + max(int(max_new or 1), 1) - 1
        if need <= cap:
            return []
        return [Event(
            CAPACITY_EXCEEDED, "error", ctx.turn_index, ctx.first_step,
            f"turn {ctx.turn_index + 1} needed up to {need} cache rows ({prompt_tokens} prompt tokens + "
            f"{max_new if max_new else '?'} new − 1) but the cache has {cap} (max_cache_len); it failed after "
            f"{made} new token{'s' if made != 1 else ''}",
            _fix(need), layer=layers[0], layers=layers,
            data={**base, "needed": need, "held": bound.held, "new_tokens": made},
        )]
    if bound.held > cap:  # positions past the last row without an error (a version that clamps)
        return [Event(
            CAPACITY_EXCEEDED, "error", ctx.turn_index, ctx.first_step,
            f"layers {_ranges(layers)} have seen {bound.held} positions but hold only {cap} rows (max_cache_len)",
            _fix(bound.held + (max_new or 0)), layer=layers[0], layers=layers,
            data={**base, "needed": bound.held, "held": bound.held, "new_tokens": made},
        )]
    if status != "ok" or not max_new:
        return []
    growth = max(prompt_tokens - reused, 1)
    need_next = bound.held + growth + max_new
    if need_next <= cap:
        return []
    return [Event(
        CAPACITY_NEAR, "warn", ctx.turn_index, ctx.first_step,
        f"the cache holds {bound.held} of its {cap} rows; a next turn like this one ({growth} new input tokens "
        f"+ max_new_tokens {max_new}) needs up to {need_next} and will not fit",
        _fix(need_next), layer=layers[0], layers=layers,
        data={**base, "held": bound.held, "growth": growth, "needed_next": need_next, "free": cap - bound.held},
    )]
