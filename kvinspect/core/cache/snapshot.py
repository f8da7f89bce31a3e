"""The end-of-turn snapshot of a cache: every layer's exact counters, device, dtype, logical and held bytes.

Unlike the per-step read it walks every tensor and storage (≈150 µs for 30 layers) and may sync (it
reads the 0-d counters of static layers), so it runs at the end of a turn or on a throttled refresh.
It also forms the groups of layers that must hold the same numbers, which ``layers_disagree`` checks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from kvinspect.core.cache import byte_counts
from kvinspect.core.cache.layer_groups import kind_groups
from kvinspect.core.cache.layer_shapes import LayerShape, cls_name
from kvinspect.core.cache.step_read import StepRead, exact_seen


@dataclass
class LayerSnapshot:
    index: int
    kind: str
    attention: str
    config_attention: str
    storage: str
    cls: str
    seen: int | None
    stored: int | None
    capacity: int | None
    window: int | None
    device: str
    home_device: str
    dtype: str
    bytes: int
    held_bytes: int
    reads_from: int | None = None
    batch: int | None = None  # rows of the layer's K/V (beams, batched prompts); None without a token axis

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CacheSnapshot:
    cache_id: int
    cache_class: str
    offloading: bool
    layers: list[LayerSnapshot] = field(default_factory=list)
    #: Layers that must hold the same numbers (one kind, storage, device, dtype, row size); not serialised.
    groups: list[list[int]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(lay.bytes for lay in self.layers)

    @property
    def held_bytes(self) -> int:
        return sum(lay.held_bytes for lay in self.layers)

    def bytes_by_device(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lay in self.layers:
            if lay.bytes:
                out[lay.device] = out.get(lay.device, 0) + lay.bytes
        return out

    def to_dict(self) -> dict:
        return {
            "cache_id": self.cache_id,
            "cache_class": self.cache_class,
            "offloading": self.offloading,
            "bytes": self.bytes,
            "held_bytes": self.held_bytes,
            "bytes_by_device": self.bytes_by_device(),
            "layers": [lay.to_dict() for lay in self.layers],
        }


def take_snapshot(probe: StepRead, cache) -> CacheSnapshot:
    """Everything about ``cache`` including held bytes; may sync (end of turn only)."""
    if cache is None:
        return CacheSnapshot(0, "None", False, [])
    cache_id, _ = probe.identify(cache)
    shapes = probe.shapes(cache)
    probe.resync(cache)
    layers = probe._layers(cache)
    out = []
    for shape, layer in zip(shapes, layers):
        tensors = byte_counts.tensors_of(layer)
        logical = sum(t.numel() * t.element_size() for t in tensors)
        held = byte_counts.held_bytes(tensors)
        main = byte_counts.main_tensor(layer, tensors)
        device = str(main.device) if main is not None else "-"
        if device == "cuda":
            device = "cuda:0"
        home = str(getattr(layer, "device", None) or device) if not isinstance(layer, tuple) else device
        dtype = str(main.dtype).removeprefix("torch.") if main is not None else "-"
        batch = int(main.shape[0]) if main is not None and main.dim() >= 3 else None
        if shape.storage in ("none", "linear"):
            seen = stored = None
        else:
            seen = exact_seen(layer)
            if shape.storage == "static":
                stored = min(seen, shape.capacity or seen)
            elif shape.storage == "quantized":
                stored = seen
            else:
                k = layer[0] if isinstance(layer, tuple) else layer.keys
                stored = int(k.shape[-2]) if k is not None and k.dim() == 4 else 0
        out.append(
            LayerSnapshot(
                index=shape.index, kind=shape.kind, attention=shape.attention,
                config_attention=shape.config_attention, storage=shape.storage, cls=shape.cls,
                seen=seen, stored=stored, capacity=shape.capacity, window=shape.window,
                device=device, home_device=home, dtype=dtype, bytes=int(logical), held_bytes=int(held),
                reads_from=shape.reads_from, batch=batch,
            )
        )
    return CacheSnapshot(
        cache_id=cache_id,
        cache_class=cls_name(cache),
        offloading=bool(getattr(cache, "offloading", False)),
        layers=out,
        groups=kind_groups((lay.index, _agree_key(lay, shape, layer)) for lay, shape, layer in zip(out, shapes, layers)
                           if shape.storage != "none"),
    )


def _agree_key(lay: LayerSnapshot, shape: LayerShape, layer) -> tuple:
    keys = None if isinstance(layer, tuple) else getattr(layer, "keys", None)
    rb = byte_counts.row_bytes(layer, keys) if keys is not None and getattr(keys, "dim", None) and keys.dim() == 4 else 0
    return (replace(shape, index=0), lay.device, lay.dtype, rb)

