"""A lane's y (or x) range that changes only in steps: calm axes, cached ticks."""

from __future__ import annotations

import math

NICE = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)  # a range at rest: a tight fit
# While a run grows: a step of 1.5–2× each time the data reach the top. Every step repaints its
# lanes whole and makes their axes' ticks again (a live frame otherwise repaints a strip a few
# pixels wide); the fine series above stepped every third frame of a 200-token reply.
GROWTH = (1, 2, 3, 5, 10)


def nice_ceiling(v: float, steps: tuple = NICE) -> float:
    """The smallest of ``steps`` (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 by default) × 10^k that is ≥ v."""
    if v <= 0:
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    for m in steps:
        if m * k >= v:
            return m * k
    return 10 * k


def growth_ceiling(v: float) -> float:
    """The smallest of 1, 2, 3, 5 × 10^k that is ≥ v: a growing run's next range."""
    return nice_ceiling(v, GROWTH)


class StickyRange:
    """A y (or x) range with headroom that changes only when the data leave it or shrink far below it.

    Live plots that re-fit every frame jitter and force every axis to regenerate its ticks; a
    range that grows in steps keeps axes cached and the picture calm.
    """

    def __init__(self, headroom: float = 0.15, shrink: float = 0.35, zero: bool = True, min_frac: float = 0.01,
                 keep_clear: float = 0.0):
        self.headroom, self.shrink, self.zero = headroom, shrink, zero
        # Fraction of the range at the top that data must never enter (a legend row sits there).
        self.keep_clear = keep_clear
        self.min_frac = min_frac  # the narrowest span, as a fraction of the value (a flat line is not noise)
        self.lo: float | None = None
        self.hi: float | None = None
        self.growing = False  # a run grows: the top steps through the coarse series (growth_ceiling)

    def reset(self) -> None:
        self.lo = self.hi = None

    def fit(self, lo: float, hi: float) -> tuple[float, float] | None:
        """New (lo, hi) when the range must change, else None."""
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        if self.zero:
            lo = 0.0
        span = max(hi - lo, abs(hi) * self.min_frac, 1.0)
        top_ok = self.hi is not None and hi <= self.hi - self.keep_clear * (self.hi - (self.lo or 0.0))
        if self.lo is not None and self.lo <= lo and top_ok and span >= self.shrink * (self.hi - self.lo):
            return None
        if self.zero:
            want = max(hi * (1 + self.headroom), hi / (1 - self.keep_clear)) if self.keep_clear < 1 else hi
            ceiling = growth_ceiling if self.growing else nice_ceiling
            new = (0.0, ceiling(want) if hi > 0 else 1.0)
        else:
            mid, m = (lo + hi) / 2, span * (0.5 + self.headroom)
            new = (mid - m, mid + m)
        self.lo, self.hi = new
        return new
