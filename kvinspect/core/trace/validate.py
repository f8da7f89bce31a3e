"""The one validating decoder of trace lines: every field checked for type and range before use.

A trace is input like any other: a file edited by hand, cut by a crash, or made to hurt. Every
consumer (``report``, ``view``, ``view --follow``, the window's engine stream) decodes its lines
here, so a number in the file can never make a reader allocate more than the file can hold:

* a step chunk's arrays must have exactly the dtype and shape their rows and the header's layer
  count say, and decompress to exactly that many bytes; decompression stops there
  (:data:`MAX_RATIO`, :data:`MAX_ARRAY_BYTES`), so a zlib bomb costs what its claim costs;
* a step chunk cannot claim more rows than its own bytes decode to, and the gap before it (rows
  of lost lines, padded so step numbers stay true) is bounded by the bytes read so far;
* a turn number is bounded by the lines read so far (a lost turn cost at least one line);
* layer counts are capped at :data:`MAX_LAYERS`.

A line that fails is a :class:`~.messages.MessageError` (the reader skips it with a note); a
header that fails is a :class:`~kvinspect.core.errors.TraceError` (one line, exit 2).
"""

from __future__ import annotations

import base64
import binascii
import math
import types
import typing
import zlib
from dataclasses import fields
from typing import Any, Union

import numpy as np

from kvinspect.core.detect.events import Event
from kvinspect.core.errors import TraceError
from kvinspect.core.trace.messages import (
    CODEC,
    DTYPES,
    Header,
    Message,
    MessageError,
    Steps,
    from_line,
)
from kvinspect.core.trace.record import STEP_LAYER, TurnRecord

#: More layers than any model has; a header or a turn claiming more is damaged.
MAX_LAYERS = 10_000
#: zlib's best case is about 1032:1 (deflate's longest match over its shortest code), so a chunk
#: that claims to inflate further is lying about its shape.
MAX_RATIO = 1032
#: One decoded array; a 100k-step turn of a 64-layer model needs 51 MB for its widest column.
MAX_ARRAY_BYTES = 512 << 20
#: Integers a JSON writer can round-trip; anything beyond is not a count kvinspect wrote.
MAX_INT = 2**53
#: Token-id lists (prompt ids): bounded like a context, ids within a vocabulary's range.
MAX_IDS = 10_000_000
MAX_ID = 2**31
#: Rows of a step with no layers still cost this much raw (the scalar columns).
_SCALAR_ROW_BYTES = sum(np.dtype(dt).itemsize for name, dt in DTYPES.items() if name not in STEP_LAYER)
_LAYER_ROW_BYTES = sum(np.dtype(dt).itemsize for dt in STEP_LAYER.values())


def row_bytes(n_layers: int) -> int:
    """Raw bytes of one step row of every column."""
    return _SCALAR_ROW_BYTES + _LAYER_ROW_BYTES * max(n_layers, 0)


def max_steps_for(nbytes: int, n_layers: int) -> int:
    """The most step rows ``nbytes`` of a trace can hold (every column at zlib's best ratio)."""
    return max(nbytes, 0) * MAX_RATIO // row_bytes(n_layers) + 1


# -- the header --------------------------------------------------------------------------------------

class _Num:
    """A JSON number (an int or a float, never a boolean)."""


class _Ids:
    """A list of token ids: at most :data:`MAX_IDS`, each -1 (not seen) or within a vocabulary's range."""


