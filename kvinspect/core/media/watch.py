"""What a multimodal model was fed in one turn: the images its vision tower encoded, and the token types.

Two hooks, no patching: a forward pre-hook on the vision tower (each call's pixels, hashed per
image) and one on the inner multimodal model (the ``token_type_ids`` of the turn's first forward).
The inner model, not the top-level one: its hook runs after the observers' own pre-hooks on the
top-level model have opened the turn a forward belongs to.
kvinspect's own chat loop and an observed user loop get the same hooks, through the turn
pipeline, so the media fields and the media detectors are computed once for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvinspect.core.compat import compiling_test
from kvinspect.core.media.images import per_image, pixel_hash
from kvinspect.core.media.spans import ImageTokens

_TOWER_NAMES = ("vision_tower", "visual", "vision_model")


@dataclass
class FedMedia:
    """One turn's share: the images encoded (hash, in order), the vision tower's calls, the first forward's token types."""

    hashes: list[str] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    vision_calls: int = 0
    forwards: int = 0
    token_types: list[int] | None = None  # the first forward's token_type_ids (row 0), None: not given
    features_given: bool = False  # the first forward was given encoded image features, and the tower did not run
    rope_deltas: tuple | None = None  # M-RoPE models: the model's stored rope_deltas the turn's first forward used


def vision_tower(model):
    """The model's vision tower module, found by the names transformers gives it; None for a text model."""
    inner = getattr(model, "model", None)
    for owner in (model, inner):
        for name in _TOWER_NAMES:
            mod = getattr(owner, name, None) if owner is not None else None
            if mod is not None and hasattr(mod, "register_forward_pre_hook"):
                return mod
    return None


class MediaWatch:
    """Hooks on one multimodal model; :meth:`take` hands over (and resets) what the current turn fed."""

    def __init__(self, model, tower, tokens: ImageTokens):
        self.tokens = tokens
        self._fed = FedMedia()
        inner = getattr(model, "model", None)
        body = inner if inner is not None and hasattr(inner, "register_forward_pre_hook") else model
        self._body = body
        self._compiling = compiling_test()  # a compiled forward's hooks step aside (core/compat.py)
        self._handles = [tower.register_forward_pre_hook(self._on_tower, with_kwargs=True),
                         body.register_forward_pre_hook(self._on_forward, with_kwargs=True)]

    @classmethod
    def of(cls, model) -> MediaWatch | None:
        """A watch for a model with a vision tower and image token ids in its config; None otherwise."""
        config = getattr(model, "config", None)
        tokens = ImageTokens.of(config) if config is not None else None
        tower = vision_tower(model)
        if tokens is None or tower is None:
            return None
        return cls(model, tower, tokens)

    def _on_forward(self, module, args, kwargs):
        if self._compiling():
            return None
        fed = self._fed
        fed.forwards += 1
        if fed.forwards == 1:
            tt = kwargs.get("token_type_ids", kwargs.get("mm_token_type_ids"))
            fed.token_types = [int(x) for x in tt[0].tolist()] if tt is not None and hasattr(tt, "tolist") else None
            # Image features the program encoded itself and passed in (generate()'s own encoding also arrives so,
            # after the tower's calls this watch counted): the images were fed, unseen by the tower's hook.
            enc = kwargs.get("mm_encoder_outputs")
            fed.features_given = bool(enc) and not fed.vision_calls
            # generate() sets rope_deltas before its first forward (or keeps the stored ones): the value used.
            rd = getattr(self._body, "rope_deltas", None)
            fed.rope_deltas = tuple(int(x) for x in rd.reshape(-1).tolist()) if hasattr(rd, "reshape") else None
        return None

    def _on_tower(self, module, args, kwargs):
        if self._compiling():
            return None
        self.see_tower_call(args, kwargs)
        return None

    def see_tower_call(self, args, kwargs) -> None:
        """One call of the vision tower: its images hashed in order."""
        px = args[0] if args else kwargs.get("pixel_values", kwargs.get("hidden_states"))
        fed = self._fed
        fed.vision_calls += 1
        if px is not None and hasattr(px, "shape"):
            for img in per_image(px, kwargs.get("grid_thw", args[1] if len(args) > 1 else None)):
                fed.hashes.append(pixel_hash(img))
                fed.shapes.append(tuple(int(d) for d in img.shape))

    def reset(self) -> None:
        self._fed = FedMedia()

    def take(self) -> FedMedia:
        fed, self._fed = self._fed, FedMedia()
        return fed

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
