"""Detection on what observed user code actually did, token by token.

kvinspect's own :class:`~kvinspect.core.session.chat.ChatSession` knows the prompt it rendered and the ids it
cached. Observed code tells us nothing, so :class:`TokenBook` keeps, per cache object, the
token ids that object holds: every forward appends the ids it fed, and a forward that starts
at a shorter length than the book says means the user cropped or reset the cache. From
that book, three checks read the tokens themselves rather than guessing from counts:

- **re-fed context** (``duplicate_context``): a forward whose ids begin with what the cache
  already holds from position 0 — the whole held sequence, or at least the cache's opening
  prompt (a new message cannot repeat the whole first prompt by chance; a template header
  alone can).
- **prefix divergence** (``prefix_divergence``): ``generate()`` was given ids that differ from
  the held ids at position N; it slices the cached part off by length and continues from
  the wrong context.
- **continuation**: a turn whose prompt reproduces the previous turn's prompt *and* part of
  its reply continues that conversation; only then is a new cache object a mistake
  (``cache_recreated``). An unrelated prompt with a fresh cache is a new conversation.

Everything else (cache disabled, fed with ``use_cache=False``, window events, the checklist)
comes from :func:`.detectors.detect_turn` on a :class:`.detectors.TurnContext` built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvinspect.core.detect.detectors import TurnContext, detect_turn
from kvinspect.core.detect.divergence import cause_phrase, classify
from kvinspect.core.detect.events import CACHE_DISABLED, DUPLICATE_CONTEXT, PREFIX_DIVERGENCE, Event

UNKNOWN = -1  # a token the cache holds that no observed forward fed (filled before observation)


@dataclass
class Fed:
    """One forward pass as the token checks need it."""

    step: int
    cache_id: int
    q_len: int
    use_cache: bool | None
    before: int  # tokens the cache had seen before this forward (from the probe: seen − q_len)
    ids: list[int] | None  # batch row 0; None for inputs_embeds


@dataclass
class TurnTokens:
    """What the token book found in one turn."""

    prompt: list[int] = field(default_factory=list)
    new_ids: list[int] = field(default_factory=list)
    held_before: int = 0  # tokens the turn's cache held (by the book) before its first forward
    reused: int = 0  # ... of which kept (after any crop the user made)
    cropped_from: int | None = None
    cropped_to: int | None = None
    duplicates: list[tuple[int, int, int, int]] = field(default_factory=list)  # (step, cache_id, position, count)
    divergence: tuple[int, int, int] | None = None  # (step, cache_id, position)
    divergence_ids: tuple[list[int], list[int]] | None = None  # (held, given) around the position
    divergence_full: tuple[list[int], list[int], int | None] | None = None  # (held, given, opening) to classify
    fed_without_use_cache: bool = False
    first_cache_id: int = 0


class TokenBook:
    """Token ids held by each cache object of one model, as far as the observer saw them."""

    def __init__(self) -> None:
        self.held: dict[int, list[int]] = {}
        self.opening: dict[int, int] = {}  # tokens of the first forward into each cache
        self.poisoned: dict[int, str] = {}  # caches whose content no token list describes

    def analyse(self, fed: list[Fed], full_prompt: list[int] | None, generated: list[int] | None) -> TurnTokens:
        """Replay one turn's forwards through the book. ``full_prompt``: generate()'s whole input."""
        out = TurnTokens()
        first_cached = True
        for i, f in enumerate(fed):
            if not f.cache_id:
                continue
            held = self.held.setdefault(f.cache_id, [])
            if first_cached:
                out.first_cache_id = f.cache_id
                out.held_before = len(held)
            if 0 <= f.before < len(held):
                if first_cached:
                    out.cropped_from, out.cropped_to = len(held), f.before
                del held[f.before:]
            elif f.before > len(held):
                held.extend([UNKNOWN] * (f.before - len(held)))
            if first_cached:
                out.reused = len(held)
                if full_prompt is not None and f.cache_id not in self.poisoned:
                    pos = _first_mismatch(held, full_prompt)
                    if pos is not None:
                        out.divergence = (f.step, f.cache_id, pos)
                        out.divergence_ids = (held[pos:pos + 8], full_prompt[pos:pos + 8])
                        out.divergence_full = (list(held), list(full_prompt), self.opening.get(f.cache_id))
                first_cached = False
            if f.use_cache is False:
                out.fed_without_use_cache = True
                self.poisoned[f.cache_id] = "use_cache=False"
            elif f.cache_id not in self.poisoned and f.ids and len(held) >= 2:
                m = _lcp(f.ids, held)
                if m >= 2 and (m >= len(held) or m >= self.opening.get(f.cache_id, len(held))):
                    out.duplicates.append((f.step, f.cache_id, len(held), m))
            held.extend(f.ids if f.ids is not None else [UNKNOWN] * f.q_len)
            self.opening.setdefault(f.cache_id, max(f.q_len, 1))
        out.prompt, out.new_ids = _prompt_and_reply(fed, full_prompt, generated, self)
        return out

    def check_unfed(self, out: TurnTokens, cache_id: int | None, full_prompt: list[int] | None, step: int) -> None:
        """A turn whose call failed before any forward (nothing left to feed): compare its ids all the same."""
        held = self.held.get(cache_id) if cache_id is not None else None
        if not held or cache_id is None or full_prompt is None or cache_id in self.poisoned or out.divergence:
            return
        pos = _first_mismatch(held, full_prompt)
        out.first_cache_id, out.held_before, out.reused = cache_id, len(held), len(held)
        if pos is not None:
            out.divergence = (step, cache_id, pos)
            out.divergence_ids = (held[pos:pos + 8], full_prompt[pos:pos + 8])
            out.divergence_full = (list(held), list(full_prompt), self.opening.get(cache_id))

    def forget_after(self, cache_id: int, position: int) -> None:
        """The ids past ``position`` of ``cache_id`` are no longer known (its rows were reordered)."""
        held = self.held.get(cache_id)
        if held is not None:
            held[position:] = [UNKNOWN] * max(len(held) - position, 0)

    def snapshot(self, cache_id: int) -> list[int]:
        return list(self.held.get(cache_id, []))


def _prompt_and_reply(fed: list[Fed], full_prompt, generated, book: TokenBook) -> tuple[list[int], list[int]]:
    """The context at the first new token, and the tokens generated after it."""
    if not fed:
        return list(full_prompt or []), []
    first = fed[0]
    if full_prompt is not None:
        prompt = list(full_prompt)
    elif first.cache_id:
        base = book.held.get(first.cache_id, [])[: max(first.before, 0)]
        prompt = base + list(first.ids or [UNKNOWN] * first.q_len)
    else:
        prompt = list(first.ids or [UNKNOWN] * first.q_len)
    if generated is not None:
        return prompt, list(generated)
    if first.cache_id:
        new = [t for f in fed[1:] for t in (f.ids or [UNKNOWN] * f.q_len)]
    else:  # no cache: every forward re-feeds the whole sequence; the last one holds the reply
        last = fed[-1].ids or []
        new = list(last[len(first.ids or []):])
    return prompt, new + [UNKNOWN] * (1 if fed else 0)  # the last sampled token is never fed back


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i] and a[i] != UNKNOWN:
        i += 1
    return i


def _first_mismatch(held: list[int], given: list[int]) -> int | None:
    """First position where ``given`` differs from known ``held`` ids (unknown ids match anything)."""
    for i in range(min(len(held), len(given))):
        h = held[i]
        if h != UNKNOWN and h != given[i]:
            return i
    if len(given) < len(held):
        return len(given)  # generate() was given fewer ids than the cache holds
    return None


def continues(prompt: list[int], prev_held: list[int], prev_prompt_len: int) -> bool:
    """Does ``prompt`` reproduce the previous turn's prompt and at least one token of its reply?"""
    return bool(prev_held) and _lcp(prompt, prev_held) > prev_prompt_len


