"""Detectors: turn what the observer saw into named events, and the seed's per-turn checklist.

Every threshold here comes from token counts of the conversation itself (prompt length,
tokens generated, tokens already cached, the configured window), never from tuned
constants: an event fires when the cache holds something the conversation cannot explain.
See docs/detectors.md for each kind with the numbers it reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvinspect.core.detect.capacity import capacity_events
from kvinspect.core.detect.divergence import cause_phrase, classify
from kvinspect.core.detect.events import (
    CACHE_DISABLED,
    CACHE_FED_WITHOUT_USE_CACHE,
    CACHE_RECREATED,
    CHUNK_REACHED,
    CONFIG_OVERRIDE,
    CONTEXT_LIMIT,
    DUPLICATE_CONTEXT,
    PREFIX_DIVERGENCE,
    STATE_NOT_CROPPABLE,
    UNBOUNDED_WINDOW,
    WINDOW_REACHED,
    Event,
    _ranges,
)
from kvinspect.core.detect.layers import layers_disagree
from kvinspect.core.detect.provenance import describe, shown
from kvinspect.core.units import fmt_bytes


@dataclass
class TurnContext:
    """What the feeding loop knew around one turn; detectors read only this and the record.

    The feeder (ChatSession or ModelObserver) fills the fields above ``samples``; the turn
    pipeline fills the rest at the end of the turn.
    """

    turn_index: int
    policy: str
    cache_impl: str
    cached_before: int  # tokens the reused cache held before the turn (by our bookkeeping)
    prompt: list[int]
    prev_cache_id: int | None
    cached_ids_before: list[int] = field(default_factory=list)
    divergence_at: int | None = None
    cropped_from: int | None = None
    cropped_to: int | None = None
    crop_error: str | None = None
    created_reason: str | None = None
    state_not_croppable: list[int] = field(default_factory=list)  # recurrent layers that blocked a crop
    reused: int = 0
    config_collision: str | None = None
    config_cleared: bool = False
    config_source: str = ""  # where the colliding cache_implementation came from (provenance.describe)
    config_sources: dict = field(default_factory=dict)  # provenance.config_sources of this call, when known
    samples: list = field(default_factory=list)
    snapshot: Any = None
    new_ids: list[int] = field(default_factory=list)
    model_layers: list[dict] = field(default_factory=list)
    first_step: int = 0
    status: str = "ok"
    error: str = ""
    decode: Any = None  # optional callable ids -> text, for divergence excerpts
    max_positions: int | None = None  # the model's max_position_embeddings, when it has one
    max_new_tokens: int | None = None  # the turn's generation limit, when known (capacity projections)
    # False where generate() built the cache for this call alone (none passed in, none returned): no next turn
    # can reuse it, so nothing is predicted of its capacity.
    cache_outlives_call: bool = True
    fed_embeddings: bool = False  # the turn's prompt came as inputs_embeds: no ids to check the cache against
    opening: int | None = None  # tokens of the first prompt the reused cache took (divergence causes)
    special_ids: frozenset = frozenset()  # the tokenizer's special ids (divergence details)
    role: str = ""  # "draft": the turn is a draft model's share of another model's generate() call
    pad_tokens: list[int] = field(default_factory=list)  # left-padding positions of each batch row
    # Multimodal turns (core/detect/media.py); the pipeline fills them when the model has a vision tower.
    media_tokens: Any = None  # core.media.spans.ImageTokens
    media_fed: Any = None  # core.media.watch.FedMedia: what the vision tower encoded this turn
    media_before: list[dict] = field(default_factory=list)  # the continued cache's images (the last turn's media)
    media_known: list[str] | None = None  # the feeder's pixel hash of each image in the prompt, when it ran the processor
    media_sizes: list[list[int]] | None = None  # the feeder's [width, height] of each image in the prompt
    media: list[dict] = field(default_factory=list)  # this turn's images (the turn line's ``media``)
    media_changed: dict | None = None  # the feeder's prefix check ended at a changed picture (image, first, hashes)
    rope_deltas_cached: tuple | None = None  # M-RoPE: the rope_deltas this cache's last turn left on the model


def _attention_rows(ctx: TurnContext):
    """(index, attention, config_attention, window, storage) for each layer of this turn's cache."""
    if ctx.snapshot is not None and ctx.snapshot.layers:
        return [(lay.index, lay.attention, lay.config_attention, lay.window or _cfg_window(ctx, lay.index),
                 lay.storage, lay.capacity) for lay in ctx.snapshot.layers]
    return [(d["index"], d["config_attention"], d["config_attention"], d.get("window"), "dynamic", None)
            for d in ctx.model_layers]


