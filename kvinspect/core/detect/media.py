"""Images in the cache: each turn's image spans (the turn line's ``media``) and the multimodal mistakes.

Written once for both loops: the turn pipeline calls :func:`turn_media` and :func:`media_events`
with what the feeder knew (the prompt ids, how many were reused, the images it processed, if it
ran the processor) and what the vision tower was fed (core/media/watch.py).

The fed images are matched to the prompt's spans from the end: a call feeds the images of its
uncached suffix, so the last fed image is the last span's. Any fed image beyond the uncached
spans belongs to a span the cache already holds: encoded again (same pixels) or changed (other
pixels under the same ids).
"""

from __future__ import annotations

from kvinspect.core.detect.detectors import TurnContext
from kvinspect.core.detect.events import (
    CROP_INSIDE_IMAGE,
    IMAGE_CAUSAL,
    MEDIA_FED_AS_TEXT,
    MEDIA_REENCODED,
    PREFIX_DIVERGENCE,
    ROPE_DELTAS_STALE,
    Event,
)
from kvinspect.core.media.spans import find_spans, held_rows, lone_placeholders


def _short(h: str) -> str:
    return f"#{h[:4]}" if h else "#?"


def turn_media(ctx: TurnContext, turn_index: int) -> list[dict]:
    """This turn's images: span, pixel hash, size, whether the vision tower encoded it now (``held`` comes later)."""
    tokens, fed = ctx.media_tokens, ctx.media_fed
    if tokens is None:
        return []
    spans = find_spans(ctx.prompt, tokens)
    before = {m["first"]: m for m in ctx.media_before if isinstance(m.get("first"), int)}
    hashes = fed.hashes if fed is not None else []
    offset = len(spans) - len(hashes)  # fed image j is span offset + j
    out = []
    for k, sp in enumerate(spans):
        cached = before.get(sp.first) if sp.first < ctx.reused else None
        j = k - offset
        fed_hash = hashes[j] if 0 <= j < len(hashes) else ""
        known = ctx.media_known[k] if ctx.media_known is not None and k < len(ctx.media_known) else ""
        # What the cache rows of this image were computed from: the cached image's pixels while they are reused.
        held_hash = cached.get("hash", "") if cached is not None else (fed_hash or known)
        m = {"image": k, "turn": cached.get("turn", turn_index) if cached is not None else turn_index,
             "first": sp.first, "last": sp.last, "tokens": sp.tokens, "wrap_first": sp.wrap_first,
             "wrap_last": sp.wrap_last, "hash": held_hash, "encoded": bool(fed_hash)}
        size = ctx.media_sizes[k] if ctx.media_sizes is not None and k < len(ctx.media_sizes) else None
        if size is None and cached is not None:
            size = cached.get("size")
        if size is not None:
            m["size"] = list(size)
        now = known or fed_hash
        if cached is not None and now and now != held_hash:
            m["hash_given"] = now  # the picture the program holds now, under the same ids
        out.append(m)
    return out


def add_held(media: list[dict], layers: list[dict]) -> None:
    """Each image's rows each layer still stores (a sliding layer keeps the last ``stored`` of ``seen``)."""
    for m in media:
        m["held"] = [held_rows(m["first"], m["last"], int(lay.get("seen", 0)), int(lay.get("stored", 0)))
                     for lay in layers]