# -- events ----------------------------------------------------------------------------------------

def token_events(turn_index: int, first_step: int, tt: TurnTokens, decode, special_ids=()) -> list[Event]:
    out: list[Event] = []
    if tt.duplicates:
        step, cid, pos, m = tt.duplicates[0]
        total = sum(d[3] for d in tt.duplicates)
        more = f" ({len(tt.duplicates)} forward passes re-fed {total} tokens in all)" if len(tt.duplicates) > 1 else ""
        out.append(Event(
            DUPLICATE_CONTEXT, "error", turn_index, step,
            f"a forward pass fed cache #{cid} {m} tokens it already held: its input repeats positions 0–{m - 1} "
            f"of the cache, appended again at position {pos}, so the model now sees that context twice{more}",
            "Feed only the tokens after the cached prefix (or give generate() the full ids with the cache: it "
            "slices the cached part off itself); never re-encode the whole history onto a filled cache.",
            data={"cache_id": cid, "position": pos, "count": m, "forwards": len(tt.duplicates),
                  "duplicated": total},
        ))
    if tt.divergence is not None:
        step, cid, pos = tt.divergence
        held, given, opening = tt.divergence_full or ([], list(tt.prompt), None)
        d = classify(held, given, pos, opening=opening, decode=decode, special_ids=special_ids)
        context = d.context()
        out.append(Event(
            PREFIX_DIVERGENCE, "error", turn_index, step,
            f"generate() was given ids that differ from what cache #{cid} holds at position {pos} of "
            f"{tt.reused}: {cause_phrase(d, len(given))}{f' ({context})' if context else ''}; it slices the cached "
            f"part off by length, so the reply continues from a context that is not the conversation",
            d.fix,
            data={"cache_id": cid, "position": pos, "cached": tt.reused, "prompt_tokens": len(tt.prompt), **d.data()},
        ))
    return out


def detect_observed(ctx: TurnContext, record, tt: TurnTokens, decode, special_ids=()) -> list[Event]:
    """Events for one observed turn: detect_turn's, minus its count-based duplicate check, plus the token checks."""
    events = [e for e in detect_turn(ctx, record) if e.kind != DUPLICATE_CONTEXT]
    if len(ctx.samples) < 2:
        # One forward without a cache scores a sequence; it is not a generation loop.
        events = [e for e in events if e.kind != CACHE_DISABLED]
    first_step = ctx.first_step
    # A prompt given as inputs_embeds has no ids: what the cache holds cannot be compared with it.
    skip = tt.fed_without_use_cache or ctx.fed_embeddings
    tok = [] if skip else token_events(ctx.turn_index, first_step, tt, decode, special_ids)
    return events + tok


def seen_before(s) -> int:
    """Tokens the cache had seen before this forward (the probe reads after it); -1 without a cache."""
    seen = s.seen
    valid = seen[seen >= 0] if len(seen) else seen
    if not s.cache_id or not len(valid):
        return -1
    return int(valid.max()) - int(s.q_len)


def impl_of(snap) -> str:
    """The cache implementation, named as ``--cache`` names it, from an end-of-turn snapshot."""
    if snap is None:
        return "none"
    cls = snap.cache_class
    if snap.offloading:
        return "offloaded"
    for key in ("Static", "Quantized", "Dynamic"):
        if key in cls:
            return key.lower()
    return cls