def _cfg_window(ctx: TurnContext, i: int):
    if i < len(ctx.model_layers):
        return ctx.model_layers[i].get("window")
    return None


def conversation_tokens(ctx: TurnContext) -> int:
    """Tokens a correct cache has seen after this turn: the prompt plus the reply, less the last token."""
    return len(ctx.prompt) + max(len(ctx.new_ids) - 1, 0)


def detect_turn(ctx: TurnContext, record) -> list[Event]:
    events: list[Event] = layers_disagree(ctx)  # the snapshot checks the per-step grouping (cache/layer_groups.py)
    samples = ctx.samples
    step0 = ctx.first_step
    cached = [s for s in samples if s.cache_id]
    made = len(ctx.new_ids)
    capacity = capacity_events(ctx, ctx.status, len(ctx.prompt), ctx.reused, made)
    if ctx.status == "failed" and not samples:
        if ctx.config_collision and not ctx.config_cleared:
            events.append(_config_event(ctx, failed=True))
        return events + capacity

    # -- cache disabled -------------------------------------------------------------------
    if samples and not cached:
        q = [s.q_len for s in samples]
        events.append(Event(
            CACHE_DISABLED, "warn", ctx.turn_index, step0,
            f"no KV cache during this turn: each of the {len(samples)} forward passes re-read the whole "
            f"sequence (query length {q[0]} → {q[-1]}, {sum(q)} token positions computed instead of "
            f"{len(ctx.prompt) + len(samples) - 1})",
            "Pass use_cache=True (the default) and, across turns, one cache object; use_cache=False only as a slow baseline.",
            data={"forwards": len(samples), "q_len_first": q[0], "q_len_last": q[-1], "positions": int(sum(q))},
        ))

    # -- config override --------------------------------------------------------------------
    if ctx.config_collision:
        events.append(_config_event(ctx, failed=ctx.status == "failed" and not ctx.config_cleared))

    # -- context limit --------------------------------------------------------------------------
    limit_event = _context_limit_event(ctx, cached)
    if limit_event is not None:
        events.append(limit_event)

    if not cached:
        return events

    ids = [s.cache_id for s in cached]
    first_id = ids[0]

    # -- cache recreated ----------------------------------------------------------------------
    if ctx.prev_cache_id and ctx.prev_cache_id not in ids:
        prefill = cached[0].q_len
        reusable = min(_lcp(ctx.cached_ids_before, ctx.prompt), max(len(ctx.prompt) - 1, 0)) if ctx.cached_ids_before else 0
        if ctx.media_changed is not None:  # the ids agree further, the pictures do not
            reusable = min(reusable, ctx.media_changed["first"])
        why = ctx.created_reason or "the code built or received a different cache object"
        msg = (f"turn {ctx.turn_index + 1} used a new cache object (#{first_id}, previous #{ctx.prev_cache_id}): "
               f"{why}; the prefill encoded {prefill} of {len(ctx.prompt)} prompt tokens")
        if reusable:
            msg += f", although {reusable} were already in the previous cache"
        events.append(Event(
            CACHE_RECREATED, "warn", ctx.turn_index, step0, msg,
            "Create the cache once, outside the chat loop, and pass the same object every turn."
            if not ctx.crop_error else
            "Make the chat template render history exactly as it was generated, so the cached prefix stays valid.",
            data={"cache_id": first_id, "previous_cache_id": ctx.prev_cache_id, "prefill_tokens": prefill,
                  "prompt_tokens": len(ctx.prompt), "reusable_tokens": reusable, "reason": why},
        ))
    elif len(set(ids)) > 1:
        events.append(Event(
            CACHE_RECREATED, "warn", ctx.turn_index, step0 + _first_index(samples, lambda s: s.cache_id == ids[-1]),
            f"the cache object changed within turn {ctx.turn_index + 1} (#{' → #'.join(map(str, dict.fromkeys(ids)))})",
            "One generate() call should use one cache object.", data={"cache_ids": list(dict.fromkeys(ids))},
        ))
    elif ctx.prev_cache_id and first_id == ctx.prev_cache_id and ctx.cropped_from is None:
        # Same object, but it holds fewer tokens than before the turn: someone reset or cropped it.
        seen0 = _max_seen(cached[0]) - cached[0].q_len
        if ctx.cached_before and seen0 < ctx.cached_before and ctx.policy not in ("refeed",):
            events.append(Event(
                CACHE_RECREATED, "warn", ctx.turn_index, step0,
                f"the cache was reset: it held {ctx.cached_before} tokens after the last turn but {max(seen0, 0)} "
                f"when this turn started",
                "Do not reset or re-initialise the cache between turns; crop only to the common prefix.",
                data={"before": ctx.cached_before, "at_start": int(max(seen0, 0))},
            ))

    if ctx.state_not_croppable:
        events.append(Event(
            STATE_NOT_CROPPABLE, "warn", ctx.turn_index, step0,
            f"the prompt diverges from the cache at token {ctx.divergence_at if ctx.divergence_at is not None else len(ctx.prompt) - 1}"
            f" of {ctx.cached_before}, and the recurrent state of layers {', '.join(map(str, ctx.state_not_croppable))} "
            "cannot be "
            f"rolled back to a shorter prefix: a new cache re-prefilled all {len(ctx.prompt)} tokens",
            "Render history exactly as it was generated so the next prompt extends the cached tokens; "
            "a recurrent state only ever moves forward.",
            layer=ctx.state_not_croppable[0], layers=list(ctx.state_not_croppable),
            data={"cached": ctx.cached_before, "position": ctx.divergence_at, "prompt_tokens": len(ctx.prompt)},
        ))

    # -- fed without use_cache ----------------------------------------------------------------------
    fed_off = [s for s in cached if s.use_cache is False]
    fed_without = False
    if fed_off:
        grow = _max_seen(fed_off[-1]) - (_max_seen(fed_off[0]) - fed_off[0].q_len)
        fed_without = True
        events.append(Event(
            CACHE_FED_WITHOUT_USE_CACHE, "error", ctx.turn_index, step0,
            f"a cache object was passed with use_cache=False and still took every forward's whole input: it grew by "
            f"{grow} tokens over {len(fed_off)} forward passes, where the conversation added {len(ctx.prompt) - ctx.reused + max(len(ctx.new_ids) - 1, 0)}",
            "Either pass the cache with use_cache=True, or pass no cache at all; never both a cache and use_cache=False.",
            data={"growth": int(grow), "forwards": len(fed_off)},
        ))

    # -- duplicate context ---------------------------------------------------------------------
    if not fed_without and ctx.status != "failed":
        expected = conversation_tokens(ctx)
        seen_end = _max_seen(end_rows(ctx, cached))
        if seen_end > expected:
            events.append(Event(
                DUPLICATE_CONTEXT, "error", ctx.turn_index, step0,
                f"the cache has seen {seen_end} tokens but the conversation has only {expected} "
                f"(prompt {len(ctx.prompt)} + {len(ctx.new_ids)} new − 1): {seen_end - expected} tokens were fed twice",
                "Feed only the tokens after the cached prefix (or give generate() the full ids with the cache: "
                "it slices the cached part off itself); never re-encode the whole history onto a filled cache.",
                data={"seen": int(seen_end), "expected": int(expected), "duplicated": int(seen_end - expected)},
            ))

    # -- prefix divergence ---------------------------------------------------------------------
    if ctx.divergence_at is not None and ctx.media_changed is None:  # a changed picture: core/detect/media.py
        n = ctx.divergence_at
        if ctx.crop_error:
            what = f"cropping failed ({ctx.crop_error}), so a new cache re-prefilled all {len(ctx.prompt)} tokens"
        else:
            what = f"the cache was cropped from {ctx.cropped_from} to {ctx.cropped_to} tokens and the rest re-prefilled"
        d = classify(ctx.cached_ids_before, ctx.prompt, n, opening=ctx.opening, decode=ctx.decode,
                     special_ids=ctx.special_ids)
        context = d.context("prompt")
        events.append(Event(
            PREFIX_DIVERGENCE, "warn", ctx.turn_index, step0,
            f"the re-rendered prompt differs from the cached tokens at position {n} of {ctx.cached_before}: "
            f"{cause_phrase(d, len(ctx.prompt))}{f' ({context})' if context else ''}; {what}",
            d.fix + " kvinspect checked the prefix, so the reply is right; the re-prefill is the cost.",
            data={"position": n, "cached": ctx.cached_before, "cropped_to": ctx.cropped_to,
                  "recreated": bool(ctx.crop_error), **d.data()},
        ))

    # -- windows: reached (info) and unbounded (warn) ---------------------------------------------
    events += _window_events(ctx, record, cached)
    return events + capacity


