"""The window's live trace: the engine's trace lines decoded into this window's record and autosaved.

One object owns the three, so a line is decoded once, applied once and written once: each trace
line the engine streams is decoded by the validating reader (:class:`~kvinspect.core.trace.validate.LineDecoder`),
applied to the record by the one record reader (:class:`~kvinspect.core.trace.stream.RecordBuilder`), and
appended verbatim to the autosave file (flushed on every line, fsync'ed on every ``turn`` line). What
the window itself adds (a failed turn after the engine died, a note, the closing ``end``) goes the same
way as a message (:meth:`LiveTrace.append`). Nothing here imports Qt or torch.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable

from kvinspect.core.trace.messages import End, Message, MessageError, Note, dumps
from kvinspect.core.trace.stream import RecordBuilder
from kvinspect.core.trace.validate import LineDecoder

log = logging.getLogger(__name__)


class LiveTrace:
    """The record and autosave of the engine's current session (a new one at each ``header`` line).

    ``on_paused(message)`` is called when the autosave stops (a full disk); the record goes on.
    """

    def __init__(self, autosave: bool = True, on_paused: Callable[[str], None] | None = None):
        self.autosave = autosave
        self.on_paused = on_paused
        self.path: str | None = None  # this session's autosave file
        self.paused: str | None = None  # why the autosave stopped, while it is
        self.problems: list[str] = []  # stream lines this side could not decode
        self._decoder = LineDecoder()
        self._builder: RecordBuilder | None = None
        self._file = None  # the autosave file (binary, append)

    @property
    def record(self):
        """This session's :class:`~kvinspect.core.trace.record.TraceRecord` (None before a header)."""
        return self._builder.record if self._builder is not None else None

    @property
    def ended(self) -> bool:
        """The session has its ``end`` (from the engine, or written here when it could not)."""
        return self._builder is not None and self._builder.ended

    def feed_line(self, kind: str, obj: dict, raw: bytes) -> Message | None:
        """Decode, apply and autosave one trace line from the engine; the message, or None when dropped."""
        try:
            msg = self._decoder.decode(obj, len(raw))
        except (MessageError, KeyError, ValueError, TypeError, zlib.error) as exc:
            self.problems.append(f"a {kind} line from the engine is damaged: {exc}")
            log.warning("%s", self.problems[-1])
            return None
        if msg is None:
            return None
        if kind == "header":
            self.close()
            self._builder = RecordBuilder()
            self._open(obj)
        if self._builder is None:
            return None
        try:
            self._builder.feed(msg)
        except ValueError as exc:
            log.warning("engine stream: %s", exc)
            return None
        self._write(raw, sync=kind == "turn")
        if kind == "end":
            self.close()
        return msg

    def append(self, msg: Message) -> None:
        """A message the window adds to its session: applied to the record and autosaved (fsync'ed)."""
        if self._builder is None or self._builder.record is None:
            return
        self._builder.feed(msg)
        self._write(dumps(msg).encode("utf-8"), sync=True)

    def close(self, note: tuple[str, object] | None = None) -> None:
        """Close the autosave; a session the engine never ended gets ``note`` and an ``end`` line from here."""
        rec = self.record
        if self._file is not None and rec is not None and not self.ended:
            if note is not None:
                self.append(Note(*note))
            self.append(End(rec.n_steps, len(rec.turns)))
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass

    def _open(self, header: dict) -> None:
        self.path = None
        if not self.autosave:
            return
        from kvinspect.core.trace.autosave import autosave_path

        model = header.get("model") or {}
        path = None
        try:  # the folder is made (and pruned) here too: a full disk fails at mkdir already
            path = autosave_path(str(model.get("name") or model.get("spec") or "model"))
            self._file = path.open("wb")
            self.path = str(path)
            self.paused = None
        except OSError as exc:
            self._file = None
            self._pause(f"autosave paused: cannot write {path or 'the autosave folder'}: {exc.strerror or exc}")

    def _pause(self, message: str) -> None:
        log.warning("%s", message)
        self.paused = message
        if self.on_paused is not None:
            self.on_paused(message)

    def _write(self, raw: bytes, sync: bool = False) -> None:
        f = self._file
        if f is None:
            return
        try:
            f.write(raw + b"\n")
            f.flush()
            if sync:
                os.fsync(f.fileno())
        except OSError as exc:
            self._file = None
            self._pause(f"autosave paused: {exc.strerror or exc}; the session goes on unsaved")
