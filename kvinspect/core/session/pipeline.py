"""The turn pipeline: one object owns a turn from its first forward to its ``turn`` line.

Both loops feed it: :class:`~.chat.ChatSession` (kvinspect's own chat loop) and
:class:`~kvinspect.core.observe.model_observer.ModelObserver` (the user's loop). Each says when a
turn begins, hands over every forward's :class:`~kvinspect.core.cache.observer.StepSample`, and at
the end what only it knows (the prompt it rendered or recovered, the tokens generated, the cache
object, an exception). The pipeline does the rest once: step rows, timing, the end-of-turn
snapshot's fields, the detectors, ``turn_failed``, the checklist, and the messages of the
:class:`~kvinspect.core.trace.stream.Stream` (record, trace file, engine pipe, callbacks).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.observer import StepSample, block
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.detect.detectors import TurnContext, turn_checklist
from kvinspect.core.detect.events import TURN_FAILED, Event
from kvinspect.core.detect.media import add_held, failure_reason, media_events, rope_events, turn_media
from kvinspect.core.errors import first_line
from kvinspect.core.media.watch import MediaWatch
from kvinspect.core.tokens.ids import pack_ids
from kvinspect.core.trace.messages import EventMsg, Message, Note, Token, Turn
from kvinspect.core.trace.record import TraceRecord, TurnRecord
from kvinspect.core.trace.stream import Sink, Stream

Detector = Callable[[TurnContext, TraceRecord], list[Event]]
#: Forwards kept before they go to the record as one block (the flush interval usually comes first).
PENDING_MAX = 128


def callback_sink(on_event: Callable[[Event], None] | None = None,
                  on_turn: Callable[[TurnRecord], None] | None = None,
                  on_token: Callable[[str], None] | None = None) -> Sink:
    """A sink that calls the given callbacks for events, finished turns and reply text."""

    def sink(msg: Message) -> None:
        if on_event is not None and isinstance(msg, EventMsg):
            on_event(msg.event)
        elif on_turn is not None and isinstance(msg, Turn):
            on_turn(msg.turn)
        elif on_token is not None and isinstance(msg, Token):
            on_token(msg.text)

    return sink


@dataclass(frozen=True)
class Failure:
    """What a turn failed with: an exception's type name and first line (the exception itself is not
    kept: its traceback would hold the user's frames and tensors alive)."""

    type_name: str
    line: str

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        return cls(type(exc).__name__, first_line(exc))

    def __str__(self) -> str:
        return f"{self.type_name}: {self.line}" if self.line != self.type_name else self.type_name


def failure_text(failure: Failure, *, prompt_tokens: int, max_new_tokens: int | None,
                 snapshot: Any = None, held: int | None = None, forwards: int = 0) -> str:
    """One line for a failed turn: the exception's type and first line, with the cause when the numbers show it.

    ``held``: what the cache handed to the call already held (None: unknown). The same words for
    the same failure, whichever loop ran it.
    """
    text, name = failure.line, failure.type_name
    capacity = static_capacity(snapshot)
    if capacity is not None and max_new_tokens:
        need = prompt_tokens + max_new_tokens - 1
        if need > capacity:
            return (f"static cache overflow: this turn needs up to {need} cache rows but max_cache_len is "
                    f"{capacity} ({name}: {text[:120]})")
    if "cache_implementation" in text:
        return f"generation_config collision: {text[:200]}"
    if held is not None and held >= prompt_tokens and not forwards:
        # Failed before its first forward: generate() slices the cached length off the prompt and
        # nothing was left to feed (a cache that swallowed whole sequences, use_cache=False).
        return (f"the cache passed in already held {held} tokens, not fewer than this turn's {prompt_tokens}-token "
                f"prompt, so generate() had nothing left to feed ({name}: {text[:120]})")
    return str(failure)[:300 + len(name) + 2]


def static_capacity(snapshot: Any) -> int | None:
    """The largest fixed capacity among the snapshot's static layers (max_cache_len), None if none."""
    if snapshot is None:
        return None
    caps = [lay.capacity for lay in snapshot.layers if lay.storage == "static" and lay.capacity]
    return max(caps) if caps else None


def _the_librarys(events: list[Event]) -> None:
    """A draft model's turn is transformers' own call (the assistant's generate() inside the main model's):
    what the draft was fed and what holds its outputs is the library's doing, said so and never the program's."""
    import transformers

    for ev in events:
        if ev.kind == TURN_FAILED or ev.severity == "info":
            continue
        ev.severity = "info"
        ev.data["origin"] = "library"
        ev.message = f"transformers {transformers.__version__} drove the draft model so: {ev.message}"
        ev.advice = ("Nothing to change in the program: transformers' assisted decoding builds the draft model's "
                     "inputs and cache itself.")


