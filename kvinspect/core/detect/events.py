"""Detector events: what happened, where, the numbers behind it, and what to do.

Kinds are a stable contract (trace files, summary.json, scripts): add kinds, never rename.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

WINDOW_REACHED = "window_reached"
CHUNK_REACHED = "chunk_reached"
CACHE_RECREATED = "cache_recreated"
DUPLICATE_CONTEXT = "duplicate_context"
PREFIX_DIVERGENCE = "prefix_divergence"
CACHE_DISABLED = "cache_disabled"
CONFIG_OVERRIDE = "config_override"
UNBOUNDED_WINDOW = "unbounded_window"
CACHE_FED_WITHOUT_USE_CACHE = "cache_fed_without_use_cache"
TURN_FAILED = "turn_failed"
TURN_STOPPED = "turn_stopped"
CONTEXT_LIMIT = "context_limit"
CAPACITY_NEAR = "capacity_near"
CAPACITY_EXCEEDED = "capacity_exceeded"
MEMORY_RETAINED = "memory_retained"
STATE_NOT_CROPPABLE = "state_not_croppable"
LAYERS_DISAGREE = "layers_disagree"
MEDIA_FED_AS_TEXT = "media_fed_as_text"
MEDIA_REENCODED = "media_reencoded"
IMAGE_CAUSAL = "image_causal"
CROP_INSIDE_IMAGE = "crop_inside_image"
ROPE_DELTAS_STALE = "rope_deltas_stale"

#: Expected behaviour, shown but never counted as a problem.
INFO_KINDS = frozenset({WINDOW_REACHED, CHUNK_REACHED, TURN_STOPPED})
ALL_KINDS = (
    WINDOW_REACHED, CHUNK_REACHED, CACHE_RECREATED, DUPLICATE_CONTEXT, PREFIX_DIVERGENCE,
    CACHE_DISABLED, CONFIG_OVERRIDE, UNBOUNDED_WINDOW, CACHE_FED_WITHOUT_USE_CACHE,
    TURN_FAILED, TURN_STOPPED, CONTEXT_LIMIT, CAPACITY_NEAR, CAPACITY_EXCEEDED, MEMORY_RETAINED,
    STATE_NOT_CROPPABLE, LAYERS_DISAGREE, MEDIA_FED_AS_TEXT, MEDIA_REENCODED, IMAGE_CAUSAL, CROP_INSIDE_IMAGE,
    ROPE_DELTAS_STALE,
)


@dataclass
class Event:
    kind: str
    severity: str  # "info" | "warn" | "error"
    turn: int
    step: int  # global step index where it shows (first step of the turn when not step-specific)
    message: str
    advice: str = ""
    layer: int | None = None  # first layer concerned; ``layers`` has them all
    layers: list[int] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Event:
        return cls(
            kind=str(d["kind"]), severity=str(d.get("severity", "warn")), turn=int(d.get("turn", 0)),
            step=int(d.get("step", 0)), message=str(d.get("message", "")), advice=str(d.get("advice", "")),
            layer=d.get("layer"), layers=list(d.get("layers") or []), data=dict(d.get("data") or {}),
        )

    @property
    def is_problem(self) -> bool:
        # memory_retained is info below its threshold, warn above: the severity decides there.
        return self.kind not in INFO_KINDS and self.severity != "info"

    def markdown(self) -> str:
        """The event as Markdown; every field is inert text (a shared trace may hold anything in them)."""
        from kvinspect.core.text_safety import md_text

        where = f"turn {self.turn + 1}, step {self.step}"
        if self.layers:
            where += ", layers " + md_text(_ranges(self.layers))
        out = f"**{md_text(self.kind)}** ({md_text(self.severity)}, {where}): {md_text(self.message)}"
        if self.advice:
            out += f"\n\n*What to do:* {md_text(self.advice)}"
        return out


def _ranges(idx: list[int]) -> str:
    idx = sorted(set(idx))
    parts: list[str] = []
    start = prev = idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)
