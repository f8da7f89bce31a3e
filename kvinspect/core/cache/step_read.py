"""The per-step read: what every forward's cache holds per layer (seen, stored, device, bytes), with no device sync.

Runs in the step hook right after each forward, so it is tuned to a fixed handful of Python operations
(docs/probe.md, "What the hook does per forward"): the previous forward's cache is found by one identity
test, a grouped cache (:mod:`.layer_groups`) reads one layer per group, and a cache of plain dynamic layers
is read inline in :meth:`StepRead.observe`.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from kvinspect.core.cache import byte_counts
from kvinspect.core.cache.byte_counts import quant_main
from kvinspect.core.cache.identity import CacheIdentity, CacheState
from kvinspect.core.cache.layer_groups import LayerGroups
from kvinspect.core.cache.layer_shapes import (
    LayerClassifier,
    LayerShape,
    cls_name,
    is_hybrid_class,
    reader_for,
    storage_of,
)

NA = -1  # "no token axis" (linear-attention / shared layers) in integer series


class StepRead(CacheIdentity, LayerClassifier):
    """Reads the caches of one model after every forward; keeps a device table and per-cache groups."""

    def __init__(self, config, n_layers: int | None = None):
        CacheIdentity.__init__(self)
        LayerClassifier.__init__(self, config, n_layers)
        self.devices: list[str] = []  # device table: code -> "cpu", "cuda:0", ...
        self._dev_codes: dict = {}
        self.group_layers = True  # False: read every layer every forward (the benchmarks' baseline)
        self._none_row: tuple | None = None
        # Shapes, readers and groups of the caches seen so far, by their layers' structure: the next cache
        # built the same way (each generate() call makes one) is read by group from its first forward.
        self._templates: dict[tuple, tuple] = {}

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

    def shapes(self, cache) -> list[LayerShape]:
        st = self._state(cache)
        layers = self._layers(cache)
        if len(st.shapes) != len(layers):
            seen: dict = {}
            st.shapes = [self._shape_like(i, lay, seen) for i, lay in enumerate(layers)]
            st.readers = [reader_for(s) for s in st.shapes]
            st.hybrid = frozenset(s.index for s in st.shapes if is_hybrid_class(s.cls))
            st.groups = None
        return st.shapes

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

    def _read(self, st: CacheState, cache, q_len: int):
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

    def _plain(self, st: CacheState, groups: LayerGroups, layers) -> tuple | None:
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

    def _from_template(self, st: CacheState, cache, layers) -> LayerGroups | None:
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
                row_bytes[i] = byte_counts.row_bytes(layers[i], keys)
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

    def _read_all(self, st: CacheState, cache, q_len: int):
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

    def _read_layer(self, st: CacheState, i: int, layer, reader: str, q_len: int) -> tuple[int, int, int, int]:
        """``(seen, stored, device code, bytes)`` of one layer."""
        if reader == "na":
            return NA, NA, -1, 0
        if reader == "state":  # no token axis: seen/stored stay NA, the state's bytes count
            d, b = byte_counts.state_read(layer)
            return NA, NA, (self.dev_code(d) if d is not None else -1), b
        if reader == "legacy":
            k = layer[0]
            rows = int(k.shape[-2])
            return rows, rows, self.dev_code(k.device), 2 * k.numel() * k.element_size()
        if reader == "quant":
            # The data lives in the quantized tensors; ``keys`` is only the unquantized residual.
            keys, extra = quant_main(layer)
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
                rb = st.row_bytes[i] = byte_counts.row_bytes(layer, keys)
            b = rows * rb
        if i in st.hybrid:  # its state's bytes too: fixed-size, so the row count misses them
            sb = st.state_bytes.get(i)
            if sb is None:
                sb = byte_counts.state_read(layer)[1]
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

    def _static_seen(self, st: CacheState, i: int, layer, q_len: int) -> int:
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
            if i in st.est_seen or storage_of(layer) == "static":
                st.est_seen[i] = exact_seen(layer)


def exact_seen(layer) -> int:
    if isinstance(layer, tuple):
        return int(layer[0].shape[-2])
    for attr in ("cumulative_length_int", "cumulative_length"):
        v = getattr(layer, attr, None)
        if v is not None and not callable(v):
            return int(v)
    keys = getattr(layer, "keys", None)
    if cls_name(layer) == "StaticLayer" and keys is not None and keys.dim() == 4:
        return int(layer.get_seq_length())  # 4.56: counts non-zero rows
    if keys is None or keys.dim() != 4:
        return 0
    return int(keys.shape[-2])