#: The nested shape of what readers use: a type (or tuple), an object spec (``"*"``: any other key),
#: or ``[spec]`` (a list of those). ``None`` is accepted everywhere (an absent value).
_LAYER_INFO = {"index": int, "config_attention": str, "layer_type": str, "window": int, "*": object}
HEADER_SCHEMA: dict[str, Any] = {
    "n_layers": int, "created": str, "device": str, "run_in": str, "command": [str], "notes": {"*": object},
    "versions": {"*": str}, "machine": {"*": object}, "memory": {"kind": str, "*": object},
    "layers": [_LAYER_INFO],
    "model": {"spec": str, "name": str, "source": str, "class": str, "device": str, "dtype": str,
              "load_seconds": _Num, "notes": [str], "config": {"model_type": str, "architectures": [str],
                                                                "*": object},
              "generation_config": {"*": object}, "*": object},
    "session": {"policy": str, "cache_impl": str, "system": str, "chat_template": str, "chat_template_text": str,
                "max_cache_len": int, "generation_config_overrides": {"*": object},
                "respect_generation_config": bool, "settings": {"*": object}, "*": object},
    "*": object,
}
#: Nested parts of a ``turn`` line the dataclass annotations do not spell out.
TURN_PARTS: dict[str, Any] = {
    "layers": [{"index": int, "kind": str, "attention": str, "config_attention": str, "storage": str, "cls": str,
                "seen": int, "stored": int, "capacity": int, "window": int, "device": str, "home_device": str,
                "dtype": str, "bytes": int, "held_bytes": int, "*": object}],
    "checklist": [{"key": str, "title": str, "status": str, "evidence": str, "*": object}],
    # core/tokens/ids.py: the ids a turn fed, relative to an earlier turn's
    "ids": {"base_turn": int, "base_len": int, "prompt": _Ids, "generated": _Ids, "pieces": {"*": str},
            "*": object},
    # core/detect/media.py: one entry per image of the prompt
    "media": [{"image": int, "turn": int, "first": int, "last": int, "tokens": int, "wrap_first": int,
               "wrap_last": int, "hash": str, "hash_given": str, "encoded": bool, "size": [int], "held": [int],
               "*": object}],
}


def check_shape(v: Any, spec: Any, where: str) -> None:
    """``v`` fits ``spec`` (see :data:`HEADER_SCHEMA`); MessageError naming the first place it does not."""
    if v is None or spec is object:
        return
    if spec is _Ids:
        if not isinstance(v, list) or len(v) > MAX_IDS or not all(_is_int(x) and -1 <= x < MAX_ID for x in v):
            raise MessageError(f"{where} is not a list of at most {MAX_IDS:,} token ids")
        return
    if isinstance(spec, dict):
        if not isinstance(v, dict):
            raise MessageError(f"{where} is {_kind(v)}, not an object")
        other = spec.get("*", object)
        for k, x in v.items():
            check_shape(x, spec.get(k, other), f"{where}.{k}")
        return
    if isinstance(spec, list):
        if not isinstance(v, list):
            raise MessageError(f"{where} is {_kind(v)}, not a list")
        if len(v) > MAX_LAYERS * 10:
            raise MessageError(f"{where} has {len(v):,} items")
        for i, x in enumerate(v):
            check_shape(x, spec[0], f"{where}[{i}]")
        return
    types_ = spec if isinstance(spec, tuple) else (spec,)
    if isinstance(v, bool):
        ok = bool in types_
    elif isinstance(v, int):
        ok = (int in types_ or _Num in types_) and abs(v) <= MAX_INT
    elif isinstance(v, float):
        ok = float in types_ or _Num in types_
    else:
        ok = isinstance(v, tuple(t for t in types_ if t is not _Num))
    if not ok:
        want = "an integer in range" if types_ == (int,) else _kind_name(types_[0])
        raise MessageError(f"{where} is {_show(v) if isinstance(v, (int, float)) else _kind(v)}, not {want}")


def header_data(obj: dict, name: str) -> dict:
    """The header line's fields (without ``type``), checked; TraceError with one line otherwise."""
    n = obj.get("n_layers", 0)
    if not _is_int(n) or not 0 <= n <= MAX_LAYERS:
        raise TraceError(f"{name}: header n_layers is {_show(n)}, not a layer count (0 to {MAX_LAYERS:,})")
    body = {k: v for k, v in obj.items() if k != "type"}
    try:
        check_shape(body, HEADER_SCHEMA, "header")
    except MessageError as exc:
        raise TraceError(f"{name}: {exc}") from None
    if len(body.get("layers") or []) > MAX_LAYERS:
        raise TraceError(f"{name}: header lists more than {MAX_LAYERS:,} layers")
    return body