def media_events(ctx: TurnContext) -> list[Event]:
    tokens, fed = ctx.media_tokens, ctx.media_fed
    if tokens is None:
        return []
    events: list[Event] = []
    step = ctx.first_step
    t = ctx.turn_index
    reused = ctx.reused
    media = ctx.media
    fed_n = len(fed.hashes) if fed is not None else 0
    new = [m for m in media if m["first"] >= reused]

    # -- a placeholder fed as text ------------------------------------------------------------------
    lone = lone_placeholders(ctx.prompt, tokens, reused)
    unencoded = [m for m in new if not m["encoded"]]
    if lone or (unencoded and fed_n == 0 and not (fed is not None and fed.features_given)):
        where = lone[0] if lone else unencoded[0]["first"]
        what = (f"{len(lone)} image placeholder token(s) at position {where} with no image tokens after them"
                if lone else f"{len(unencoded)} image span(s) from position {where} and no image features")
        events.append(Event(
            MEDIA_FED_AS_TEXT, "error", t, step,
            f"an image was fed as text: {what}; the vision tower never ran, so the model answered without the "
            "picture, and nothing failed",
            "Send image turns through the processor (processor(text=..., images=...)), not the tokenizer alone: it "
            "expands each placeholder into the image's tokens and returns pixel_values to pass on.",
            data={"position": int(where), "placeholders": lone[:16], "spans": len(unencoded)}))

    # -- images encoded again, or changed under the same ids ---------------------------------------------
    cached_spans = [m for m in media if m["first"] < reused]
    extra = fed_n - sum(1 for m in new if m["encoded"])
    again = cached_spans[-extra:] if extra > 0 else []
    same = [m for m in again if not m.get("hash_given")]
    if same:
        m0 = same[0]
        failed = " and the call failed on it" if ctx.status == "failed" else ""
        events.append(Event(
            MEDIA_REENCODED, "warn", t, step,
            f"the vision tower encoded {len(same)} image(s) the cache already holds (image {m0['image'] + 1} "
            f"{_short(m0['hash'])}, positions {m0['first']}–{m0['last']}){failed}: their rows were computed in turn "
            f"{m0['turn'] + 1}",
            "With a reused cache pass pixel_values only for the images after the cached prefix (the uncached "
            "suffix's), or run the processor on the new turn only.",
            data={"images": [m["image"] for m in same], "position": m0["first"], "encoded": fed_n}))
    for m in media:
        if m["first"] < reused and m.get("hash_given"):
            events.append(Event(
                PREFIX_DIVERGENCE, "error", t, step,
                f"image {m['image'] + 1} changed under the same token ids: the cache holds {_short(m['hash'])} "
                f"from turn {m['turn'] + 1}, the program now has {_short(m['hash_given'])}; the ids agree, so the "
                f"common prefix counted positions {m['first']}–{m['last']} as cached, but the true divergence is at "
                f"position {m['first']}, the image's first token",
                "Compare the images' pixel hashes, not only the ids: crop the cache to the changed image's first "
                "token and feed it (its pixels) and everything after it again.",
                data={"cause": "media_changed", "position": m["first"], "image": m["image"],
                      "cached_hash": m["hash"], "given_hash": m["hash_given"], "span": [m["first"], m["last"]]}))

    mc = ctx.media_changed
    if mc is not None:
        if ctx.crop_error:
            what = f"cropping failed ({ctx.crop_error}), so a new cache re-prefilled all {len(ctx.prompt)} tokens"
        else:
            what = f"the cache was cropped to {mc['first']} tokens and the rest re-prefilled with the new picture"
        events.append(Event(
            PREFIX_DIVERGENCE, "warn", t, step,
            f"image {mc['image'] + 1} changed under the same token ids ({_short(mc['cached_hash'])} in the cache, "
            f"{_short(mc['given_hash'])} now): the prompt diverges at position {mc['first']}, the image's first token, "
            f"though the ids agree there; {what}",
            "kvinspect compared the pictures, so the reply is right; the re-prefill is the cost.",
            data={"cause": "media_changed", "position": mc["first"], "image": mc["image"],
                  "cached_hash": mc["cached_hash"], "given_hash": mc["given_hash"],
                  "span": [mc["first"], mc["last"]], "recreated": bool(ctx.crop_error)}))

    # -- a crop inside an image span ----------------------------------------------------------------------
    for m in media:
        if m["first"] < reused <= m["last"]:
            events.append(Event(
                CROP_INSIDE_IMAGE, "error", t, step,
                f"the cache was continued from position {reused}, inside image {m['image'] + 1}'s span "
                f"({m['first']}–{m['last']}, {m['tokens']} tokens): an image's tokens must be fed together",
                "Crop before the image's first token and feed its whole span with its pixels.",
                data={"position": reused, "image": m["image"], "span": [m["first"], m["last"]]}))

    # -- image block run causally -------------------------------------------------------------------------
    if tokens.bidirectional and new and fed is not None:
        tt = fed.token_types
        # generate() hands the whole sequence's token types to the prefill (the mask reads them by position);
        # a manual forward of the suffix gives the suffix's.
        base = 0 if tt is not None and len(tt) == len(ctx.prompt) else reused
        missing = []
        for m in new:
            lo, hi = m["first"] - base, m["last"] - base
            if tt is None or len(tt) <= hi or not all(tt[lo:hi + 1]):
                missing.append(m)
        if missing:
            m0 = missing[0]
            events.append(Event(
                IMAGE_CAUSAL, "warn", t, step,
                f"image {m0['image'] + 1} (positions {m0['first']}–{m0['last']}) was prefilled without token_type_ids "
                "marking it: its tokens attended causally instead of to each other, and nothing failed",
                "Pass the processor's token_type_ids with the input ids (generate(**inputs) does); they mark the image "
                "block this model attends to both ways.",
                data={"images": [m["image"] for m in missing], "position": m0["first"],
                      "token_type_ids": tt is not None}))
    return events


def rope_events(ctx: TurnContext) -> list[Event]:
    """M-RoPE (Qwen2-VL style): a turn continued a cache with the rope_deltas another prefill left on the model.

    generate() keeps the model's stored ``rope_deltas`` for a call that continues a cache with no new image,
    so they must be the ones this cache's prefill computed."""
    fed, held = ctx.media_fed, ctx.rope_deltas_cached
    if fed is None or fed.rope_deltas is None or held is None or not ctx.reused:
        return []
    if any(m["first"] >= ctx.reused for m in ctx.media) or fed.rope_deltas == held:
        return []  # a new image in the fed part: the call computed the positions again
    return [Event(
        ROPE_DELTAS_STALE, "warn", ctx.turn_index, ctx.first_step,
        f"this turn continued a cache whose prefill left rope_deltas {list(held)}, but the model held "
        f"{list(fed.rope_deltas)} from another prefill since: every new position is off by "
        f"{abs(fed.rope_deltas[0] - held[0])}, and nothing failed",
        "rope_deltas live on the model, not in the cache: before continuing one conversation after another "
        "prefill, set model.model.rope_deltas back to this cache's (or keep one model per conversation).",
        data={"cached": list(held), "used": list(fed.rope_deltas)})]


def failure_reason(ctx: TurnContext) -> str | None:
    """The one line a failed turn gets when an image was passed for rows the cache already holds."""
    if ctx.status != "failed":
        return None
    reused = ctx.reused
    fed_n = len(ctx.media_fed.hashes) if ctx.media_fed is not None else 0
    new_encoded = sum(1 for m in ctx.media if m["first"] >= reused and m["encoded"])
    extra = fed_n - new_encoded
    if extra <= 0:
        return None
    again = [m for m in ctx.media if m["first"] < reused][-extra:]
    changed = sum(1 for m in again if m.get("hash_given"))
    what = (f"{changed} of them a changed picture under ids the cache holds for the old one" if changed == extra else
            f"{extra} of them the cache already holds" if not changed else
            f"{extra} of them the cache already holds ({changed} changed since)")
    return f"{fed_n} image(s) were encoded for a call whose uncached suffix holds {new_encoded} image span(s): {what}"
