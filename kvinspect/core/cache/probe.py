"""Read any transformers cache object: per-layer seen / stored / capacity / window / device / bytes.

Two speeds. :meth:`CacheProbe.lengths` runs after every forward pass: attribute reads and
shapes only, no device sync (static layers on an accelerator keep a counter advanced by the
forward's query length instead of reading their 0-d ``cumulative_length`` tensor), and only one
layer per group of same-kind layers (:mod:`.layer_groups`), so its cost is flat in the layer count.
:meth:`CacheProbe.snapshot` walks every tensor and storage (≈150 µs for 30 layers) and is
meant for the end of a turn or a throttled refresh. See docs/probe.md for what each field means.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, field, replace
from itertools import count, repeat

import numpy as np

from kvinspect.core import compat
from kvinspect.core.cache import layer_kinds
from kvinspect.core.cache.layer_groups import LayerGroups, kind_groups
from kvinspect.core.errors import UnsupportedCacheError

NA = -1  # "no token axis" (linear-attention / shared layers) in integer series

#: Attention kinds as shown to users; ``config_attention`` is what the model config asks for.
ATTENTION_OF_LAYER_TYPE = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    **layer_kinds.KIND_OF_LAYER_TYPE,
}


@dataclass(frozen=True)
class LayerShape:
    """What a cache layer is; fixed for the life of one cache object."""

    index: int
    cls: str
    attention: str  # full | sliding | chunked | state | shared | indexed  (what the cache does)
    config_attention: str  # what the model config asks for
    storage: str  # dynamic | static | quantized | linear | none | legacy
    window: int | None
    capacity: int | None
    reads_from: int | None = None  # shared layers: the layer whose K/V they read

    @property
    def kind(self) -> str:
        if self.storage == "quantized":
            return "quantized"
        if self.storage == "static":
            return "static-" + self.attention
        return self.attention


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


def _cls_name(obj) -> str:
    return type(obj).__name__


def _storage_of(layer) -> str:
    name = _cls_name(layer)
    if name == "DummyLayer":
        return "none"
    if "Quantized" in name:
        return "quantized"
    if name.startswith("LinearAttention") and "And" not in name:
        return "linear"
    if "Static" in name or name in ("SlidingWindowLayer", "ChunkedSlidingLayer"):
        return "static"
    return "dynamic"


def _attention_of(layer, storage: str, config_attention: str) -> str:
    if storage == "none":
        return "shared"
    if storage == "linear":
        return layer_kinds.STATE
    if layer_kinds.is_indexed_layer(layer):
        return layer_kinds.INDEXED
    name = _cls_name(layer)
    sliding = bool(getattr(layer, "is_sliding", False)) or "Sliding" in name or "Chunked" in name
    if not sliding:
        return "full"
    # Chunked layers use the very same class as sliding ones: only the config tells them apart.
    if name == "ChunkedSlidingLayer" or config_attention == "chunked":
        return "chunked"
    return "sliding"


def _window_of(layer, attention: str, config_window: int | None) -> int | None:
    if attention not in ("sliding", "chunked"):
        return None
    w = getattr(layer, "sliding_window", None)
    if isinstance(w, int) and w > 0:
        return w
    return config_window


class _CacheState:
    """Per-cache bookkeeping: layer shapes and counters for static layers on accelerators."""

    __slots__ = ("cache_id", "shapes", "readers", "est_seen", "row_bytes", "groups", "hybrid", "state_bytes",
                 "plain", "__weakref__")

    def __init__(self, cache_id: int):
        self.cache_id = cache_id
        self.shapes: list[LayerShape] = []
        self.readers: list = []
        self.est_seen: dict[int, int] = {}
        self.row_bytes: dict[int, int] = {}
        self.groups: LayerGroups | None = None  # set after the first full read where every layer had tensors
        self.hybrid: frozenset[int] = frozenset()  # layers holding K/V and a conv/recurrent state (Falcon-H1)
        self.state_bytes: dict[int, int] = {}  # their state's size, fixed once it exists (like row_bytes)
        # The step hook's read when every group's representative is a plain dynamic layer:
        # ``(groups, layer count, ((index, row bytes, sliding, device code), ...))``; None: the general read
        # (:meth:`CacheProbe._read`). Indices, not layers: the state outlives its cache in ``_last``.
        self.plain: tuple | None = None


class CacheProbe:
    """Reads caches of one model. Keeps a stable small integer id per cache object."""

    _ids = count(1)

    def __init__(self, config, n_layers: int | None = None):
        self.config = config
        self.config_types = compat.config_layer_types(config)
        self.n_layers = int(n_layers or len(self.config_types) or 0)
        self.shared_sources = layer_kinds.shared_sources(config)
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._legacy: dict[int, _CacheState] = {}
        self.devices: list[str] = []  # device table: code -> "cpu", "cuda:0", ...
        self._dev_codes: dict = {}
        self.group_layers = True  # False: read every layer every forward (the benchmarks' baseline)
        # The cache of the latest forward: one identity test finds its state, not a weak-dict lookup.
        self._last: tuple[weakref.ref, _CacheState] | None = None
        self._none_row: tuple | None = None
        self._windows = {t: compat.config_window(config, t) for t in {*self.config_types, "full_attention"}}
        # Shapes, readers and groups of the caches seen so far, by their layers' structure: the next cache
        # built the same way (each generate() call makes one) is read by group from its first forward.
        self._templates: dict[tuple, tuple] = {}

    # -- identity -------------------------------------------------------------------------
    def identify(self, cache) -> tuple[int, bool]:
        """``(cache_id, first_time_seen)``; ids are stable for the life of the object."""
        if cache is None:
            return 0, False
        st, new = self._lookup(cache)
        return st.cache_id, new

    def _state(self, cache) -> _CacheState:
        return self._lookup(cache)[0]

    def _lookup(self, cache) -> tuple[_CacheState, bool]:
        """The state of ``cache`` and whether it is new to this probe; the latest cache's is one identity test."""
        last = self._last
        if last is not None and last[0]() is cache:
            return last[1], False
        try:
            st = self._states.get(cache)
        except TypeError:  # legacy tuples are not weak-referenceable
            st = self._legacy.get(id(cache))
            if st is None:
                st = self._legacy[id(cache)] = _CacheState(next(self._ids))
                return st, True
            return st, False
        new = st is None
        if st is None:
            if _cls_name(cache) == "EncoderDecoderCache":
                raise UnsupportedCacheError(
                    "encoder-decoder caches (EncoderDecoderCache) are not supported: kvinspect inspects decoder-only models"
                )
            st = _CacheState(next(self._ids))
            self._states[cache] = st
        self._last = (weakref.ref(cache), st)
        return st, new

    def known_id(self, cache) -> int | None:
        try:
            st = self._states.get(cache)
        except TypeError:
            st = self._legacy.get(id(cache))
        return st.cache_id if st is not None else None

    def dev_code(self, device) -> int:
        code = self._dev_codes.get(device)
        if code is None:
            name = str(device)
            if name == "cuda":
                name = "cuda:0"
            if name not in self.devices:
                self.devices.append(name)
            code = self._dev_codes[device] = self.devices.index(name)
        return code

    # -- layer shapes -----------------------------------------------------------------------
    def _layers(self, cache) -> list:
        layers = getattr(cache, "layers", None)
        if layers is not None:
            return list(layers)
        if isinstance(cache, (tuple, list)):
            return list(cache)
        raise UnsupportedCacheError(f"cannot read a cache of type {_cls_name(cache)}")

    def shapes(self, cache) -> list[LayerShape]:
        st = self._state(cache)
        layers = self._layers(cache)
        if len(st.shapes) != len(layers):
            seen: dict = {}
            st.shapes = [self._shape_like(i, lay, seen) for i, lay in enumerate(layers)]
            st.readers = [self._reader_for(s) for s in st.shapes]
            st.hybrid = frozenset(s.index for s in st.shapes if layer_kinds.is_hybrid_class(s.cls))
            st.groups = None
        return st.shapes

    def _shape_like(self, i: int, layer, seen: dict) -> LayerShape:
        """:meth:`_shape_of`, once per distinct kind of layer in one cache: the first forward of a new
        model's cache reads them all right after that forward (80 layers: half of that read)."""
        if isinstance(layer, (tuple, list)):
            return self._shape_of(i, layer)
        ctype = self.config_types[i] if i < len(self.config_types) else "full_attention"
        key = (type(layer), ctype, getattr(layer, "is_sliding", None), getattr(layer, "sliding_window", None),
               getattr(layer, "max_cache_len", None))
        try:
            s = seen.get(key)
        except TypeError:  # an unhashable attribute: no sharing
            return self._shape_of(i, layer)
        if s is None:
            s = seen[key] = self._shape_of(i, layer)
            return s
        reads_from = self.shared_sources.get(i) if s.attention == layer_kinds.SHARED else None
        return LayerShape(i, s.cls, s.attention, s.config_attention, s.storage, s.window, s.capacity, reads_from)

    def _shape_of(self, i: int, layer) -> LayerShape:
        ctype = self.config_types[i] if i < len(self.config_types) else "full_attention"
        config_attention = ATTENTION_OF_LAYER_TYPE.get(ctype, "full")
        if isinstance(layer, (tuple, list)):
            return LayerShape(i, "tuple", "full", config_attention, "legacy", None, None)
        storage = _storage_of(layer)
        attention = _attention_of(layer, storage, config_attention)
        window = _window_of(layer, attention, self._windows.get(ctype))
        capacity = compat.layer_capacity(layer) if storage not in ("none", "linear") else None
        if storage == "dynamic" and attention in ("sliding", "chunked") and capacity is None:
            capacity = window
        reads_from = self.shared_sources.get(i) if attention == layer_kinds.SHARED else None
        return LayerShape(i, _cls_name(layer), attention, config_attention, storage, window, capacity, reads_from)

    @staticmethod
    def _reader_for(shape: LayerShape) -> str:
        if shape.storage == "legacy":
            return "legacy"
        if shape.storage == "none":
            return "na"
        if shape.storage == "linear":
            return "state"
        if shape.storage == "quantized":
            return "quant"
        if shape.storage == "static":
            return "static"
        if shape.attention in ("sliding", "chunked"):
            return "dynslide"
        return "dyn"

    # -- per-step fast read -----------------------------------------------------------------
    def observe(self, cache, q_len: int = 0):
        """What the step hook needs of one forward's cache: ``(cache_id, first_time_seen, groups, row)``.

        :meth:`identify` and :meth:`read` with one lookup of the cache's state, which for the cache of
        the previous forward is one identity test. A cache whose groups' representatives are all plain
        dynamic layers is read inline: a few attribute reads per group, nothing else (docs/probe.md).
        """
        last = self._last
        if last is not None and last[0]() is cache and cache is not None:
            st = last[1]
            plain = st.plain
            if plain is not None:
                row: list = []
                try:
                    layers = cache.layers
                    if len(layers) != plain[1]:
                        raise IndexError
                    for i, rb, sliding, code in plain[2]:
                        layer = layers[i]
                        _, _, rows, _ = layer.keys.shape  # (batch, heads, rows, head dim); else the general read
                        row += (layer.cumulative_length if sliding else rows, rows, code, rows * rb)
                except (AttributeError, IndexError, TypeError, ValueError):
                    pass  # a layer emptied or moved: the general read below decides
                else:
                    return st.cache_id, False, plain[0], row
            new = False
        elif cache is None:
            return 0, False, None, self._no_cache()
        else:
            st, new = self._lookup(cache)
        groups, row = self._read(st, cache, q_len)
        return st.cache_id, new, groups, row

    def read(self, cache, q_len: int = 0):
        """One forward's read, no device sync: ``(groups, reps)`` or ``(None, arrays)``.

        Grouped caches (:mod:`.layer_groups`) read one layer per group: ``reps`` is one list of
        each group's seen, stored, device code and bytes, group after group, which
        :meth:`~.layer_groups.LayerGroups.spread` turns into per-layer arrays. Otherwise (the first
        read of a cache, offloaded or legacy caches) every layer is read and ``arrays`` is
        ``(seen, stored, device_code, bytes)`` as :meth:`lengths` gives them.

        Runs after every forward, right after the model has flushed the CPU caches: a few Python
        operations per group, no numpy.
        """
        if cache is None:
            return None, self._no_cache()
        return self._read(self._state(cache), cache, q_len)

    def _read(self, st: _CacheState, cache, q_len: int):
        groups = st.groups
        layers = getattr(cache, "layers", None)
        if groups is None and not st.shapes and layers is not None:
            groups = self._from_template(st, cache, layers)
        if groups is None or layers is None or len(layers) != len(st.shapes):
            st.plain = None
            return None, self._read_all(st, cache, q_len)
        row: list = []
        for i, reader in groups.rep_readers:
            row += self._read_layer(st, i, layers[i], reader, q_len)
        st.plain = self._plain(st, groups, layers)
        return groups, row

    def _plain(self, st: _CacheState, groups: LayerGroups, layers) -> tuple | None:
        """The inline read of :meth:`observe`, where every representative is a dynamic layer whose
        ``keys`` give its rows (and, sliding, ``cumulative_length`` what it has seen)."""
        reps = []
        for i, reader in groups.rep_readers:
            layer = layers[i]
            rb = st.row_bytes.get(i)
            if reader not in ("dyn", "dynslide") or i in st.hybrid or rb is None:
                return None
            if reader == "dynslide" and not isinstance(getattr(layer, "cumulative_length", None), int):
                return None
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() != 4 or keys.device not in self._dev_codes:
                return None
            # Its device as it is now: a layer of a cache that does not offload stays where it was
            # created, and reading ``keys.device`` was a third of the read (check_devices re-reads it).
            reps.append((i, rb, reader == "dynslide", self._dev_codes[keys.device]))
        return groups, len(layers), tuple(reps)

    def check_devices(self) -> None:
        """Re-read the device of the latest cache's representatives, which the inline read of
        :meth:`observe` takes as fixed: a layer that moved is read in full from the next forward on.

        The turn pipeline calls it before each block it appends (at most every ``PENDING_MAX``
        forwards or flush interval), so at worst one block's rows name the old device."""
        if self._last is None:
            return
        ref, st = self._last
        plain, cache = st.plain, ref()
        if plain is None or cache is None:
            return
        codes = self._dev_codes
        try:
            layers = cache.layers
            if all(codes.get(layers[i].keys.device) == code for i, _, _, code in plain[2]):
                return
        except (AttributeError, IndexError, TypeError):
            pass
        st.plain = None

    def _structure(self, cache, layers) -> tuple | None:
        """What a cache's layer shapes depend on, or None for a cache that is never grouped.

        Built with ``map`` over the layers (no Python frame per layer): it runs on the first forward
        of every new cache, right after that forward."""
        if not self.group_layers or getattr(cache, "offloading", False):
            return None
        return (type(cache), tuple(map(type, layers)),
                *(tuple(map(getattr, layers, repeat(name), repeat(None)))
                  for name in ("is_sliding", "sliding_window", "max_cache_len")))

    def _from_template(self, st: _CacheState, cache, layers) -> LayerGroups | None:
        """A new cache shaped like one already grouped: its shapes and groups, without a full read.

        The end-of-turn snapshot still reads every layer, and ``layers_disagree`` fires if a
        layer of this cache does not follow its group."""
        if not self._templates:
            return None
        tpl = self._templates.get(self._structure(cache, layers))  # type: ignore[arg-type]
        if tpl is None:
            return None
        shapes, readers, hybrid, groups = tpl
        row_bytes: dict[int, int] = {}
        for i, reader in groups.rep_readers:
            if reader in ("dyn", "dynslide", "static"):
                keys = getattr(layers[i], "keys", None)
                if keys is None or keys.dim() != 4:
                    return None  # not initialised yet (lazy layers): the full read decides
                row_bytes[i] = layer_kinds.row_bytes(layers[i], keys)
        st.shapes, st.readers, st.hybrid, st.groups = shapes, readers, hybrid, groups
        st.row_bytes.update(row_bytes)
        return groups

    def lengths(self, cache, q_len: int = 0):
        """``(seen, stored, device_code, bytes)`` arrays, one entry per layer; no device sync."""
        groups, row = self.read(cache, q_len)
        return row if groups is None else groups.spread(row)

    def _no_cache(self):
        """The row of a forward without a cache (one per probe: samples and the record only read it)."""
        row = self._none_row
        if row is None:
            n = self.n_layers
            row = self._none_row = (np.full(n, NA, dtype=np.int32), np.full(n, NA, dtype=np.int32),
                                    np.full(n, -1, dtype=np.int8), np.zeros(n, dtype=np.int64))
            for a in row:
                a.flags.writeable = False
        return row

    def _read_all(self, st: _CacheState, cache, q_len: int):
        """Every layer; forms the groups once every layer holds tensors."""
        n = self.n_layers
        layers = self._layers(cache)
        shapes = st.shapes if len(st.shapes) == len(layers) else self.shapes(cache)
        readers = st.readers
        seen = [NA] * n
        stored = [NA] * n
        dev = [-1] * n
        nbytes = [0] * n
        for i in range(min(n, len(layers))):
            seen[i], stored[i], dev[i], nbytes[i] = self._read_layer(st, i, layers[i], readers[i], q_len)
        out = (np.array(seen, dtype=np.int32), np.array(stored, dtype=np.int32),
               np.array(dev, dtype=np.int8), np.array(nbytes, dtype=np.int64))
        # Offloaded layers move between devices every forward: those caches keep the full read.
        if self.group_layers and not getattr(cache, "offloading", False):
            st.groups = LayerGroups.build(shapes, readers, st.row_bytes, *out)
            key = self._structure(cache, layers) if st.groups is not None else None
            if key is not None and len(self._templates) < 16:
                self._templates[key] = (shapes, readers, st.hybrid, st.groups)
        return out

    def _read_layer(self, st: _CacheState, i: int, layer, reader: str, q_len: int) -> tuple[int, int, int, int]:
        """``(seen, stored, device code, bytes)`` of one layer."""
        if reader == "na":
            return NA, NA, -1, 0
        if reader == "state":  # no token axis: seen/stored stay NA, the state's bytes count
            d, b = layer_kinds.state_read(layer)
            return NA, NA, (self.dev_code(d) if d is not None else -1), b
        if reader == "legacy":
            k = layer[0]
            rows = int(k.shape[-2])
            return rows, rows, self.dev_code(k.device), 2 * k.numel() * k.element_size()
        if reader == "quant":
            # The data lives in the quantized tensors; ``keys`` is only the unquantized residual.
            keys, extra = _quant_main(layer)
            n = int(getattr(layer, "cumulative_length", 0) or 0)
            return n, n, (self.dev_code(keys.device) if keys is not None else -1), extra
        keys = layer.keys
        code, b = -1, 0
        if keys is None or keys.dim() != 4:
            rows = 0
        else:
            rows = keys.shape[2]
            code = self.dev_code(keys.device)
            rb = st.row_bytes.get(i)
            if rb is None:
                rb = st.row_bytes[i] = layer_kinds.row_bytes(layer, keys)
            b = rows * rb
        if i in st.hybrid:  # its state's bytes too: fixed-size, so the row count misses them
            sb = st.state_bytes.get(i)
            if sb is None:
                sb = layer_kinds.state_read(layer)[1]
                if sb:
                    st.state_bytes[i] = sb
            b += sb
        if reader == "dyn":
            return rows, rows, code, b
        if reader == "dynslide":
            return int(getattr(layer, "cumulative_length", rows)), rows, code, b
        s = self._static_seen(st, i, layer, q_len)
        cap = st.shapes[i].capacity
        return s, min(s, cap if cap is not None else rows), code, b

    def _static_seen(self, st: _CacheState, i: int, layer, q_len: int) -> int:
        cum = getattr(layer, "cumulative_length_int", None)
        if isinstance(cum, int):
            return cum
        cum = getattr(layer, "cumulative_length", None)
        if isinstance(cum, int):
            return cum
        if cum is not None and getattr(cum, "device", None) is not None and cum.device.type == "cpu":
            return int(cum)
        # On an accelerator, reading the 0-d counter would sync: advance our own instead.
        # 4.56's StaticLayer has no counter at all (it counts non-zero rows).
        est = st.est_seen.get(i, 0) + int(q_len)
        st.est_seen[i] = est
        return est

    def resync(self, cache) -> None:
        """Re-read exact counters (may sync); call at turn boundaries and after crops."""
        if cache is None:
            return
        st = self._state(cache)
        for i, layer in enumerate(self._layers(cache)):
            if i in st.est_seen or _storage_of(layer) == "static":
                st.est_seen[i] = _exact_seen(layer)

    # -- full snapshot ----------------------------------------------------------------------
    def snapshot(self, cache) -> CacheSnapshot:
        """Everything about ``cache`` including held bytes; may sync (end of turn only)."""
        if cache is None:
            return CacheSnapshot(0, "None", False, [])
        cache_id, _ = self.identify(cache)
        shapes = self.shapes(cache)
        self.resync(cache)
        layers = self._layers(cache)
        out = []
        for shape, layer in zip(shapes, layers):
            tensors = _tensors_of(layer)
            logical = sum(t.numel() * t.element_size() for t in tensors)
            held = _held_bytes(tensors)
            main = _main_tensor(layer, tensors)
            device = str(main.device) if main is not None else "-"
            if device == "cuda":
                device = "cuda:0"
            home = str(getattr(layer, "device", None) or device) if not isinstance(layer, tuple) else device
            dtype = str(main.dtype).removeprefix("torch.") if main is not None else "-"
            batch = int(main.shape[0]) if main is not None and main.dim() >= 3 else None
            if shape.storage in ("none", "linear"):
                seen = stored = None
            else:
                seen = _exact_seen(layer)
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
            cache_class=_cls_name(cache),
            offloading=bool(getattr(cache, "offloading", False)),
            layers=out,
            groups=kind_groups((lay.index, _agree_key(lay, shape, layer)) for lay, shape, layer in zip(out, shapes, layers)
                               if shape.storage != "none"),
        )


