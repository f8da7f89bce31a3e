"""What each layer is, as the window shows it: what the cache did at the last finished turn,
else (before any turn) what the config asks for. One reading for the heatmap's layer axis,
the layer picker, the tokens lane's window lines and the toolbar."""

from __future__ import annotations

from kvinspect.core.model.catalog import KIND_LETTER


def cache_layers(record) -> list[dict] | None:
    """The per-layer rows of the last finished turn that reported every layer, or None."""
    for t in reversed(record.turns):
        if t.layers and len(t.layers) == record.n_layers:
            return list(t.layers)
    return None


def layer_kinds(record) -> list[str]:
    """Kind of each layer: what the cache did at the last finished turn, else what the config asks."""
    layers = cache_layers(record)
    if layers is not None:
        return [lay.get("kind") or lay.get("attention") or "full" for lay in layers]
    info = record.header.get("layers") or []
    return [(info[i].get("config_attention") if i < len(info) else None) or "full" for i in range(record.n_layers)]


def layer_windows(record) -> list[int | None]:
    layers = cache_layers(record)
    if layers is not None:
        return [lay.get("window") for lay in layers]
    info = record.header.get("layers") or []
    return [info[i].get("window") if i < len(info) else None for i in range(record.n_layers)]


def kinds_summary(kinds: tuple[str, ...]) -> str:
    """("sliding",)*5 + ("full",) → "S×5, F"."""
    out: list[list] = []
    for k in kinds:
        letter = KIND_LETTER.get(k, "?")
        if out and out[-1][0] == letter:
            out[-1][1] += 1
        else:
            out.append([letter, 1])
    return ", ".join(f"{a}×{n}" if n > 1 else a for a, n in out)
