"""Why the ids given with a cache do not extend it: the cause and detail of ``prefix_divergence``.

Both feeders (kvinspect's chat loop, which crops, and the user's observed loop, which does not)
find a position where the new ids stop matching the ids the cache holds. The fix depends on
which mistake made it, so :func:`classify` names it from the token ids alone:

- ``input_shorter_than_cache``: the ids are the cached ids or a prefix of them (the first turn's
  ``input_ids`` passed again with the returned cache; transformers #27546, #32019);
- ``not_a_continuation``: they part inside the cache's opening prompt, i.e. they share at most
  the template's first tokens (the new message templated alone; QwenLM/Qwen3 #819);
- ``history_changed``: they part later, inside an earlier turn (the template renders history
  differently from how it was generated; QwenLM/Qwen3-VL #1685).

``detail`` says what changed when the tokens show it: ``think_block_dropped``,
``special_token_duplicated`` (a second BOS from ``tokenizer.encode`` on a templated prompt) or
``retokenized_boundary`` (the same text split into other tokens at a turn boundary, #43045).
Cause and detail names are a contract, like event kinds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass

INPUT_SHORTER_THAN_CACHE = "input_shorter_than_cache"
NOT_A_CONTINUATION = "not_a_continuation"
HISTORY_CHANGED = "history_changed"

THINK_BLOCK_DROPPED = "think_block_dropped"
SPECIAL_TOKEN_DUPLICATED = "special_token_duplicated"
RETOKENIZED_BOUNDARY = "retokenized_boundary"

CONTEXT = 8  # tokens quoted on each side of the divergence
_UNKNOWN = -1  # ids the cache held before observation (token_book.UNKNOWN)

_FIX = {
    INPUT_SHORTER_THAN_CACHE: "Pass the whole conversation so far with the cache: the previous turn's output ids "
                              "(prompt + reply) followed by the new message's ids, never the first turn's input_ids "
                              "again.",
    NOT_A_CONTINUATION: "Template the whole conversation (every earlier message and reply, then the new one) and "
                        "pass those ids with the cache: generate() cuts the cached length off the front, so the ids "
                        "must begin with what the cache holds.",
    HISTORY_CHANGED: "Keep earlier turns verbatim as they were generated, or crop the cache to the common prefix "
                     "before generate() (cache.crop(p - cache.get_seq_length())); never reuse a cache without "
                     "comparing the ids it holds.",
}
_DETAIL_FIX = {
    THINK_BLOCK_DROPPED: "The chat template drops the think block from earlier assistant turns: keep it in the "
                         "history you render, or crop the cache to the common prefix before generate().",
    SPECIAL_TOKEN_DUPLICATED: "The prompt was templated as text and encoded with special tokens again (a second BOS): "
                              "use apply_chat_template(..., tokenize=True), or encode(text, add_special_tokens=False).",
    RETOKENIZED_BOUNDARY: "The reply's text tokenises differently when encoded again: append the generated ids "
                          "themselves to the history ids instead of re-encoding the decoded text.",
}


@dataclass(frozen=True)
class Divergence:
    """Where and why the given ids part from the cached ids, with the decoded text around it."""

    position: int
    cause: str
    detail: str | None
    before: str  # decoded context just before the position (shared by both)
    cached: str  # what the cache holds from the position on
    given: str  # what the new ids say from the position on

    @property
    def fix(self) -> str:
        return _DETAIL_FIX[self.detail] if self.detail else _FIX[self.cause]

    def context(self, given_word: str = "given") -> str:
        """The decoded text on both sides, for a message; empty without a tokenizer.

        The shape is what trace/redact.py cuts out of a redacted report: keep them in step.
        """
        if not (self.before or self.cached or self.given):
            return ""
        return f"cached {self.cached!r} vs {given_word} {self.given!r} after {self.before!r}"

    def data(self) -> dict:
        out: dict = {"cause": self.cause}
        if self.detail:
            out["detail"] = self.detail
        return out


def classify(held: list[int], given: list[int], position: int, *, opening: int | None,
             decode: Callable[[list[int]], str] | None = None,
             special_ids: Collection[int] = ()) -> Divergence:
    """Name the divergence of ``given`` from ``held`` at ``position``.

    ``opening``: how many tokens the cache's first prompt had (None: unknown; a split is then
    ``history_changed`` unless the ids are a re-fed prefix).
    """
    text = decode if decode is not None else (lambda ids: "")

    def dec(ids: list[int]) -> str:
        return text([t for t in ids if t != _UNKNOWN])

    p = position
    detail = None
    if p >= len(given) and all(h in (g, _UNKNOWN) for h, g in zip(held, given)):
        cause = INPUT_SHORTER_THAN_CACHE
    else:
        # A recognised detail is by itself a re-rendering of the conversation, not another text.
        detail = _detail(held, given, p, dec, special_ids)
        fresh = opening is not None and p < opening and detail is None and not _realigns(held, given, p)
        cause = NOT_A_CONTINUATION if fresh else HISTORY_CHANGED
    return Divergence(p, cause, detail, dec(given[max(p - CONTEXT, 0):p]), dec(held[p:p + CONTEXT]),
                      dec(given[p:p + CONTEXT]))


def _realigns(held: list[int], given: list[int], p: int, reach: int = 3 * CONTEXT) -> bool:
    """Whether the cached ids pick up again in the given ones shortly after ``p`` (history re-rendered
    with a change: a dropped block, another split, an extra token) rather than never (another text).

    The first prompt ends with the template's generation prompt, which a re-rendered history
    changes too (a think block opened there), so a split inside it is not yet a new text.
    """
    for i in range(min(reach, len(held) - p)):
        run = held[p + i:p + i + 2 * CONTEXT]
        if len(run) < min(CONTEXT, 3) or (len(run) < CONTEXT and p + i + len(run) < len(held)):
            continue
        if len(run) < 3:
            break
        for j in range(min(reach, len(given) - p)):
            if given[p + j:p + j + len(run)] == run:
                return True
    return False


def _detail(held: list[int], given: list[int], p: int, dec, special_ids: Collection[int]) -> str | None:
    if p >= len(held) or p >= len(given):
        return None
    g = given[p]
    # An extra special token where the cache has none: given = held with one more BOS inserted.
    if g in special_ids and ((p > 0 and given[p - 1] == g) or given[p + 1:p + 1 + CONTEXT] == held[p:p + CONTEXT]):
        return SPECIAL_TOKEN_DUPLICATED
    window = 4 * CONTEXT
    cached_text, given_text = dec(held[p:p + window]), dec(given[p:p + window])
    # Right at the split: the given side opens its own think block later (the new generation prompt).
    if "<think>" in cached_text[:12] and "<think>" not in given_text[:12]:
        return THINK_BLOCK_DROPPED
    # Same text, other split: the first differing token's text is matched by the other side's text.
    first = min(len(dec([held[p]])), len(dec([g])))
    if first and len(os.path.commonprefix([cached_text, given_text])) >= first:
        return RETOKENIZED_BOUNDARY
    return None


def cause_phrase(d: Divergence, given_len: int) -> str:
    """The cause in words, for an event message."""
    if d.cause == INPUT_SHORTER_THAN_CACHE:
        return (f"the {given_len} ids given are ids the cache already holds, so the same input was passed again "
                f"({INPUT_SHORTER_THAN_CACHE})")
    if d.cause == NOT_A_CONTINUATION:
        what = "they part inside the cache's first prompt, so they do not continue what it holds"
    else:
        what = "they part inside an earlier turn: the history was rendered differently"
    extra = {THINK_BLOCK_DROPPED: ", the think block was dropped",
             SPECIAL_TOKEN_DUPLICATED: ", a special token was added twice",
             RETOKENIZED_BOUNDARY: ", the same text was split into other tokens"}.get(d.detail or "", "")
    return f"{what}{extra} ({d.cause}{'/' + d.detail if d.detail else ''})"