def _agree_key(lay: LayerSnapshot, shape: LayerShape, layer) -> tuple:
    keys = None if isinstance(layer, tuple) else getattr(layer, "keys", None)
    rb = layer_kinds.row_bytes(layer, keys) if keys is not None and getattr(keys, "dim", None) and keys.dim() == 4 else 0
    return (replace(shape, index=0), lay.device, lay.dtype, rb)


def _exact_seen(layer) -> int:
    if isinstance(layer, tuple):
        return int(layer[0].shape[-2])
    for attr in ("cumulative_length_int", "cumulative_length"):
        v = getattr(layer, attr, None)
        if v is not None and not callable(v):
            return int(v)
    keys = getattr(layer, "keys", None)
    if _cls_name(layer) == "StaticLayer" and keys is not None and keys.dim() == 4:
        return int(layer.get_seq_length())  # 4.56: counts non-zero rows
    if keys is None or keys.dim() != 4:
        return 0
    return int(keys.shape[-2])


def _tensors_of(layer) -> list:
    import torch

    if isinstance(layer, tuple):
        return [t for t in layer if isinstance(t, torch.Tensor)]
    found: list = []
    seen_ids: set[int] = set()

    def visit(obj, depth: int) -> None:
        if isinstance(obj, torch.Tensor):
            # 0-d integer tensors are bookkeeping (5.x sliding layers keep ``_sliding_window_tensor``),
            # not K/V data; 0-d float ones are kept (fp8 scales belong to the quantized payload).
            if obj.dim() == 0 and not obj.is_floating_point():
                return
            if id(obj) not in seen_ids:
                seen_ids.add(id(obj))
                found.append(obj)
        elif depth < 3 and isinstance(obj, (tuple, list)):
            for o in obj:
                visit(o, depth + 1)
        elif depth < 3 and isinstance(obj, dict):
            for o in obj.values():
                visit(o, depth + 1)
        elif depth < 2 and hasattr(obj, "__dict__") and type(obj).__module__.startswith("optimum"):
            for o in vars(obj).values():
                visit(o, depth + 1)

    for name, val in vars(layer).items():
        if name.startswith("cumulative_length") or name.endswith("cumulative_length"):
            continue
        visit(val, 0)
    return found


def _quant_main(layer):
    """``(tensor for the device, K/V bytes)`` of a quantized layer, from shapes only (no sync).

    fp8 keeps ``(data, scale)`` tuples in ``_quantized_keys/_values``; quanto/hqq keep their own
    objects there, whose bytes only the end-of-turn walk can count: the residual is used then.
    """
    total = 0
    main = None
    for name in ("_quantized_keys", "_quantized_values", "keys", "values"):
        t = getattr(layer, name, None)
        if isinstance(t, (tuple, list)) and t:
            t = t[0]
        if t is None or not hasattr(t, "element_size") or not hasattr(t, "numel"):
            continue
        try:
            total += t.numel() * t.element_size()
        except (RuntimeError, TypeError):
            continue
        if main is None and t.dim() == 4:
            main = t
    return main, total


def _held_bytes(tensors) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            total += t.numel() * t.element_size()
            continue
        ptr = st.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        total += st.nbytes()
    return total


def _main_tensor(layer, tensors):
    k = layer[0] if isinstance(layer, tuple) else getattr(layer, "keys", None)
    if k is not None and hasattr(k, "device") and k.numel() > 0:
        return k
    for t in tensors:
        if t.numel() > 0:
            return t
    return k if k is not None else None
