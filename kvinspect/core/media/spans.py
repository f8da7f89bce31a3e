"""Where the images of a prompt sit among its token ids, and which of their rows each layer still holds.

A span is one image's run of image tokens (``first``..``last``, inclusive positions) with the
wrapper tokens around it when the model has them (Gemma 3: BOI before, EOI after). The special
ids come from the model's config, read by feature: ``image_token_id`` (or ``image_token_index``),
``boi_token_index``/``vision_start_token_id`` and ``eoi_token_index``/``vision_end_token_id``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageTokens:
    """A multimodal model's image token ids; ``bidirectional``: its image blocks need ``token_type_ids``."""

    image: int
    start: int | None = None
    end: int | None = None
    bidirectional: bool = False

    @classmethod
    def of(cls, config) -> ImageTokens | None:
        image = _first_int(config, "image_token_id", "image_token_index")
        if image is None:
            return None
        start = _first_int(config, "boi_token_index", "boi_token_id", "vision_start_token_id")
        end = _first_int(config, "eoi_token_index", "eoi_token_id", "vision_end_token_id")
        # Gemma 3 style: the image block's tokens see each other both ways, told apart by token_type_ids.
        bidi = getattr(config, "mm_tokens_per_image", None) is not None
        return cls(image, start, end, bidi)


def _first_int(config, *names: str) -> int | None:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


@dataclass(frozen=True)
class Span:
    first: int
    last: int
    wrap_first: int
    wrap_last: int

    @property
    def tokens(self) -> int:
        return self.last - self.first + 1

    def contains(self, pos: int) -> bool:
        return self.first <= pos <= self.last


def find_spans(ids: list[int], tokens: ImageTokens) -> list[Span]:
    """Each run of image tokens in ``ids``, with its wrappers when they stand right next to it."""
    out: list[Span] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] != tokens.image:
            i += 1
            continue
        j = i
        while j + 1 < n and ids[j + 1] == tokens.image:
            j += 1
        wf = i - 1 if i > 0 and tokens.start is not None and ids[i - 1] == tokens.start else i
        wl = j + 1 if j + 1 < n and tokens.end is not None and ids[j + 1] == tokens.end else j
        out.append(Span(i, j, wf, wl))
        i = j + 1
    return out


def lone_placeholders(ids: list[int], tokens: ImageTokens, start: int = 0) -> list[int]:
    """Positions (from ``start``) of an image-start token with no image token after it: a placeholder never expanded."""
    if tokens.start is None:
        return []
    return [p for p in range(start, len(ids)) if ids[p] == tokens.start
            and (p + 1 >= len(ids) or ids[p + 1] != tokens.image)]


def held_rows(first: int, last: int, seen: int, stored: int) -> int:
    """How many of positions ``first``..``last`` a layer holds when it keeps the last ``stored`` of ``seen``."""
    lo = max(first, seen - stored)
    hi = min(last, seen - 1)
    return max(hi - lo + 1, 0)
