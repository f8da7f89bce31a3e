"""Input ids of observed forwards: kept cheaply while a turn runs, read once when it ends."""

from __future__ import annotations


def own_ids(t):
    """Keep an id tensor without pinning a larger buffer: generate() feeds views of its growing sequence."""
    if t is None or not hasattr(t, "untyped_storage"):
        return t
    try:
        if t.untyped_storage().nbytes() > 2 * t.numel() * t.element_size():
            return t.clone()  # an async copy on accelerators: no sync
    except (RuntimeError, NotImplementedError):
        pass
    return t


def rows(tensors: list) -> list[list[int] | None]:
    """Batch row 0 of each integer tensor as a list, with a single device sync for all of them."""
    import torch

    out: list[list[int] | None] = [None] * len(tensors)
    parts, where = [], []
    for i, t in enumerate(tensors):
        if t is None or not isinstance(t, torch.Tensor) or t.dim() < 1 or t.is_floating_point():
            continue
        row = t[0] if t.dim() >= 2 else t
        parts.append(row.reshape(-1))
        where.append(i)
    if not parts:
        return out
    try:
        dev = parts[0].device
        flat = torch.cat([p.to(dev) for p in parts]).tolist()
    except RuntimeError:
        flat = [v for p in parts for v in p.tolist()]
    pos = 0
    for i, p in zip(where, parts):
        n = p.numel()
        out[i] = [int(v) for v in flat[pos:pos + n]]
        pos += n
    return out