# -- one line ----------------------------------------------------------------------------------------

def message(obj: dict, *, n_layers: int, line_bytes: int, bytes_read: int, lines_read: int) -> Message | None:
    """The checked message of one line after the header; None for a kind this version does not know.

    ``line_bytes``: the size of this line; ``bytes_read`` and ``lines_read``: how much of the
    source came before and including it (they bound lost steps and lost turns).
    Raises :class:`MessageError` naming the first bad field.
    """
    kind = obj.get("type")
    if kind == "steps":
        return _steps(obj, n_layers, line_bytes, bytes_read)
    if kind == "turn_start":
        settings = obj.get("settings") or {}
        if not isinstance(settings, dict):
            raise MessageError("settings is not an object")
        _index(obj, "index", lines_read)
        for key in ("user", "policy", "cache_impl"):
            _text(obj, key)
        _count(obj, "first_step", 0)
        _count(obj, "prompt_tokens", 0)
        for key, value in obj.items():
            if key.endswith("_ids"):
                _check(value, list[int] | None, key)
            elif key == "ids":
                check_shape(value, TURN_PARTS["ids"], key)
        return from_line(obj)  # built by the one decoder, so fields a writer adds there are kept
    if kind == "turn":
        body = {k: v for k, v in obj.items() if k != "type"}
        _index(body, "index", lines_read)
        _check_fields(TurnRecord, body)
        for key, spec in TURN_PARTS.items():
            check_shape(body.get(key), spec, key)
        ids = body.get("ids")
        if isinstance(ids, dict):
            base = ids.get("base_turn", -1)
            if base is not None and not -1 <= base < body["index"]:
                raise MessageError(f"ids.base_turn {base} is not an earlier turn")
        if len(body.get("layers") or []) > MAX_LAYERS:
            raise MessageError(f"layers lists more than {MAX_LAYERS:,} layers")
        return from_line(obj)
    if kind == "event":
        body = {k: v for k, v in obj.items() if k != "type"}
        if "kind" not in body:
            raise MessageError("kind is missing")
        _check_fields(Event, body)
        if len(body.get("layers") or []) > MAX_LAYERS:
            raise MessageError(f"layers lists more than {MAX_LAYERS:,} layers")
        return from_line(obj)
    if kind == "devices":
        devs = obj.get("devices")
        if not isinstance(devs, list) or len(devs) > 127 or not all(isinstance(d, str) for d in devs):
            raise MessageError("devices is not a list of at most 127 device names")
        return from_line(obj)
    if kind == "note":
        note_key = obj.get("key")
        if not isinstance(note_key, str):
            raise MessageError(f"key is {_kind(note_key)}, not text")
        return from_line(obj)
    if kind == "end":
        _count(obj, "steps", 0)
        _count(obj, "turns", 0)
        return from_line(obj)
    if kind == "header":
        return Header(header_data(obj, "line"))
    return from_line(obj)  # live-only kinds check their own fields; unknown kinds are None


def _steps(obj: dict, n_layers: int, line_bytes: int, bytes_read: int) -> Steps:
    codec = obj.get("codec", CODEC)
    if codec != CODEC:
        raise MessageError(f"step codec {_show(codec)} is not known to this kvinspect (it reads {CODEC!r})")
    first, n = _count(obj, "first"), _count(obj, "n")
    if n > max_steps_for(line_bytes, n_layers):
        raise MessageError(f"claims {n:,} steps, more than its {line_bytes:,} bytes can hold")
    if first > max_steps_for(bytes_read, n_layers):
        raise MessageError(f"starts at step {first:,}, more than the {bytes_read:,} bytes read so far can hold")
    raw_cols = obj.get("cols")
    if not isinstance(raw_cols, dict):
        raise MessageError("cols is not an object")
    cols = {}
    for name, spec in raw_cols.items():
        if name not in DTYPES:
            continue  # a column a newer writer added
        shape = (n,) if name not in STEP_LAYER else (n, n_layers)
        cols[name] = decode_column(name, spec, shape)
    if n and not cols:
        raise MessageError(f"claims {n:,} steps but holds none of their columns")
    return Steps(first, n, cols)