def _context_limit_event(ctx: TurnContext, cached) -> Event | None:
    """Positions past max_position_embeddings: RoPE models do not raise there, their output degrades."""
    limit = ctx.max_positions
    if not limit or not ctx.samples:
        return None
    # The highest position this turn computed: the conversation, or more where context was fed twice.
    positions = conversation_tokens(ctx)
    if cached:
        positions = max(positions, _max_seen(end_rows(ctx, cached)))
    if positions <= limit:
        return None
    over = [i for i, s in enumerate(ctx.samples) if (_max_seen(s) if s.cache_id else 0) > limit]
    return Event(
        CONTEXT_LIMIT, "warn", ctx.turn_index, ctx.first_step + (over[0] if over else 0),
        f"turn {ctx.turn_index + 1} used positions up to {positions}, past the model's max_position_embeddings "
        f"({limit}): {positions - limit} positions the model was never trained on",
        "Keep the conversation under the model's context length: drop or summarise old turns before it passes "
        f"{limit} tokens (a sliding window bounds memory, not positions).",
        data={"positions": int(positions), "max_position_embeddings": int(limit)},
    )


def _config_event(ctx: TurnContext, failed: bool) -> Event:
    impl = ctx.config_collision
    where = f" ({ctx.config_source})" if ctx.config_source else " (from the checkpoint or an override)"
    if failed:
        msg = (f"generation_config.cache_implementation={impl!r}{where} collides with the cache object passed to "
               f"generate(), which refused to run")
        sev = "error"
    else:
        msg = (f"generation_config.cache_implementation={impl!r}{where} would make "
               f"generate() reject the cache passed to it; kvinspect cleared it for this call")
        sev = "warn"
    return Event(CONFIG_OVERRIDE, sev, ctx.turn_index, ctx.first_step, msg,
                 "Set model.generation_config.cache_implementation = None before passing your own cache "
                 "(or drop the cache and let generate() build the configured one).",
                 data={"cache_implementation": impl, "cleared": ctx.config_cleared})