class TurnPipeline:
    """Step rows, timing, snapshot fields, detectors, checklist and messages of one session's turns."""

    def __init__(self, record: TraceRecord, probe: CacheProbe, memory: MemorySampler,
                 sinks: Iterable[Sink] = (), *, flush_every_s: float = 0.5, max_positions: int | None = None,
                 owns_peak: bool = True, model: Any = None):
        self.record = record
        # A vision-language model's hooks: what its vision tower encoded, and the token types, per turn.
        self.media = MediaWatch.of(model) if model is not None else None
        # Per cache object: the images its rows hold, and the rope_deltas its last turn used (M-RoPE models).
        self._media_by_cache: dict[int, list[dict]] = {}
        self._rope_by_cache: dict[int, tuple] = {}
        self.probe = probe
        self.memory = memory
        self.stream = Stream(record, sinks)
        self.max_positions = max_positions
        # Resetting the CUDA peak counter each turn is kvinspect's own loop's to do: in an observed
        # program the counter is the user's, so there the peak is the highest sample instead.
        self.owns_peak = owns_peak
        self.turn: TurnRecord | None = None
        self.samples: list[StepSample] = []
        self._pending: list[StepSample] = []  # forwards not yet in the record (it takes them in blocks)
        self._prev_ids: tuple[int, list[int]] | None = None  # the last turn's prompt + generated ids
        self._known_pieces: set[int] = set()
        self.flush_every_s = flush_every_s
        self._flush_at = time.perf_counter() + flush_every_s

    # -- during a turn ------------------------------------------------------------------------------
    def begin(self, turn: TurnRecord) -> None:
        self.commit()
        self.turn = turn
        self.samples = []
        # What the hook reuses between forwards is read again for each turn: the program may have
        # moved the cache or allocated memory since the last one.
        self.probe.check_devices()
        self.memory.expire()
        # The turn's first block goes at its first forward (the prefill's end: the window shows the turn's
        # first token with it), the next one interval later.
        self._flush_at = -math.inf
        if self.owns_peak:
            self.memory.reset_peak()
        self.stream.turn_started(turn)

    def step(self, s: StepSample) -> None:
        """One forward of the open turn: kept now, in the record within ``PENDING_MAX`` forwards or the flush
        interval, whichever comes first, and to the other sinks at each flush. A forward outside a turn is not kept
        (ChatSession's observer is the hook's sink between its turns too)."""
        if self.turn is None:
            return
        s.cache = None  # samples never keep a cache alive
        self.samples.append(s)
        pending = self._pending
        pending.append(s)
        if s.t >= self._flush_at or len(pending) >= PENDING_MAX:
            self.flush()

    def commit(self) -> None:
        """Append the kept forwards to the record as one block (the hook's share of a row is a list append)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        turn = self.turn
        assert turn is not None, "steps outside a turn"
        self.probe.check_devices()
        self.stream.devices(self.probe.devices)
        t, cols, parts = block(pending)
        cols["turn"] = turn.index
        self.record.append_steps(t, cols, parts)

    def token(self, text: str) -> None:
        if self.turn is not None and text:
            self.stream.emit(Token(self.turn.index, text))

    def flush(self) -> None:
        self.commit()
        self.stream.flush_steps()
        self._flush_at = time.perf_counter() + self.flush_every_s

    # -- the end of a turn ----------------------------------------------------------------------------
    def finish(self, turn: TurnRecord, ctx: TurnContext, *, new_ids: list[int], snapshot: Any,
               t_start: float, t_first: float | None, t_end: float, detect: Detector,
               failure: Failure | None = None, held: int | None = None,
               extra_events: Callable[[TurnRecord], list[Event]] | None = None) -> list[Event]:
        """Close ``turn``: fill its numbers, run ``detect`` and the checklist, emit its events and its line.

        ``failure``: the turn failed (its status becomes ``failed`` and its error :func:`failure_text`). ``turn.status`` may already say ``stopped``, ``failed`` or
        ``interrupted`` (with ``turn.error``). ``extra_events(turn)`` adds the feeder's own events.
        """
        self.commit()
        samples = self.samples
        rec = self.record
        if failure is not None:
            turn.status = "failed"
            turn.error = failure_text(failure, prompt_tokens=len(ctx.prompt),
                                      max_new_tokens=turn.settings.get("max_new_tokens"),
                                      snapshot=snapshot, held=held, forwards=len(samples))
        elif turn.status == "running":
            turn.status = "ok"
        turn.new_tokens = len(new_ids)
        turn.total_s = t_end - t_start
        if t_first is not None:
            turn.ttft_s = t_first - t_start
            decode_s = t_end - t_first
            if turn.new_tokens > 1 and decode_s > 0:
                turn.tokens_per_s = (turn.new_tokens - 1) / decode_s
        turn.prompt_tokens = len(ctx.prompt)
        turn.reused_tokens = ctx.reused if turn.status != "failed" else 0
        turn.prefill_tokens = samples[0].q_len if samples else 0
        turn.end_step = rec.n_steps
        turn.peak_rss = max((s.rss for s in samples), default=0) or self.memory.rss_now()
        sampled = max((s.accel_allocated for s in samples), default=0)
        turn.peak_accel_bytes = max(self.memory.peak(), sampled) if self.owns_peak else sampled
        cache_ids = [s.cache_id for s in samples if s.cache_id]
        turn.cache_id = cache_ids[-1] if cache_ids else (snapshot.cache_id if snapshot is not None else 0)
        turn.cache_class = snapshot.cache_class if snapshot is not None else "None"
        if snapshot is not None:
            turn.layers = [lay.to_dict() for lay in snapshot.layers]
            turn.kv_bytes = snapshot.bytes
            turn.kv_held_bytes = snapshot.held_bytes
            turn.kv_bytes_by_device = snapshot.bytes_by_device()

        ctx.samples = samples
        ctx.snapshot = snapshot
        ctx.new_ids = new_ids
        ctx.model_layers = rec.header.get("layers", [])
        ctx.first_step = turn.first_step
        ctx.status = turn.status
        ctx.error = turn.error
        if ctx.max_positions is None:
            ctx.max_positions = self.max_positions
        if ctx.max_new_tokens is None and isinstance(turn.settings.get("max_new_tokens"), int):
            ctx.max_new_tokens = turn.settings["max_new_tokens"]
        if not ctx.pad_tokens and isinstance(turn.settings.get("pad_tokens"), list):
            ctx.pad_tokens = [int(n) for n in turn.settings["pad_tokens"]]
        if not ctx.config_sources and isinstance(turn.settings.get("config_sources"), dict):
            ctx.config_sources = turn.settings["config_sources"]
        events = detect(ctx, rec)
        if self.media is not None:
            events += self._media(turn, ctx)
        if extra_events is not None:
            events += extra_events(turn)
        if turn.status in ("failed", "interrupted"):
            events.append(Event(TURN_FAILED, "error", turn.index, turn.first_step,
                                turn.error or f"the turn ended {turn.status}",
                                "Fix the cause above; the trace keeps every earlier turn and every forward pass "
                                "made before the failure."))
        if ctx.role == "draft":
            _the_librarys(events)
        for ev in events:
            # Where the pattern comes from: the program's code, unless a feeder named it transformers' own.
            ev.data.setdefault("origin", "user_code")
            self.stream.emit(EventMsg(ev))
        turn.checklist = turn_checklist(ctx, events)
        turn.ids = pack_ids(ctx.prompt, new_ids, prev=self._prev_ids, known=self._known_pieces, decode=ctx.decode)
        self._prev_ids = (turn.index, [*ctx.prompt, *new_ids])
        self.stream.turn_finished(turn)
        self.turn = None
        self.samples = []
        return events

    def _media(self, turn: TurnRecord, ctx: TurnContext) -> list[Event]:
        """The turn's images (spans, hashes, rows held per layer) and the multimodal events."""
        assert self.media is not None
        fed = self.media.take()
        ctx.media_tokens = self.media.tokens
        ctx.media_fed = fed
        cid = turn.cache_id
        if ctx.reused and not ctx.media_before:
            ctx.media_before = self._media_by_cache.get(cid, [])
        if ctx.reused:
            ctx.rope_deltas_cached = self._rope_by_cache.get(cid)
        ctx.media = turn.media = turn_media(ctx, turn.index)
        add_held(turn.media, turn.layers)
        turn.vision_calls = fed.vision_calls
        reason = failure_reason(ctx)
        if reason is not None:
            turn.error = f"{reason} ({turn.error})"
            ctx.error = turn.error
        events = media_events(ctx) + rope_events(ctx)
        if turn.status != "failed" and cid:
            self._media_by_cache[cid] = turn.media
            if fed.rope_deltas is not None and not any(e.kind == "rope_deltas_stale" for e in events):
                self._rope_by_cache[cid] = fed.rope_deltas
            for d in (self._media_by_cache, self._rope_by_cache):
                while len(d) > 16:  # the caches a program still continues are its last few
                    d.pop(next(iter(d)))
        return events

    def note(self, key: str, value: Any) -> None:
        self.stream.emit(Note(key, value))

    def close(self) -> None:
        self.commit()
        if self.media is not None:
            self.media.detach()
        self.stream.close()