def _numpy_dtype(spec: Any) -> np.dtype:
    if isinstance(spec, str):
        dt = _DTYPE_OF.get(spec)
        if dt is None:
            dt = np.dtype(spec)  # a bad name raises here, before it is remembered
            if len(_DTYPE_OF) < 64:
                _DTYPE_OF[spec] = dt
        return dt
    return np.dtype(spec)


#: dtype names seen in step columns: a live stream decodes a dozen columns a token, and parsing the
#: same few names again each time was a tenth of a column's cost.
_DTYPE_OF: dict[str, np.dtype] = {}
_WANT = {name: np.dtype(dt) for name, dt in DTYPES.items()}


def decode_column(name: str, spec: Any, shape: tuple[int, ...]) -> np.ndarray:
    """One step column, decoded only as far as its shape allows; MessageError when it does not fit."""
    if not isinstance(spec, dict):
        raise MessageError(f"column {name} is not an object")
    want = _WANT[name]
    try:
        dt = _numpy_dtype(spec.get("dtype"))
    except (TypeError, ValueError):
        raise MessageError(f"column {name}: dtype {_show(spec.get('dtype'))} is not a numpy dtype") from None
    if dt.kind != want.kind or dt.itemsize != want.itemsize:
        raise MessageError(f"column {name}: dtype {dt.str} is not {want.newbyteorder('<').str}")
    got = spec.get("shape")
    if not isinstance(got, list) or got != list(shape):
        raise MessageError(f"column {name}: shape {_show(got)} is not {list(shape)}")
    data = spec.get("data")
    if not isinstance(data, str):
        raise MessageError(f"column {name}: data is not base64 text")
    size = dt.itemsize * math.prod(shape)
    if size > MAX_ARRAY_BYTES:
        raise MessageError(f"column {name}: {size:,} bytes is more than one chunk may hold")
    try:
        packed = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MessageError(f"column {name}: data is not base64") from None
    if size > max(len(packed), 1) * MAX_RATIO:
        raise MessageError(f"column {name}: {len(packed):,} compressed bytes cannot hold {size:,}")
    z = zlib.decompressobj()
    try:
        raw = z.decompress(packed, size)
        if len(raw) == size and not z.unconsumed_tail:
            raw += z.flush()
    except zlib.error as exc:
        raise MessageError(f"column {name}: {exc}") from None
    if len(raw) != size or z.unconsumed_tail or not z.eof:
        raise MessageError(f"column {name}: its data does not decompress to {shape} values")
    arr = np.frombuffer(raw, dtype=dt).reshape(shape)
    # A delta column's running sum over one row is that row: a live stream's blocks are one or two
    # steps, and the sum's setup cost more than its work.
    if spec.get("delta") and len(arr) > 1:
        with np.errstate(over="ignore", invalid="ignore"):
            if dt.kind == "f":
                arr = np.cumsum(arr, axis=0, dtype=dt)
            else:
                arr = np.cumsum(arr, axis=0, dtype=np.int64).astype(dt)
    return arr if dt.isnative else arr.astype(dt.newbyteorder("="))


# -- fields ------------------------------------------------------------------------------------------

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    return "missing" if v is None else {"str": "text", "dict": "an object", "list": "a list", "bool": "a boolean",
                                        "int": "an integer", "float": "a number"}.get(type(v).__name__,
                                                                                     type(v).__name__)


def _kind_name(t: type) -> str:
    return {str: "text", dict: "an object", list: "a list", int: "an integer", float: "a number"}.get(t, t.__name__)


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "…"


def _text(obj: dict, key: str) -> str:
    v = obj.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise MessageError(f"{key} is {_kind(v)}, not text")
    return v


