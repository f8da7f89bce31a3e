"""The model toolbar's summary line (name, class, layer kinds, device) and path eliding."""

from __future__ import annotations

import html

from kvinspect.gui.base import theme as th
from kvinspect.gui.base.record_layers import cache_layers, kinds_summary, layer_kinds, layer_windows


def model_summary(info) -> str:
    """The toolbar line: name, class, layers with kind chips, windows, device, dtype."""
    return (f"<b>{html.escape(info.name)}</b> · {info.cls} · {info.n_layers} layers {_kinds_text(info.record)}"
            f" · {info.device} · {info.dtype}")


def trace_model_summary(record) -> str:
    """The toolbar line for a trace being viewed: its model, from the trace header."""
    m = record.header.get("model") or {}
    name = m.get("name") or m.get("spec") or "unknown model"
    dev, dtype, cls = (html.escape(str(m.get(k) or "?")) for k in ("device", "dtype", "class"))
    return (f"<i>trace of</i> <b>{html.escape(str(name))}</b> · {cls} · {record.n_layers} layers "
            f"{_kinds_text(record)} · {dev} · {dtype}")


def _kinds_text(record) -> str:
    """Kind chips, ``[S×2, F, R×3]``, windows and which layers shared ones read.

    The kinds are what the cache did at the last finished turn, as on the heatmap's layer axis
    (a Gemma 3n KV-shared layer is "shared", not the sliding/full its config names); before the
    first turn, what the config asks for.
    """
    kinds = tuple(th.kind_base(k) for k in layer_kinds(record))
    windows = sorted({w for w in layer_windows(record) if w})
    layers = cache_layers(record) or []
    chips = " ".join(f"<span style='color:{th.kind_color(k)}'>■</span>" for k in th.KIND_ORDER if k in set(kinds))
    win = f" · window {', '.join(map(str, windows))}" if windows else ""
    readers: dict[int, list[int]] = {}
    for lay in layers:
        if lay.get("reads_from") is not None:
            readers.setdefault(int(lay["reads_from"]), []).append(int(lay.get("index", 0)))
    shared = "; ".join(f"{','.join(map(str, r))} read{'s' if len(r) == 1 else ''} {src}" for src, r in readers.items())
    return f"{chips} [{kinds_summary(kinds)}]{win}" + (f" · shared: layers {shared}" if shared else "")


def elide(path: str | None, n: int = 48) -> str:
    if not path:
        return ""
    return path if len(path) <= n else "…" + path[-(n - 1):]
