"""The stream: typed, immutable messages that a session produces, and their JSON line form.

A session (kvinspect's own chat loop, or an observed user loop) emits one sequence of these
messages. Its sinks are the trace file, the in-memory :class:`~.record.TraceRecord`, the engine's
pipe and callbacks. The line form of a message is exactly one line of the trace file
(docs/trace-format.md), so one decoder serves a file, a followed file and a live engine.
``TRACE_KINDS`` are the kinds a trace file keeps; the others (tokens, progress, errors) are
live-only and a file sink skips them. A payload object (a TurnRecord, an Event) is not changed
after its message is emitted.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvinspect.core.detect.events import Event
from kvinspect.core.trace.record import STEP_LAYER, STEP_SCALARS, TurnRecord

FORMAT = "kvinspect-trace"
VERSION = 1
#: How step columns are packed: little-endian arrays, integer columns delta-encoded, zlib, base64.
#: Written in every step chunk so a faster codec can come later without a version bump.
CODEC = "zlib-delta-b64"

DTYPES = {**STEP_SCALARS, **STEP_LAYER}
#: Series stored as deltas between consecutive steps (monotone-ish, so they compress to nothing).
#: Integers only: a float delta does not always sum back to the same bits, and a trace must
#: read back exactly what was recorded (``t`` costs ~6 bytes a step raw).
DELTA = frozenset({"seen", "stored", "nbytes", "rss", "accel_allocated", "accel_reserved", "turn", "cache_id"})


class MessageError(ValueError):
    """A line of a known kind whose fields are missing or of the wrong type."""


@dataclass(frozen=True, slots=True)
class Header:
    """The first line: format, versions, machine, model, layers, session settings, ``n_layers``."""

    data: dict[str, Any]

    kind = "header"

    @property
    def n_layers(self) -> int:
        return int(self.data.get("n_layers", 0))


@dataclass(frozen=True, slots=True)
class Devices:
    devices: tuple[str, ...]

    kind = "devices"


@dataclass(frozen=True, slots=True)
class Steps:
    """Steps ``first`` … ``first + n - 1``: every column of :data:`DTYPES`, ``n`` rows each."""

    first: int
    n: int
    cols: dict[str, np.ndarray] = field(repr=False)

    kind = "steps"


@dataclass(frozen=True, slots=True)
class TurnStart:
    index: int
    user: str
    policy: str
    cache_impl: str
    first_step: int
    settings: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0  # 0: not known when the turn began (an observed loop)

    kind = "turn_start"


@dataclass(frozen=True, slots=True)
class Turn:
    """A finished turn (status ok, stopped, failed, interrupted) with everything measured."""

    turn: TurnRecord

    kind = "turn"


@dataclass(frozen=True, slots=True)
class EventMsg:
    event: Event

    kind = "event"


@dataclass(frozen=True, slots=True)
class Note:
    """A free-form session fact for viewers (the model finished loading, observer errors …)."""

    key: str
    value: Any

    kind = "note"


@dataclass(frozen=True, slots=True)
class End:
    steps: int
    turns: int

    kind = "end"


# -- live-only kinds (never written to a trace file) ---------------------------------------------

@dataclass(frozen=True, slots=True)
class Token:
    """Reply text of turn ``turn`` since the previous Token (several tokens may be coalesced)."""

    turn: int
    text: str

    kind = "token"


@dataclass(frozen=True, slots=True)
class Progress:
    """A stage of a slow task (``load``, ``fetch``, ``compare``); ``fraction`` None when unknown."""

    task: str
    stage: str
    fraction: float | None = None

    kind = "progress"


@dataclass(frozen=True, slots=True)
class Error:
    """A task failed; ``message`` is one line for the user."""

    task: str
    message: str

    kind = "error"


Message = Header | Devices | Steps | TurnStart | Turn | EventMsg | Note | End | Token | Progress | Error
TRACE_KINDS = frozenset({"header", "devices", "steps", "turn_start", "turn", "event", "note", "end"})


# -- arrays ------------------------------------------------------------------------------------------

def encode_array(a: np.ndarray, delta: bool) -> dict:
    dt = np.dtype(a.dtype).newbyteorder("<")
    arr = np.ascontiguousarray(a, dtype=dt)
    if delta and len(arr):
        if arr.dtype.kind == "f":
            arr = np.diff(arr, axis=0, prepend=np.zeros((1,) + arr.shape[1:], arr.dtype))
        else:
            arr = np.diff(arr.astype(np.int64), axis=0, prepend=0).astype(dt)
    raw = zlib.compress(arr.tobytes(), 6)
    return {"dtype": dt.str, "shape": list(a.shape), "delta": bool(delta),
            "data": base64.b64encode(raw).decode("ascii")}


def decode_array(d: dict) -> np.ndarray:
    dt = np.dtype(d["dtype"])
    shape = tuple(int(x) for x in d["shape"])
    raw = zlib.decompress(base64.b64decode(d["data"]))
    arr = np.frombuffer(raw, dtype=dt).reshape(shape)
    if d.get("delta") and len(arr):
        if dt.kind == "f":
            arr = np.cumsum(arr, axis=0, dtype=dt)
        else:
            arr = np.cumsum(arr, axis=0, dtype=np.int64).astype(dt)
    return arr.astype(dt.newbyteorder("="), copy=False)


# -- line form ---------------------------------------------------------------------------------------

def to_line(msg: Message) -> dict:
    """The JSON object of one line (``{"type": kind, ...}``)."""
    if isinstance(msg, Header):
        return {"type": "header", "format": FORMAT, "version": VERSION, **msg.data}
    if isinstance(msg, Steps):
        cols = {name: encode_array(msg.cols[name], name in DELTA) for name in DTYPES if name in msg.cols}
        return {"type": "steps", "first": msg.first, "n": msg.n, "codec": CODEC, "cols": cols}
    if isinstance(msg, Devices):
        return {"type": "devices", "devices": list(msg.devices)}
    if isinstance(msg, Turn):
        return {"type": "turn", **msg.turn.to_dict()}
    if isinstance(msg, EventMsg):
        return {"type": "event", **msg.event.to_dict()}
    if isinstance(msg, TurnStart):
        return {"type": "turn_start", "index": msg.index, "user": msg.user, "policy": msg.policy,
                "cache_impl": msg.cache_impl, "first_step": msg.first_step, "settings": msg.settings,
                "prompt_tokens": msg.prompt_tokens}
    if isinstance(msg, Note):
        return {"type": "note", "key": msg.key, "value": msg.value}
    if isinstance(msg, End):
        return {"type": "end", "steps": msg.steps, "turns": msg.turns}
    if isinstance(msg, Token):
        return {"type": "token", "turn": msg.turn, "text": msg.text}
    if isinstance(msg, Progress):
        return {"type": "progress", "task": msg.task, "stage": msg.stage, "fraction": msg.fraction}
    if isinstance(msg, Error):
        return {"type": "error", "task": msg.task, "message": msg.message}
    raise TypeError(f"not a stream message: {type(msg).__name__}")


def dumps(msg: Message) -> str:
    """One line of JSON, without its newline."""
    return json.dumps(to_line(msg), separators=(",", ":"), default=json_default)


def json_default(o):
    """JSON for numpy scalars and arrays and paths (the values a trace carries); TypeError otherwise."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _str(obj: dict, key: str, default: str = "") -> str:
    v = obj.get(key, default)
    if v is None:
        return default
    if not isinstance(v, str):
        raise MessageError(f"{key} is {type(v).__name__}, not text")
    return v


