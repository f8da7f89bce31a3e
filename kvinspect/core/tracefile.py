"""The trace file: JSON Lines, append-only, versioned, no pickle. See docs/trace-format.md.

Every line is one complete JSON object, so a file cut short by a crash or ``kill -9``
loses at most its last, partial line; the reader recovers every complete line and says
what it could not read. Per-step per-layer series travel as delta-encoded, zlib-compressed
little-endian arrays in base64, which keeps 100k steps × 64 layers within a few MB.
"""

from __future__ import annotations

import base64
import json
import os
import re
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from .errors import TraceError
from .events import Event
from .record import STEP_LAYER, STEP_SCALARS, TraceRecord, TurnRecord

FORMAT = "kvinspect-trace"
VERSION = 1
TRACE_NAME = "trace.jsonl"

_DTYPES = {**STEP_SCALARS, **STEP_LAYER}
#: Series stored as deltas between consecutive steps (monotone-ish, so they compress to nothing).
#: Integers only: a float delta does not always sum back to the same bits, and a trace must
#: read back exactly what was recorded (``t`` costs ~6 bytes a step raw, well within budget).
_DELTA = {"seen", "stored", "nbytes", "rss", "accel_allocated", "accel_reserved", "turn", "cache_id"}


def encode_array(a: np.ndarray, delta: bool) -> dict:
    dt = np.dtype(a.dtype).newbyteorder("<")
    arr = np.ascontiguousarray(a, dtype=dt)
    if delta and len(arr):
        if arr.dtype.kind == "f":
            arr = np.diff(arr, axis=0, prepend=np.zeros((1,) + arr.shape[1:], arr.dtype))
        else:
            arr = np.diff(arr.astype(np.int64), axis=0, prepend=0).astype(dt)
    raw = zlib.compress(arr.tobytes(), 6)
    return {
        "dtype": dt.str,
        "shape": list(a.shape),
        "delta": bool(delta),
        "data": base64.b64encode(raw).decode("ascii"),
    }


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


def trace_path(where: str | os.PathLike) -> Path:
    """Accept a trace file or the directory that holds one."""
    p = Path(where)
    if p.is_dir():
        return p / TRACE_NAME
    return p


class TraceWriter:
    """Appends a :class:`TraceRecord` to disk as it grows.

    ``flush_steps`` writes the steps recorded since the last call (a chunk); call it often
    (the session does so every few hundred milliseconds) so live viewers and crash recovery
    see the turn in progress. Turn and event lines go out as they happen.
    """

    def __init__(self, path: str | os.PathLike, record: TraceRecord):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.record = record
        self._f: IO[str] = self.path.open("w", encoding="utf-8")
        self._written_steps = 0
        self._written_devices: list[str] = []
        self._write({"type": "header", "format": FORMAT, "version": VERSION, **record.header,
                     "n_layers": record.n_layers})

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":"), default=_json_default) + "\n")

    def flush_steps(self, sync: bool = False) -> None:
        rec = self.record
        with rec.lock:
            n = rec.n_steps
            if rec.devices != self._written_devices:
                self._write({"type": "devices", "devices": list(rec.devices)})
                self._written_devices = list(rec.devices)
            if n > self._written_steps:
                s0 = self._written_steps
                cols = {name: encode_array(rec.col(name)[s0:n], name in _DELTA) for name in _DTYPES}
                # Deltas restart at each chunk: a chunk stands alone, so a lost one costs only itself.
                self._write({"type": "steps", "first": s0, "n": n - s0, "cols": cols})
                self._written_steps = n
        self._f.flush()
        if sync:
            os.fsync(self._f.fileno())

    def turn_started(self, turn: TurnRecord) -> None:
        self.flush_steps()
        self._write({"type": "turn_start", "index": turn.index, "user": turn.user, "policy": turn.policy,
                     "cache_impl": turn.cache_impl, "first_step": turn.first_step, "settings": turn.settings})
        self._f.flush()

    def turn_finished(self, turn: TurnRecord) -> None:
        self.flush_steps()
        self._write({"type": "turn", **turn.to_dict()})
        self.flush_steps(sync=True)

    def event(self, event: Event) -> None:
        self._write({"type": "event", **event.to_dict()})
        self._f.flush()

    def note(self, key: str, value) -> None:
        """Free-form session facts (e.g. the model finished loading) for viewers."""
        self._write({"type": "note", "key": key, "value": value})
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self.flush_steps()
            self._write({"type": "end", "steps": self.record.n_steps, "turns": len(self.record.turns)})
            self._f.flush()
            self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