def _count(obj: dict, key: str, default: int | None = None) -> int:
    v = obj.get(key, default)
    if v is None and default is not None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_INT:
        raise MessageError(f"{key} is {_show(v) if _is_int(v) else _kind(v)}, not a count")
    return v


def _index(obj: dict, key: str, lines_read: int) -> int:
    v = _count(obj, key)
    if v >= max(lines_read, 1):
        raise MessageError(f"{key} {v:,} is more turns than the {lines_read:,} lines read so far can hold")
    return v


_HINTS: dict[type, dict[str, Any]] = {}


def _check_fields(cls: type, body: dict) -> None:
    """Each known field of ``cls`` present in ``body`` must match the dataclass's annotation."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in body:
            _check(body[f.name], hints[f.name], f.name)
    for key, value in body.items():
        if key.endswith("_ids") and key not in hints:
            _check(value, list[int] | None, key)  # token ids a newer writer adds


def _check(v: Any, hint: Any, where: str) -> None:  # noqa: C901 - one case per annotation form
    if hint is Any:
        return
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in typing.get_args(hint):
            return
        errors = []
        for arm in typing.get_args(hint):
            if arm is type(None):
                continue
            try:
                _check(v, arm, where)
                return
            except MessageError as exc:
                errors.append(exc)
        raise errors[0] if errors else MessageError(f"{where} is {_kind(v)}")
    if hint is bool:
        if not isinstance(v, bool):
            raise MessageError(f"{where} is {_kind(v)}, not true or false")
    elif hint is int:
        if not _is_int(v) or abs(v) > MAX_INT:
            raise MessageError(f"{where} is {_show(v) if _is_int(v) else _kind(v)}, not an integer in range")
        if where.endswith(("_step", "_tokens", "_bytes", "_rss", "index", "cache_id")) and v < 0:
            raise MessageError(f"{where} is {v}, not a count")
    elif hint is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise MessageError(f"{where} is {_kind(v)}, not a number")
    elif hint is str:
        if not isinstance(v, str):
            raise MessageError(f"{where} is {_kind(v)}, not text")
    elif origin is list or hint is list:
        if not isinstance(v, list):
            raise MessageError(f"{where} is {_kind(v)}, not a list")
        args = typing.get_args(hint)
        if where.endswith("_ids"):
            if len(v) > MAX_IDS or not all(_is_int(x) and 0 <= x < MAX_ID for x in v):
                raise MessageError(f"{where} is not a list of at most {MAX_IDS:,} token ids")
            return
        for i, x in enumerate(v):
            if args:
                _check(x, args[0], f"{where}[{i}]")
    elif origin is dict or hint is dict:
        if not isinstance(v, dict):
            raise MessageError(f"{where} is {_kind(v)}, not an object")
        args = typing.get_args(hint)
        if len(args) == 2:
            for k, x in v.items():
                _check(x, args[1], f"{where}.{k}")
    # other annotations (none today) are not checked


class LineDecoder:
    """:func:`message` for a stream of lines (the window's engine pipe): it counts what came so far.

    A header starts a new session: the counts restart and its layer count applies from then on.
    Every failure, the header's included, is a :class:`MessageError` (the caller skips the line).
    """

    def __init__(self) -> None:
        self.n_layers = 0
        self.bytes_read = 0
        self.lines_read = 0

    def decode(self, obj: dict, line_bytes: int) -> Message | None:
        if obj.get("type") == "header":
            try:
                data = header_data(obj, "header")
            except TraceError as exc:
                raise MessageError(str(exc)) from None
            self.n_layers, self.bytes_read, self.lines_read = data.get("n_layers", 0), line_bytes + 1, 1
            return Header(data)
        self.bytes_read += line_bytes + 1
        self.lines_read += 1
        return message(obj, n_layers=self.n_layers, line_bytes=line_bytes, bytes_read=self.bytes_read,
                       lines_read=self.lines_read)