def _lcp(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _max_seen(sample) -> int:
    s = sample.seen
    return int(s.max()) if len(s) else 0


class _EndRows:
    """Per-layer seen / stored when the turn ended, read from the end-of-turn snapshot.

    The last forward's rows are not the end of a turn: ``generate()`` edits the cache after its last
    forward (rejected drafts cropped, beams reordered), so every end-of-turn judgement reads this."""

    __slots__ = ("seen", "stored", "cache_id", "q_len")

    def __init__(self, seen, stored, cache_id: int):
        self.seen, self.stored, self.cache_id, self.q_len = seen, stored, cache_id, 0


def end_rows(ctx: TurnContext, cached):
    """The turn's end state: its snapshot's seen/stored when it has one for the cache it used, else the last forward."""
    snap = ctx.snapshot
    last = cached[-1]
    if snap is None or not snap.layers or snap.cache_id != last.cache_id or len(snap.layers) != len(last.seen):
        return last
    seen = np.array([lay.seen if lay.seen is not None else -1 for lay in snap.layers])
    stored = np.array([lay.stored if lay.stored is not None else -1 for lay in snap.layers])
    return _EndRows(seen, stored, last.cache_id)


def _first_index(samples, pred) -> int:
    for i, s in enumerate(samples):
        if pred(s):
            return i
    return 0


def _window_events(ctx: TurnContext, record, cached) -> list[Event]:
    out: list[Event] = []
    rows = _attention_rows(ctx)
    if not rows:
        return out
    seen = np.stack([s.seen for s in cached])
    stored = np.stack([s.stored for s in cached])
    cache_id = cached[-1].cache_id
    end = end_rows(ctx, cached)
    # By position, not samples.index(): that is O(n²) per turn and compares numpy fields.
    step_of = [ctx.first_step + k for k, s in enumerate(ctx.samples) if s.cache_id]
    already = {(e.kind, e.data.get("cache_id"), lay) for e in record.events for lay in e.layers
               if e.kind in (WINDOW_REACHED, CHUNK_REACHED, UNBOUNDED_WINDOW)}
    groups: dict[tuple, list[int]] = {}
    unbounded: dict[tuple, list[int]] = {}
    for (i, attention, cfg_attention, window, storage, capacity) in rows:
        if i >= seen.shape[1]:
            continue
        col_seen, col_stored = seen[:, i], stored[:, i]
        if attention in ("sliding", "chunked"):
            stalled = np.nonzero(col_seen > col_stored)[0]
            if len(stalled) == 0:
                continue
            j = int(stalled[0])
            kind = CHUNK_REACHED if attention == "chunked" else WINDOW_REACHED
            if (kind, cache_id, i) in already:
                continue
            # A forward fed several tokens (a prefill, drafts to verify) holds them all until the call trims the
            # layer back: the plateau is what the layer keeps between calls, the end state's where it got there.
            kept = int(col_stored[j])
            if i < len(end.stored) and end.seen[i] > end.stored[i] >= 0:
                kept = min(kept, int(end.stored[i]))
            groups.setdefault((kind, j, window, kept), []).append(i)
        elif cfg_attention in ("sliding", "chunked") and window:
            over = np.nonzero(col_stored >= window)[0]
            if len(over) == 0 or (UNBOUNDED_WINDOW, cache_id, i) in already:
                continue
            unbounded.setdefault((int(over[0]), window, cfg_attention), []).append(i)
    for (kind, j, window, rows_kept), layers in sorted(groups.items(), key=lambda kv: kv[0][1]):
        s = cached[j]
        word = "chunk" if kind == CHUNK_REACHED else "window"
        attn = "chunked" if kind == CHUNK_REACHED else "sliding"
        msg = (f"layers {_ranges(layers)} ({attn}, {word} {window}) stopped growing at {rows_kept} stored tokens "
               f"while seen keeps growing ({int(s.seen[layers[0]])} at this step)")
        if kind == CHUNK_REACHED:
            msg += f"; a query attends back only to the start of its {window}-token chunk"
        out.append(Event(
            kind, "info", ctx.turn_index, step_of[j], msg,
            "Expected: the model was trained this way. Memory for these layers stays flat from here on.",
            layer=layers[0], layers=layers,
            data={"cache_id": cache_id, "window": window, "stored": rows_kept, "seen": int(s.seen[layers[0]])},
        ))
    for (j, window, cfg_attention), layers in sorted(unbounded.items()):
        s = cached[j]
        out.append(Event(
            UNBOUNDED_WINDOW, "warn", ctx.turn_index, step_of[j],
            f"layers {_ranges(layers)} are {cfg_attention} with a window of {window} in the model config, but their "
            f"cache keeps everything: {int(s.stored[layers[0]])} tokens stored (≥ window)",
            "Build the cache with the model config (DynamicCache(config=model.config)) so sliding layers keep only "
            "their window; output is the same, memory is not.",
            layer=layers[0], layers=layers,
            data={"cache_id": cache_id, "window": window, "stored": int(s.stored[layers[0]])},
        ))
    return out


# -- checklist -----------------------------------------------------------------------------------

def _item(key: str, title: str, status: str, evidence: str) -> dict:
    return {"key": key, "title": title, "status": status, "evidence": evidence}


def turn_checklist(ctx: TurnContext, events: list[Event]) -> list[dict]:
    """The seed's four observables, in its order: switch/object, length, window, where the KV lives; then
    whether the cache object and the generation config agree (with where the config's values came from)."""
    # An info event transformers' own behaviour explains (a workaround the program applies) fails no item.
    kinds = {e.kind for e in events if not (e.severity == "info" and e.data.get("origin") == "library")}
    cached = [s for s in ctx.samples if s.cache_id]
    items = []

    # 1. cache object present and the same as last turn
    if ctx.role == "draft" and cached:
        # generate() builds the draft's cache for each call and crops it to the accepted tokens itself.
        end = end_rows(ctx, cached)
        items.append(_item("cache_object", "Cache object present and reused", "pass",
                           f"#{cached[-1].cache_id}: the draft model's cache, built by generate() for this call"))
        items.append(_item("length", "Cache length matches the conversation", "pass",
                           f"draft model: it has seen {_max_seen(end)} tokens, its drafts cropped by generate(); "
                           f"the conversation is judged on the main model"))
    elif ctx.status == "failed" and not ctx.samples:
        items.append(_item("cache_object", "Cache object present and reused", "fail", f"turn failed: {ctx.error}"))
    elif not cached:
        items.append(_item("cache_object", "Cache object present and reused", "fail",
                           "no cache object in any forward pass (use_cache=False or no cache)"))
    elif CACHE_FED_WITHOUT_USE_CACHE in kinds:
        items.append(_item("cache_object", "Cache object present and reused", "fail",
                           f"cache #{cached[-1].cache_id} passed with use_cache=False"))
    elif CACHE_RECREATED in kinds:
        items.append(_item("cache_object", "Cache object present and reused", "fail" if not ctx.crop_error else "warn",
                           f"new object #{cached[-1].cache_id} (previous #{ctx.prev_cache_id}): "
                           f"{ctx.created_reason or 'recreated'}"))
    else:
        same = "same object as last turn" if ctx.prev_cache_id == cached[-1].cache_id else "created this turn"
        reuse = ("the prompt came as embeddings: its reuse is not checkable" if ctx.fed_embeddings
                 else f"reused {ctx.reused} of {len(ctx.prompt)} prompt tokens")
        items.append(_item("cache_object", "Cache object present and reused", "pass",
                           f"#{cached[-1].cache_id} ({same}); {reuse}"))

    # 2. length per layer vs expected from the token count
    expected = conversation_tokens(ctx)
    if ctx.role == "draft" and cached:
        pass
    elif not cached:
        items.append(_item("length", "Cache length matches the conversation", "warn",
                           f"nothing cached; the conversation has {expected} tokens"))
    else:
        last = end_rows(ctx, cached)
        bad: list[int] = []
        detail: list[str] = []
        for (i, attention, _cfg, window, storage, capacity) in _attention_rows(ctx):
            if i >= len(last.seen) or last.seen[i] < 0:
                continue
            seen_i, stored_i = int(last.seen[i]), int(last.stored[i])
            if attention in ("sliding", "chunked") and window:
                cap = capacity or window
                want_stored = min(expected, cap if storage == "static" else window - 1)
            else:
                want_stored = expected
            pads = ctx.pad_tokens[0] if ctx.pad_tokens and storage == "static" else 0
            if pads and seen_i == expected - pads and stored_i == want_stored - pads:
                # A 4.x static layer counts its non-zero rows: row 0's left padding (zero keys) is not among them.
                continue
            if seen_i != expected or stored_i != want_stored:
                bad.append(i)
                if len(detail) < 3:
                    detail.append(f"layer {i}: seen {seen_i}, stored {stored_i} (want {expected}/{want_stored})")
        if ctx.status == "failed":
            items.append(_item("length", "Cache length matches the conversation", "warn", "turn failed; not checked"))
        elif ctx.fed_embeddings:
            items.append(_item("length", "Cache length matches the conversation", "warn",
                               f"not checkable: the call gave embeddings (inputs_embeds), not ids; every layer has "
                               f"seen up to {_max_seen(last)} tokens"))
        elif bad:
            items.append(_item("length", "Cache length matches the conversation", "fail",
                               f"{len(bad)} layer{'s' if len(bad) != 1 else ''} off: " + "; ".join(detail)))
        else:
            evidence = f"every layer has seen {expected} tokens (prompt {len(ctx.prompt)} + {len(ctx.new_ids)} new − 1)"
            untimed = sorted({r[1] for r in _attention_rows(ctx) if r[1] in ("state", "shared")})
            if untimed:
                evidence = evidence.replace("every layer", "every token-holding layer") + (
                    f"; {' and '.join(untimed)} layers hold no tokens and are not counted")
            if ctx.max_positions and expected > ctx.max_positions:
                items.append(_item("length", "Cache length matches the conversation", "warn",
                                   f"{evidence}, past the model's max_position_embeddings ({ctx.max_positions})"))
            else:
                items.append(_item("length", "Cache length matches the conversation", "pass", evidence))

    # 3. attention windows and whether each layer reached them
    rows = [r for r in _attention_rows(ctx) if (r[2] in ("sliding", "chunked") or r[1] in ("sliding", "chunked"))
            and r[1] not in ("shared", "state")]  # a shared layer reads its producer's window; it keeps none
    # The unbounded_window event fires once per cache object; the checklist states every turn.
    last = end_rows(ctx, cached) if cached else None
    unbounded = [r for r in rows if last is not None and r[1] == "full" and r[3] and r[0] < len(last.stored)
                 and last.stored[r[0]] >= r[3]]
    if UNBOUNDED_WINDOW in kinds:
        ev = next(e for e in events if e.kind == UNBOUNDED_WINDOW)
        items.append(_item("window", "Attention window applied", "warn", ev.message))
    elif unbounded:
        ls = [r[0] for r in unbounded]
        assert last is not None  # unbounded is empty without it
        items.append(_item("window", "Attention window applied", "warn",
                           f"layers {_ranges(ls)} are {unbounded[0][2]} with a window of {unbounded[0][3]} in the model "
                           f"config, but their cache keeps everything: {int(last.stored[ls[0]])} tokens stored"))
    elif not rows:
        items.append(_item("window", "Attention window applied", "pass", "no sliding or chunked layers: all full attention"))
    elif not cached:
        # No cache object: nothing stores anything, so "not reached yet" would be wrong.
        windows = sorted({r[3] for r in rows if r[3]})
        items.append(_item("window", "Attention window applied", "warn",
                           f"no cache this turn, so no window could apply (the model's window: "
                           f"{', '.join(map(str, windows)) or 'unknown'}); every step re-read the whole sequence"))
    else:
        last = end_rows(ctx, cached)
        groups: dict[tuple, list[int]] = {}
        for (i, attention, _cfg, window, _storage, _capacity) in rows:
            reached = i < len(last.seen) and last.seen[i] > last.stored[i]
            groups.setdefault((attention, window, reached), []).append(i)
        text = "; ".join(
            f"layers {_ranges(ls)} {att} {window}: {'reached' if r else 'not reached yet'}"
            for (att, window, r), ls in groups.items()
        )
        items.append(_item("window", "Attention window applied", "pass", text))

    # 4. where the KV lives
    items.append(_device_item(ctx, cached))
    # 5. the cache object and the generation config agree (and where the config's values came from)
    items.append(_config_item(ctx, kinds, cached))
    return items


def _config_item(ctx: TurnContext, kinds: set[str], cached) -> dict:
    title = "Cache object matches config"
    src = ctx.config_sources or {}
    where = "; ".join(f"{k} {shown(v.get('value'))} {describe(v)}" for k, v in src.items()) or "config sources unknown"
    if CONFIG_OVERRIDE in kinds:
        status = "fail" if ctx.status == "failed" and not ctx.config_cleared else "warn"
        origin = f" ({ctx.config_source})" if ctx.config_source else ""
        return _item("config", title, status, f"cache_implementation={ctx.config_collision!r}{origin} collides "
                                              f"with the cache object passed; {where}")
    cls = ctx.snapshot.cache_class if ctx.snapshot is not None and cached else "no cache object"
    return _item("config", title, "pass", f"{cls}; {where}")


def _device_item(ctx: TurnContext, cached) -> dict:
    snap = ctx.snapshot
    if snap is None or not snap.layers or not cached:
        return _item("device", "Where the KV lives", "warn", "no cache to measure")
    by_dev = snap.bytes_by_device()
    where = ", ".join(f"{d}: {fmt_bytes(b)}" for d, b in sorted(by_dev.items())) or "empty"
    evidence = f"{where}; logical {fmt_bytes(snap.bytes)}, held {fmt_bytes(snap.held_bytes)}"
    if snap.offloading:
        evidence += " (offloading on: layers rest on the CPU between uses)"
    return _item("device", "Where the KV lives", "pass", evidence)

