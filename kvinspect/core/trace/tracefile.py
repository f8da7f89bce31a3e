"""The trace file: JSON Lines, append-only, versioned, no pickle. See docs/trace-format.md.

Every line is one complete JSON object, so a file cut short by a crash or ``kill -9``
loses at most its last, partial line; the reader recovers every complete line and says
what it could not read. Per-step per-layer series travel as delta-encoded, zlib-compressed
little-endian arrays in base64, which keeps 100k steps × 64 layers within a few MB.
"""

from __future__ import annotations

import binascii
import json
import os
import re
import zlib
from pathlib import Path
from typing import IO

from kvinspect.core.errors import TraceError
from kvinspect.core.trace.messages import (
    FORMAT,
    TRACE_KINDS,
    VERSION,
    End,
    Header,
    Message,
    MessageError,
    Turn,
    decode_array,
    dumps,
    encode_array,
)
from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.trace.stream import RecordBuilder, record_messages
from kvinspect.core.trace.validate import header_data, message

__all__ = ["FORMAT", "TRACE_NAME", "VERSION", "TraceReader", "TraceWriter", "decode_array", "encode_array",
           "read_trace", "trace_path", "write_trace"]

TRACE_NAME = "trace.jsonl"
#: Turns named one by one in the reader's notes; beyond, a count.
MAX_TURN_NOTES = 10


def trace_path(where: str | os.PathLike) -> Path:
    """Accept a trace file or the directory that holds one."""
    p = Path(where)
    if p.is_dir():
        return p / TRACE_NAME
    return p


class TraceWriter:
    """A stream sink that appends the trace kinds of messages to a file, one JSON line each.

    Every line is flushed as it is written, so live viewers and crash recovery see the turn in
    progress; a ``turn`` line is also fsynced, so a ``kill -9`` loses at most the running turn.
    """

    def __init__(self, path: str | os.PathLike, sync_turns: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = self.path.open("w", encoding="utf-8")
        self.sync_turns = sync_turns

    def __call__(self, msg: Message) -> None:
        if msg.kind not in TRACE_KINDS or self._f.closed:
            return
        self.write_line(dumps(msg))
        if isinstance(msg, Turn) and self.sync_turns:
            os.fsync(self._f.fileno())
        elif isinstance(msg, End):
            self._f.close()

    def write_line(self, line: str) -> None:
        """Append one line as it is (the window copies an engine's lines verbatim)."""
        self._f.write(line + "\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed


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
        check_regular(self.path)
        self.builder = RecordBuilder()
        self._pos = 0
        self._lineno = 0
        self._pending = b""
        self._read_to = 0  # bytes up to the end of the line being decoded: bounds what it may claim
        self.bad_lines: list[int] = []
        self.problems = self.builder.problems

    @property
    def record(self) -> TraceRecord | None:
        return self.builder.record

    @property
    def ended(self) -> bool:
        return self.builder.ended

    def read(self) -> TraceRecord:
        """Read the whole file as final: a partial last line, open turns and gaps become notes."""
        self.poll()
        tail, self._pending = self._pending, b""
        if tail.strip():
            self._lineno += 1
            self._read_to = self._pos
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
        assert rec is not None
        incomplete: list[tuple[int, int]] = []
        for i, turn in enumerate(rec.turns):
            if turn.status != "running":
                continue
            last = i == len(rec.turns) - 1
            end = rec.n_steps if last else max(rec.turns[i + 1].first_step, turn.first_step)
            forwards = max(end - turn.first_step, 0)
            turn.end_step = end
            if forwards and turn.first_step < rec.n_steps:
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
                incomplete.append((turn.index, forwards))
        # One note per turn would bury the others (a file of 20,000 turn_start lines): a few, then a count.
        for index, forwards in incomplete[:MAX_TURN_NOTES]:
            self.problems.append(
                f"turn {index + 1} is incomplete (its closing line is missing or damaged): {forwards} "
                f"forward passes are kept; its reply, checklist and end-of-turn snapshot are lost"
            )
        if len(incomplete) > MAX_TURN_NOTES:
            self.problems.append(f"{len(incomplete) - MAX_TURN_NOTES:,} more turns are incomplete (their closing "
                                 f"lines are missing or damaged)")

    def poll(self) -> bool:
        """Read newly appended complete lines; True when something changed."""
        check_regular(self.path)
        with self.path.open("rb") as f:
            if self._pos == 0:
                self._sniff(f.read(64))
                f.seek(0)
            f.seek(self._pos)
            data = f.read()
        if not data:
            return False
        start = self._pos - len(self._pending)
        self._pos += len(data)
        buf = self._pending + data
        lines = buf.split(b"\n")
        self._pending = lines.pop()  # partial last line (no newline yet)
        changed = False
        for raw in lines:
            self._lineno += 1
            start += len(raw) + 1
            self._read_to = start
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
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested beyond reason
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
            self.builder.feed(Header(header_data(obj, self.path.name)))
            return True
        if not isinstance(kind, str):
            kind = "no type"
        try:
            msg = message(obj, n_layers=self.record.n_layers, line_bytes=len(raw), bytes_read=self._read_to,
                          lines_read=self._lineno)
            if msg is None or msg.kind not in TRACE_KINDS:
                return False  # written by a newer minor writer, or a live-only kind: ignored on purpose
            return self.builder.feed(msg, where=f"line {self._lineno}")
        except (MessageError, KeyError, ValueError, TypeError, zlib.error, binascii.Error) as exc:
            self.bad_lines.append(self._lineno)
            self.problems.append(f"line {self._lineno} ({kind[:40]}) is damaged: {exc}")
            return False

    def _finish(self) -> None:
        rec = self.record
        assert rec is not None
        notes = list(self.problems)
        if self.bad_lines:
            notes.append(f"{len(self.bad_lines)} damaged line(s) skipped: {', '.join(map(str, self.bad_lines[:10]))}")
        rec.notes = notes


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False


def check_regular(path: Path) -> None:
    """Refuse a FIFO, a device or a socket: reading one blocks forever or never ends."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return  # the caller says what is missing
    if not stat.S_ISREG(mode):
        raise TraceError(f"{path} is not a regular file (a pipe, device or socket); pass a trace file")


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
    """Write a whole record at once (export, conversions): one fsync at the end, not one per turn
    (20,000 turns cost 80 s of fsyncs)."""
    w = TraceWriter(path, sync_turns=False)
    for msg in record_messages(record):
        if isinstance(msg, End) and not w.closed:
            w._f.flush()
            os.fsync(w._f.fileno())
        w(msg)
    w.close()
    return w.path