def _int(obj: dict, key: str, default: int | None = None) -> int:
    v = obj.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        if v is None and default is not None:
            return default
        raise MessageError(f"{key} is {'missing' if v is None else type(v).__name__}, not an integer")
    return v


def from_line(obj: dict) -> Message | None:
    """The message of one decoded line; None for a kind this version does not know (a newer writer).

    Raises :class:`MessageError` (or ``KeyError``/``ValueError``/``zlib.error`` from a damaged step
    chunk) for a known kind whose content is damaged.
    """
    kind = obj.get("type")
    if kind == "steps":
        codec = obj.get("codec", CODEC)
        if codec != CODEC:
            raise MessageError(f"step codec {codec!r} is not known to this kvinspect (it reads {CODEC!r})")
        raw_cols = obj["cols"]
        if not isinstance(raw_cols, dict):
            raise MessageError("cols is not an object")
        cols = {name: decode_array(spec) for name, spec in raw_cols.items() if name in DTYPES}
        n = _int(obj, "n")
        if any(len(v) != n for v in cols.values()):
            raise MessageError("column lengths differ")
        return Steps(_int(obj, "first"), n, cols)
    if kind == "turn":
        return Turn(TurnRecord.from_dict({k: v for k, v in obj.items() if k != "type"}))
    if kind == "event":
        return EventMsg(Event.from_dict({k: v for k, v in obj.items() if k != "type"}))
    if kind == "devices":
        devs = obj["devices"]
        if not isinstance(devs, list):
            raise MessageError("devices is not a list")
        return Devices(tuple(str(d) for d in devs))
    if kind == "turn_start":
        settings = obj.get("settings") or {}
        if not isinstance(settings, dict):
            raise MessageError("settings is not an object")
        return TurnStart(_int(obj, "index"), _str(obj, "user"), _str(obj, "policy"), _str(obj, "cache_impl"),
                         _int(obj, "first_step", 0), settings, _int(obj, "prompt_tokens", 0))
    if kind == "header":
        return Header({k: v for k, v in obj.items() if k != "type"})
    if kind == "note":
        return Note(str(obj.get("key")), obj.get("value"))
    if kind == "end":
        return End(_int(obj, "steps", 0), _int(obj, "turns", 0))
    if kind == "token":
        return Token(_int(obj, "turn", 0), _str(obj, "text"))
    if kind == "progress":
        frac = obj.get("fraction")
        return Progress(_str(obj, "task"), _str(obj, "stage"), None if frac is None else float(frac))
    if kind == "error":
        return Error(_str(obj, "task"), _str(obj, "message"))
    return None