class TraceReader:
    """Reads a trace, tolerating damage; :meth:`poll` picks up lines appended since (follow mode)."""

    def __init__(self, path: str | os.PathLike):
        self.path = trace_path(path)
        if Path(path).is_dir() and not self.path.exists():
            raise TraceError(_no_trace_in_folder(Path(path)))
        if not self.path.exists():
            raise TraceError(f"no trace at {path} (expected a {TRACE_NAME} file or a folder holding one)")
        if self.path.is_dir():
            raise TraceError(f"{path} is a folder without {TRACE_NAME}")
        self.record: TraceRecord | None = None
        self._pos = 0
        self._lineno = 0
        self._pending = b""
        self.ended = False
        self.bad_lines: list[int] = []
        self.problems: list[str] = []

    def read(self) -> TraceRecord:
        """Read the whole file as final: a partial last line, open turns and gaps become notes."""
        self.poll()
        tail, self._pending = self._pending, b""
        if tail.strip():
            self._lineno += 1
            if _is_json_object(tail):
                self._line(tail)  # complete but for its newline (a hand-edited file)
            elif self.record is None:
                raise TraceError(f"{self.path.name} ends inside its header line: the file was cut before any "
                                 f"data was written, nothing to open")
            else:
                self.problems.append(f"line {self._lineno} is cut short: the file ends mid-write")
        if self.record is None:
            raise TraceError(f"{self.path.name}: empty file, not a kvinspect trace")
        self._close_open_turns()
        if not self.ended:
            self.problems.append("no end line: the session did not close cleanly (killed, crashed or still "
                                 "running); every turn with a closing line is complete")
        self._finish()
        return self.record

    def _close_open_turns(self) -> None:
        """Turns whose closing ``turn`` line never came: the last one was interrupted, earlier ones lost it."""
        rec = self.record
        for i, turn in enumerate(rec.turns):
            if turn.status != "running":
                continue
            last = i == len(rec.turns) - 1
            end = rec.n_steps if last else max(rec.turns[i + 1].first_step, turn.first_step)
            forwards = max(end - turn.first_step, 0)
            turn.end_step = end
            if forwards:
                turn.prefill_tokens = int(rec.q_len[turn.first_step])
                turn.new_tokens = forwards  # one token per forward pass; a lower bound if steps were lost
            if last:
                turn.status = "interrupted"
                turn.error = "interrupted: the file ends inside this turn"
                self.problems.append(
                    f"turn {turn.index + 1} was interrupted (the file ends inside it): {forwards} of its forward "
                    f"passes are kept; its reply, events, checklist and end-of-turn cache snapshot were never written"
                )
            else:
                turn.status = "incomplete"
                turn.error = "incomplete: its closing line is missing or damaged"
                self.problems.append(
                    f"turn {turn.index + 1} is incomplete (its closing line is missing or damaged): {forwards} "
                    f"forward passes are kept; its reply, checklist and end-of-turn snapshot are lost"
                )

    def poll(self) -> bool:
        """Read newly appended complete lines; True when something changed."""
        with self.path.open("rb") as f:
            if self._pos == 0:
                self._sniff(f.read(64))
                f.seek(0)
            f.seek(self._pos)
            data = f.read()
        if not data:
            return False
        self._pos += len(data)
        buf = self._pending + data
        lines = buf.split(b"\n")
        self._pending = lines.pop()  # partial last line (no newline yet)
        changed = False
        for raw in lines:
            self._lineno += 1
            if not raw.strip():
                continue
            changed |= self._line(raw)
        if self.record is not None:
            self._finish()
        return changed

    def _sniff(self, head: bytes) -> None:
        """Refuse a file that cannot be a trace before reading all of it (a model file, an image)."""
        head = head.removeprefix(b"\xef\xbb\xbf").lstrip()
        if head and not head.startswith(b"{"):
            raise TraceError(f"{self.path.name} is not a kvinspect trace (it does not start with a JSON header line)")

    def _line(self, raw: bytes) -> bool:
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError):
            if self.record is None:
                hint = "; pass trace.jsonl, not summary.json" if self.path.name == "summary.json" else ""
                raise TraceError(f"{self.path.name} is not a kvinspect trace (line {self._lineno} is not a JSON "
                                 f"header){hint}") from None
            self.bad_lines.append(self._lineno)
            m = re.match(rb'\{"type":"(\w+)"', raw)
            what = f" ({m.group(1).decode()})" if m else ""
            self.problems.append(f"line {self._lineno}{what} is damaged: not valid JSON, skipped")
            return False
        kind = obj.get("type")
        if self.record is None:
            if kind != "header" or obj.get("format") != FORMAT:
                raise TraceError(f"{self.path.name} is not a kvinspect trace (no '{FORMAT}' header)")
            version = obj.get("version")
            if not isinstance(version, int):
                raise TraceError(f"{self.path.name}: header has no format version")
            if version > VERSION:
                raise TraceError(
                    f"{self.path.name} is trace format version {version}; this kvinspect reads up to version "
                    f"{VERSION}: upgrade kvinspect to open it"
                )
            if version < 1:
                raise TraceError(f"{self.path.name}: trace format version {version} is not supported (oldest is 1)")
            header = {k: v for k, v in obj.items() if k not in ("type",)}
            self.record = TraceRecord(int(obj.get("n_layers", 0)), header)
            return True
        rec = self.record
        try:
            if kind == "steps":
                first = int(obj["first"])
                if first != rec.n_steps:
                    self.problems.append(f"line {self._lineno}: steps {rec.n_steps}–{first - 1} are missing")
                    if first < rec.n_steps:
                        return False
                    # Pad the gap so step numbers stay true; -1 lengths and NaN times mean "not recorded".
                    gap = first - rec.n_steps
                    L = rec.n_layers
                    rec.append_columns({
                        "turn": np.full(gap, rec.turn[-1] if rec.n_steps else 0, np.int32),
                        "t": np.full(gap, np.nan),
                        "seen": np.full((gap, L), -1, np.int32),
                        "stored": np.full((gap, L), -1, np.int32),
                    })
                cols = {name: decode_array(spec) for name, spec in obj["cols"].items() if name in _DTYPES}
                n = int(obj["n"])
                if any(len(v) != n for v in cols.values()):
                    raise ValueError("column lengths differ")
                rec.append_columns(cols)
            elif kind == "devices":
                rec.set_devices([str(d) for d in obj["devices"]])
            elif kind == "turn_start":
                idx = int(obj["index"])
                self._fill_lost_turns(idx)
                if idx >= len(rec.turns):
                    rec.add_turn(TurnRecord(index=idx, user=obj.get("user", ""), policy=obj.get("policy", ""),
                                            cache_impl=obj.get("cache_impl", ""), status="running",
                                            first_step=int(obj.get("first_step", 0)),
                                            settings=obj.get("settings") or {}))
            elif kind == "turn":
                data = {k: v for k, v in obj.items() if k != "type"}
                turn = TurnRecord.from_dict(data)
                self._fill_lost_turns(turn.index)
                rec.add_turn(turn)
            elif kind == "event":
                rec.add_event(Event.from_dict({k: v for k, v in obj.items() if k != "type"}))
            elif kind == "note":
                rec.header.setdefault("notes", {})[str(obj.get("key"))] = obj.get("value")
                rec.version += 1
            elif kind == "end":
                self.ended = True
            # unknown kinds: written by a newer minor writer; ignored on purpose
        except (KeyError, ValueError, TypeError, zlib.error, base64.binascii.Error) as exc:
            self.bad_lines.append(self._lineno)
            self.problems.append(f"line {self._lineno} ({kind}) is damaged: {exc}")
            return False
        return True

    def _fill_lost_turns(self, idx: int) -> None:
        """Both lines of a turn were damaged: keep turn numbers true with a placeholder."""
        rec = self.record
        while len(rec.turns) < idx:
            k = len(rec.turns)
            rec.add_turn(TurnRecord(index=k, status="incomplete", error="lost: both of its lines are damaged",
                                    first_step=rec.n_steps))
            self.problems.append(f"turn {k + 1} is lost: both its start and closing lines are damaged")

    def _finish(self) -> None:
        rec = self.record
        notes = list(self.problems)
        if self.bad_lines:
            notes.append(f"{len(self.bad_lines)} damaged line(s) skipped: {', '.join(map(str, self.bad_lines[:10]))}")
        rec.notes = notes


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError):
        return False


def _no_trace_in_folder(folder: Path) -> str:
    others = sorted(p.name for p in folder.glob("*.jsonl"))
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return f"{folder} has no {TRACE_NAME}; it holds {shown}: pass one of those files"
    return f"{folder} has no {TRACE_NAME} (pass a trace file, or the folder `kvinspect run --out` wrote)"


def read_trace(path: str | os.PathLike) -> TraceRecord:
    """Read a trace file (or a folder holding ``trace.jsonl``). Raises TraceError with one line."""
    try:
        return TraceReader(path).read()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None


def write_trace(path: str | os.PathLike, record: TraceRecord) -> Path:
    """Write a whole record at once (export, conversions)."""
    w = TraceWriter(path, record)
    for turn in record.turns:
        w._write({"type": "turn_start", "index": turn.index, "user": turn.user, "policy": turn.policy,
                  "cache_impl": turn.cache_impl, "first_step": turn.first_step, "settings": turn.settings})
    w.flush_steps()
    for turn in record.turns:
        if turn.status != "running":
            w._write({"type": "turn", **turn.to_dict()})
    for ev in record.events:
        w.event(ev)
    w.close()
    return w.path
