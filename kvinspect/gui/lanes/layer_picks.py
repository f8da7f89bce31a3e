"""Which layers the tokens lane draws by default: the first layer of each kind."""

from __future__ import annotations

from kvinspect.gui.base import theme as th

MAX_PICKED = 6  # layer curves at once: more turns the tokens lane into noise


def default_picks(kinds: list[str]) -> list[int]:
    """The first layer of each kind: a hybrid model shows sliding against full at once."""
    out, seen = [], set()
    for i, k in enumerate(kinds):
        b = th.kind_base(k)
        if b not in seen and b not in ("shared",):
            seen.add(b)
            out.append(i)
    return out[:MAX_PICKED]
