"""One stream, many sinks: a session's messages reach the record, the trace file, a pipe, callbacks.

:class:`Stream` is what a turn pipeline writes to. Its first sink is always the in-memory
:class:`~.record.TraceRecord` (through a :class:`RecordBuilder`); the others are whatever the caller
gave: a :class:`~.tracefile.TraceWriter`, the engine's pipe writer, a callback. Step rows are the
one exception to "everything is a message": the pipeline appends each forward's row to the record
directly (the per-step path stays allocation free), and :meth:`Stream.flush_steps` sends the rows
added since the last flush to the other sinks as one :class:`~.messages.Steps` block.

:class:`RecordBuilder` is the single reader: it turns messages into a record, whether they come
from a trace file, a followed file or a live engine, and notes what it could not recover.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from kvinspect.core.trace.messages import (
    DTYPES,
    Devices,
    End,
    EventMsg,
    Header,
    Message,
    Note,
    Steps,
    Turn,
    TurnStart,
)
from kvinspect.core.trace.record import TraceRecord, TurnRecord

log = logging.getLogger(__name__)

Sink = Callable[[Message], None]


class RecordBuilder:
    """Applies messages to a :class:`TraceRecord`, tolerating gaps and lost lines.

    ``live=True``: the record is also appended to step by step by its owner (a running session),
    so step blocks that carry rows it already holds are expected and skipped.
    """

    def __init__(self, record: TraceRecord | None = None, *, live: bool = False):
        self.record = record
        self.live = live
        self.problems: list[str] = []
        self.ended = False

    def feed(self, msg: Message, where: str = "") -> bool:
        """Apply one message; True when the record changed. ``where`` prefixes problems ("line 12")."""
        rec = self.record
        if isinstance(msg, Header):
            if rec is None:
                self.record = TraceRecord(msg.n_layers, dict(msg.data))
                return True
            return False
        if rec is None:
            raise ValueError(f"a {msg.kind} message before the header")
        if isinstance(msg, Steps):
            return self._steps(rec, msg, where)
        if isinstance(msg, Devices):
            rec.set_devices(list(msg.devices))
        elif isinstance(msg, TurnStart):
            self._fill_lost_turns(msg.index)
            if msg.index < len(rec.turns):
                return False
            rec.add_turn(TurnRecord(index=msg.index, user=msg.user, policy=msg.policy, cache_impl=msg.cache_impl,
                                    status="running", first_step=msg.first_step, settings=dict(msg.settings),
                                    prompt_tokens=msg.prompt_tokens))
        elif isinstance(msg, Turn):
            self._fill_lost_turns(msg.turn.index)
            rec.add_turn(msg.turn)
        elif isinstance(msg, EventMsg):
            rec.add_event(msg.event)
        elif isinstance(msg, Note):
            with rec.lock:
                rec.header.setdefault("notes", {})[msg.key] = msg.value
                rec.version += 1
        elif isinstance(msg, End):
            self.ended = True
        else:
            return False  # live-only kinds (tokens, progress, errors) are not part of the record
        return True

    def _steps(self, rec: TraceRecord, msg: Steps, where: str) -> bool:
        first, n = msg.first, msg.n
        have = rec.n_steps
        if self.live and first + n <= have:
            return False
        if first != have:
            prefix = f"{where}: " if where else ""
            if first < have:
                self.problems.append(f"{prefix}steps {first}–{first + n - 1} overlap steps already read, skipped")
                return False
            self.problems.append(f"{prefix}steps {have}–{first - 1} are missing")
            # Pad the gap so step numbers stay true; -1 lengths and NaN times mean "not recorded".
            gap = first - have
            L = rec.n_layers
            rec.append_columns({
                "turn": np.full(gap, rec.turn[-1] if have else 0, np.int32),
                "t": np.full(gap, np.nan),
                "seen": np.full((gap, L), -1, np.int32),
                "stored": np.full((gap, L), -1, np.int32),
            })
        if n:
            rec.append_columns(dict(msg.cols))
        return True

    def _fill_lost_turns(self, idx: int) -> None:
        """Both lines of a turn were lost: keep turn numbers true with a placeholder."""
        rec = self.record
        assert rec is not None
        first = len(rec.turns)
        while len(rec.turns) < idx:
            k = len(rec.turns)
            rec.add_turn(TurnRecord(index=k, status="incomplete", error="lost: both of its lines are damaged",
                                    first_step=rec.n_steps))
        if idx - first == 1:
            self.problems.append(f"turn {first + 1} is lost: both its start and closing lines are damaged")
        elif idx - first > 1:  # one note for the run of them, however long
            self.problems.append(f"turns {first + 1}–{idx} are lost: both their start and closing lines are damaged")


class Stream:
    """Fans a session's messages out to the record and the sinks, in order."""

    def __init__(self, record: TraceRecord, sinks: Iterable[Sink] = ()):
        self.record = record
        self._builder = RecordBuilder(record, live=True)
        self.sinks: list[Sink] = list(sinks)
        self._sent_steps = 0
        self.closed = False
        self._emit_out(Header({**record.header, "n_layers": record.n_layers}))

    def emit(self, msg: Message) -> None:
        self._builder.feed(msg)
        self._emit_out(msg)

    def _emit_out(self, msg: Message) -> None:
        for sink in self.sinks:
            sink(msg)

    def devices(self, devices: list[str]) -> None:
        """Say which devices step rows' device codes index, when that changed."""
        if devices != self.record.devices:
            self.emit(Devices(tuple(devices)))

    def turn_started(self, turn: TurnRecord) -> None:
        self.flush_steps()
        self.emit(TurnStart(turn.index, turn.user, turn.policy, turn.cache_impl, turn.first_step, dict(turn.settings),
                            turn.prompt_tokens))

    def turn_finished(self, turn: TurnRecord) -> None:
        """Every step of the turn goes out before its ``turn`` line (a reader then has them all)."""
        self.flush_steps()
        self.emit(Turn(turn))

    def flush_steps(self) -> None:
        """Send the rows appended to the record since the last flush as one block."""
        rec = self.record
        with rec.lock:
            n = rec.n_steps
            s0 = self._sent_steps
            if n <= s0:
                return
            self._sent_steps = n
            if not self.sinks:
                return
            # Views, not copies: the record only appends, so rows below ``n`` never change (a buffer
            # that grows is replaced, and the old one stays as it was for whoever holds these).
            cols = {name: rec.col(name)[s0:n] for name in DTYPES}
        self._emit_out(Steps(s0, n - s0, cols))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.flush_steps()
        self._emit_out(End(self.record.n_steps, len(self.record.turns)))


def record_messages(record: TraceRecord) -> Iterator[Message]:
    """A whole record as the messages that would rebuild it (export, conversions)."""
    yield Header({**record.header, "n_layers": record.n_layers})
    for turn in record.turns:
        yield TurnStart(turn.index, turn.user, turn.policy, turn.cache_impl, turn.first_step, dict(turn.settings),
                        turn.prompt_tokens)
    if record.devices:
        yield Devices(tuple(record.devices))
    with record.lock:
        n = record.n_steps
        cols = {name: record.col(name)[:n].copy() for name in DTYPES}
    if n:
        yield Steps(0, n, cols)
    for turn in record.turns:
        if turn.status != "running":
            yield Turn(turn)
    for ev in record.events:
        yield EventMsg(ev)
    yield End(n, len(record.turns))
