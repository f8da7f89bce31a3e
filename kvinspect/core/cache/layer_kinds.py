"""The kinds of cache layers users see: their order, letters, legend words and meanings, and each layer's kind.

One vocabulary for every place that names a layer's kind: the window (heatmap axis and legend, layer
picker, toolbar), the report (``cache.png``'s kind strip, the layers table's legend), the token view and
``kvinspect models``. Colours are the window theme's (``gui/base/theme.py``), keyed by these kinds.

The kind of a layer of a record has one rule, :func:`layer_kinds`: what the cache did at the latest
finished turn that reported every layer, else (before any turn) what the config asks for. So a Gemma 3n
KV-shared layer is "shared" wherever it is drawn, not the sliding/full attention its config names.
"""

from __future__ import annotations

FULL, SLIDING, CHUNKED, STATE, SHARED, INDEXED = "full", "sliding", "chunked", "state", "shared", "indexed"

#: Every kind, in the order legends, chips and icons list them.
KINDS = (FULL, SLIDING, CHUNKED, STATE, SHARED, INDEXED)

#: ``config.layer_types`` values → the kind users see (the rest: layer_shapes.ATTENTION_OF_LAYER_TYPE).
KIND_OF_LAYER_TYPE = {
    "linear_attention": STATE,
    "conv": STATE,
    "indexed_attention": INDEXED,
    "dummy": SHARED,
}

#: Letters in listings: F full, S sliding, C chunked, L recurrent/conv state (older traces say
#: "linear"), R reads another layer's K/V (shared), I indexed sparse attention.
LETTERS = {FULL: "F", SLIDING: "S", CHUNKED: "C", STATE: "L", "linear": "L", SHARED: "R", INDEXED: "I"}

#: Legend words, where the kind's name alone would not say it (the window's legend, ``cache.png``'s).
LEGEND = {STATE: "state (no tokens)", SHARED: "shared (reads another layer)", INDEXED: "indexed (+ indexer keys)"}

#: What the kinds without a token axis, or with extra tensors, mean (the report's layers-table legend).
MEANING = {
    STATE: "a recurrent/conv state of fixed size, no token axis (seen/stored do not apply; bytes are the state's)",
    SHARED: "reads another layer's K/V and stores none (0 bytes of its own)",
    INDEXED: "sparse attention: K/V plus an indexer-key cache, counted in its bytes",
}


def kind_of_shape(attention: str, storage: str) -> str:
    """A layer's kind as snapshots name it: its attention, ``static-`` for static storage, or ``quantized``."""
    if storage == "quantized":
        return "quantized"
    if storage == "static":
        return "static-" + attention
    return attention


def base_kind(kind: str | None) -> str:
    """One of :data:`KINDS`: ``static-sliding`` → ``sliding``; ``quantized`` → ``full`` (quantized caches are
    full only); ``linear`` (older traces) → ``state``; anything unknown → ``full``."""
    k = (kind or FULL).removeprefix("static-")
    if k == "quantized":
        return FULL
    if k == "linear":
        return STATE
    return k if k in KINDS else FULL


def kinds_short(kinds) -> str:
    """``S,F,S,F`` for a few layers; per-kind counts (``S×15,F×3``) once a list would not fit (``kvinspect models``)."""
    letters = [LETTERS.get(k, "?") for k in kinds]
    if len(letters) <= 8:
        return ",".join(letters)
    counts: dict[str, int] = {}
    for a in letters:
        counts[a] = counts.get(a, 0) + 1
    return ",".join(f"{a}×{n}" for a, n in counts.items())


def kinds_runs(kinds) -> str:
    """Runs of letters in layer order: ("sliding",)*5 + ("full",) → "S×5, F" (the model picker, the toolbar)."""
    out: list[list] = []
    for k in kinds:
        letter = LETTERS.get(k, "?")
        if out and out[-1][0] == letter:
            out[-1][1] += 1
        else:
            out.append([letter, 1])
    return ", ".join(f"{a}×{n}" if n > 1 else a for a, n in out)


def turn_layers(record, turn: int | None = None) -> list[dict] | None:
    """The per-layer rows of the latest finished turn (up to ``turn``) that reported every layer, or None."""
    turns = record.turns if turn is None else record.turns[: turn + 1]
    for t in reversed(turns):
        if t.layers and len(t.layers) == record.n_layers:
            return list(t.layers)
    return None


def layer_rows(record, turn: int | None = None) -> list[dict]:
    """Per layer, what is known of it: :func:`turn_layers`, else the trace header's config layers."""
    rows = turn_layers(record, turn)
    if rows is not None:
        return rows
    info = record.header.get("layers") or []
    return [info[i] if i < len(info) else {} for i in range(record.n_layers)]


def kind_of(row: dict) -> str:
    """The kind of one layer row: what the cache did (``kind``, older traces ``attention``), else what the
    config asks (``config_attention``: header rows), else full."""
    return str(row.get("kind") or row.get("attention") or row.get("config_attention") or FULL)


def layer_kinds(record, turn: int | None = None) -> list[str]:
    """The kind of each layer (``static-sliding``, ``quantized`` kept: :func:`base_kind` for one of :data:`KINDS`)."""
    return [kind_of(row) for row in layer_rows(record, turn)]


def layer_windows(record, turn: int | None = None) -> list[int | None]:
    """Each layer's window (sliding) or chunk (chunked) size, from the same rows as :func:`layer_kinds`."""
    return [row.get("window") for row in layer_rows(record, turn)]
