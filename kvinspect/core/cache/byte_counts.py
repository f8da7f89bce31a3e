"""How many bytes a cache layer takes: per stored row, its conv/recurrent state, and every tensor it holds.

The step read counts from shapes only (no device sync): ``row_bytes`` once per layer, times the rows.
The end-of-turn snapshot walks every tensor (``tensors_of``) for the logical bytes and their storages
(``held_bytes``) for what the allocator holds.
"""

from __future__ import annotations


def state_tensors(layer) -> list:
    """The conv and recurrent state tensors a (hybrid) linear-attention layer holds now."""
    out: list = []
    for attr in ("conv_states", "recurrent_states"):
        states = getattr(layer, attr, None)
        if isinstance(states, dict):
            out.extend(t for t in states.values() if t is not None and hasattr(t, "numel"))
    return out


def state_read(layer) -> tuple[object | None, int]:
    """``(device, bytes)`` of a state layer, from shapes only (no sync); device None before any state."""
    device = None
    total = 0
    for t in state_tensors(layer):
        if device is None:
            device = t.device
        total += t.numel() * t.element_size()
    return device, total


def row_bytes(layer, keys) -> int:
    """Bytes one stored token costs: its key and value rows, plus its indexer-key row on indexed layers.

    Values are measured on their own: MLA layers (DeepSeek V3.2) keep values narrower than keys.
    """
    def per_row(t, token_dim: int) -> int:
        if t is None or not hasattr(t, "shape") or t.dim() <= token_dim or t.shape[token_dim] == 0:
            return 0
        return t.numel() // t.shape[token_dim] * t.element_size()

    total = per_row(keys, 2)
    values = getattr(layer, "values", None)
    total += per_row(values, 2) if values is not None else per_row(keys, 2)
    total += per_row(getattr(layer, "indexer_keys", None), 1)
    return total


def tensors_of(layer) -> list:
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


def quant_main(layer):
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


def held_bytes(tensors) -> int:
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


def main_tensor(layer, tensors):
    k = layer[0] if isinstance(layer, tuple) else getattr(layer, "keys", None)
    if k is not None and hasattr(k, "device") and k.numel() > 0:
        return k
    for t in tensors:
        if t.numel() > 0:
            return t
    return k if k is not None else None
