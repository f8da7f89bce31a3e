"""Observe one model the user already holds: per-step series, turns, token checks, a live trace.

:class:`ModelObserver` adds two hooks to the model and nothing else: a forward pre-hook that
decides which turn a forward belongs to (see :mod:`.observe_turns`), and the
:class:`~.observer.StepObserver` forward hook that records per-layer lengths, memory and
the input ids. At the end of a turn it replays the ids through the :class:`TokenBook`, runs
the detectors and appends the turn to the record and the trace file. Nothing here ever
raises into the user's code: an internal error stops the observation and is reported.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass

from . import compat
from .detectors import TurnContext, turn_checklist
from .events import CACHE_RECREATED, TURN_FAILED, Event
from .memory import MemorySampler
from .observe_detect import UNKNOWN, Fed, TokenBook, continues, detect_observed, impl_of, seen_before
from .observe_ids import own_ids, rows as rows_of
from .observe_header import device_label, observed_header
from .observe_turns import (
    OpenTurn, find_tokenizer, forward_codes, frame_running, generate_codes, generate_result_ids,
    generate_settings, manual_boundary, outermost_frame, user_location,
)
from .observer import StepObserver, StepSample
from .probe import CacheProbe
from .record import TraceRecord, TurnRecord
from .tracefile import TraceWriter

log = logging.getLogger(__name__)


class _GuardedStepObserver(StepObserver):
    """The step observer, with its hook fenced off: an error stops observing, never the user's forward."""

    def __init__(self, *args, on_error, **kwargs):
        super().__init__(*args, **kwargs)
        self._on_error = on_error

    def attach(self) -> _GuardedStepObserver:
        if self._handle is None:
            self._handle = self.model.register_forward_hook(self._safe_hook, with_kwargs=True)
        return self

    def _safe_hook(self, module, args, kwargs, output):
        try:
            self._hook(module, args, kwargs, output)
        except Exception as exc:  # noqa: BLE001 - never break the observed program
            self._on_error(exc)
        return None


@dataclass
class _PrevTurn:
    cache_id: int
    held: list[int]
    prompt_len: int


class ModelObserver:
    """Records every forward pass of ``model`` into a :class:`TraceRecord` (and a trace file)."""

    def __init__(self, model, *, tokenizer=None, trace_path=None, mode: str = "api",
                 command: list[str] | None = None, flush_every_s: float = 0.5,
                 on_event=None, on_turn=None):
        self.model = model
        self.tokenizer = tokenizer
        self.lock = threading.RLock()
        self.probe = CacheProbe(model.config)
        device = device_label(model)
        self.memory = MemorySampler(device)
        self.record = TraceRecord(self.probe.n_layers, observed_header(model, device, self.memory, mode, command))
        self.writer = TraceWriter(trace_path, self.record) if trace_path else None
        self.steps = _GuardedStepObserver(model, self.probe, self._on_sample, self.memory, keep_input_ids=True,
                                          on_error=self._fail)
        self.book = TokenBook()
        self.on_event = on_event
        self.on_turn = on_turn
        self.turn: OpenTurn | None = None
        self.errors: list[str] = []
        self.enabled = True
        self.finished = False
        self._gen_codes = generate_codes(type(model))
        self.forward_codes = forward_codes(type(model))
        self._pending_label: str | None = None
        self._prev: _PrevTurn | None = None
        self._pre_handle = None
        self._flush_every = flush_every_s
        self._last_flush = time.perf_counter()
        self.time_in_pre_hook = 0.0
        self._tokenizer_searches = 0

    # -- hooks ------------------------------------------------------------------------------------
    def attach(self, pre_hook: bool = True) -> ModelObserver:
        """Add the hooks. ``pre_hook=False``: the caller calls :meth:`before_forward` itself."""
        if pre_hook and self._pre_handle is None:
            self._pre_handle = self.model.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        self.steps.attach()
        return self

    def detach(self) -> None:
        if self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None
        self.steps.detach()

    def _pre_hook(self, module, args, kwargs):
        self.before_forward(args, kwargs)
        return None

    def _fail(self, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        self.errors.append(msg)
        self.enabled = False
        self.steps.enabled = False
        log.warning("kvinspect stopped observing %s after an internal error: %s", type(self.model).__name__, msg)
        log.debug("observer error", exc_info=exc)

    def before_forward(self, args, kwargs) -> None:
        """Turn bookkeeping before a forward pass runs; never raises."""
        if not self.enabled:
            return
        t0 = time.perf_counter()
        try:
            self._before_forward(args, kwargs, t0)
        except Exception as exc:  # noqa: BLE001 - never break the observed program
            self._fail(exc)
        self.time_in_pre_hook += time.perf_counter() - t0

    def _before_forward(self, args, kwargs, t0: float) -> None:
        frame = outermost_frame(self._gen_codes, depth=3)
        with self.lock:
            cur = self.turn
            label, self._pending_label = self._pending_label, None
            if frame is not None:
                if label is None and cur is not None and cur.gen_frame is frame:
                    return
                self._close_locked()
                self._open_locked("generate", t0, frame, label)
                return
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            if label is None:
                q = kwargs.get("input_ids")
                if q is None:
                    q = args[0] if args else kwargs.get("inputs_embeds")
                q_len = int(q.shape[1]) if q is not None and hasattr(q, "dim") and q.dim() >= 2 else 0
                cache_id = self.probe.known_id(cache) if cache is not None else 0
                if not manual_boundary(cur, cache_id, cache is not None, q_len):
                    cur.last_passed = cache is not None
                    return
            self._close_locked()
            self._open_locked("forward", t0, None, label).last_passed = cache is not None

    def _on_sample(self, s: StepSample) -> None:
        with self.lock:
            if not self.enabled:
                return
            turn = self.turn
            if turn is None:  # a forward whose pre-hook we did not see (attached mid-call)
                turn = self._open_locked("forward", s.t, None, None)
            self.record.set_devices(self.probe.devices)
            self.record.append_step(
                turn=turn.record.index, t=s.t, cache_id=s.cache_id, q_len=s.q_len, use_cache=s.use_cache,
                seen=s.seen, stored=s.stored, dev=s.dev, nbytes=s.nbytes,
                rss=s.rss, accel_allocated=s.accel_allocated, accel_reserved=s.accel_reserved,
            )
            if s.cache is not None:
                turn.cache = s.cache
            s.cache = None
            s.input_ids = own_ids(s.input_ids)
            turn.samples.append(s)
            if turn.t_first is None:
                turn.t_first = s.t
            turn.t_last = s.t
            if self.writer is not None and s.t - self._last_flush >= self._flush_every:
                self.writer.flush_steps()
                self._last_flush = s.t

    # -- turns ------------------------------------------------------------------------------------
    def mark(self, label: str) -> None:
        """Close the current turn; the next forward opens one called ``label`` that the user's loop owns."""
        with self.lock:
            self._close_locked()
            self._pending_label = str(label)

    def _open_locked(self, kind: str, t0: float, frame, label: str | None) -> OpenTurn:
        index = len(self.record.turns)
        caller = frame.f_back if frame is not None else sys._getframe(1)
        where = user_location(caller)
        if self.tokenizer is None and self._tokenizer_searches < 3:
            # None was given: look for the one the user's code holds (to quote texts in messages).
            self._tokenizer_searches += 1
            vocab = getattr(compat.text_config(self.model.config), "vocab_size", None)
            self.tokenizer = find_tokenizer(caller, vocab)
        full_ids, settings = generate_settings(frame) if frame is not None else (None, {})
        marked = label is not None
        if label is None:
            label = f"generate() at {where}" if kind == "generate" else f"model() at {where}"
        settings = {**settings, "where": where}
        tr = TurnRecord(index=index, user=label, policy="observed", cache_impl="",
                        first_step=self.record.n_steps, settings=settings)
        turn = OpenTurn(record=tr, kind=kind, marked=marked, thread_id=threading.get_ident(), t_start=t0,
                        gen_frame=frame, full_ids=own_ids(full_ids))
        self.turn = turn
        self.record.add_turn(tr)
        if self.writer is not None:
            self.writer.turn_started(tr)
        return turn

    def settle(self) -> None:
        """Close a ``generate()`` turn whose call has returned (from any thread)."""
        with self.lock:
            t = self.turn
            if (t is not None and t.kind == "generate" and t.gen_frame is not None
                    and not frame_running(t.gen_frame, t.thread_id)):
                self._close_locked()

    def tick(self) -> None:
        """Called by the live ticker: close finished generate() turns, flush steps for followers."""
        if not self.lock.acquire(blocking=False):
            return  # the observed thread is in a hook right now; next tick
        try:
            if not self.enabled:
                return
            self.settle()
            if self.writer is not None and not self.writer.closed:
                self.writer.flush_steps()
                self._last_flush = time.perf_counter()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            self.lock.release()

    def _close_locked(self, status: str = "ok", error: str = "") -> None:
        turn = self.turn
        if turn is None:
            return
        self.turn = None
        try:
            self._finish_turn(turn, status, error)
        finally:
            turn.gen_frame = None
            turn.full_ids = None
            turn.cache = None
            turn.samples = []

    def _finish_turn(self, turn: OpenTurn, status: str, error: str) -> None:
        rec = turn.record
        samples = turn.samples
        result = None
        if (turn.kind == "generate" and status == "ok" and turn.gen_frame is not None
                and not frame_running(turn.gen_frame, turn.thread_id)):
            result = generate_result_ids(turn.gen_frame)
        rows = rows_of([s.input_ids for s in samples] + [turn.full_ids, result])
        full_prompt, result_row = rows[-2], rows[-1]
        generated = None
        if full_prompt is not None and result_row is not None and result_row[:len(full_prompt)] == full_prompt:
            generated = result_row[len(full_prompt):]
        fed = [Fed(step=rec.first_step + i, cache_id=s.cache_id, q_len=s.q_len, use_cache=s.use_cache,
                   before=seen_before(s), ids=rows[i]) for i, s in enumerate(samples)]
        tt = self.book.analyse(fed, full_prompt, generated)
        snap = self.probe.snapshot(turn.cache) if turn.cache is not None else None
        cache_ids = [s.cache_id for s in samples if s.cache_id]
        prev = self._prev
        cont = bool(cache_ids) and prev is not None and continues(tt.prompt, prev.held, prev.prompt_len)
        decode = self._decoder()
        ctx = TurnContext(turn_index=rec.index, policy="observed", cache_impl=impl_of(snap),
                          cached_before=tt.held_before, prompt=tt.prompt,
                          prev_cache_id=prev.cache_id if cont else None,
                          cached_ids_before=list(prev.held) if cont else [])
        ctx.reused = tt.reused
        if tt.cropped_from is not None and tt.cropped_to:
            ctx.cropped_from, ctx.cropped_to = tt.cropped_from, tt.cropped_to
        ctx.samples = samples
        ctx.snapshot = snap
        ctx.new_ids = tt.new_ids
        ctx.model_layers = self.record.header.get("layers", [])
        ctx.n_layers = self.probe.n_layers
        ctx.first_step = rec.first_step
        ctx.status = status
        ctx.error = error
        ctx.decode = decode
        ctx.max_positions = compat.max_positions(self.model.config)
        events = detect_observed(ctx, self.record, tt, decode)
        if turn.marked:
            # The user grouped these forwards: several cache objects in one marked turn are theirs to have.
            events = [e for e in events if not (e.kind == CACHE_RECREATED and "cache_ids" in e.data)]
        if status in ("failed", "interrupted"):
            events.append(Event(TURN_FAILED, "error", rec.index, rec.first_step,
                                error or f"the turn ended {status}",
                                "The trace keeps every forward pass made before the failure."))

        rec.status, rec.error = status, error
        rec.cache_impl = ctx.cache_impl
        rec.prompt_tokens = len(tt.prompt)
        rec.reused_tokens = tt.reused
        rec.prefill_tokens = samples[0].q_len if samples else 0
        rec.new_tokens = len(tt.new_ids)
        reply = [t for t in tt.new_ids if t != UNKNOWN]
        rec.reply = decode(reply) if decode is not None and reply else ""
        rec.end_step = self.record.n_steps
        if turn.t_first is not None:
            rec.ttft_s = turn.t_first - turn.t_start
            rec.total_s = (turn.t_last or turn.t_first) - turn.t_start
            decode_s = rec.total_s - rec.ttft_s
            if rec.new_tokens > 1 and decode_s > 0:
                rec.tokens_per_s = (rec.new_tokens - 1) / decode_s
        rec.peak_rss = max((s.rss for s in samples), default=0)
        rec.peak_accel_bytes = max((s.accel_allocated for s in samples), default=0)
        rec.cache_id = cache_ids[-1] if cache_ids else 0
        rec.cache_class = snap.cache_class if snap is not None else "None"
        if snap is not None:
            rec.layers = [lay.to_dict() for lay in snap.layers]
            rec.kv_bytes = snap.bytes
            rec.kv_held_bytes = snap.held_bytes
            rec.kv_bytes_by_device = snap.bytes_by_device()
        rec.divergence_at = tt.divergence[2] if tt.divergence else None
        rec.cropped_from = tt.cropped_from
        rec.prompt_ids = tt.prompt
        for ev in events:
            self.record.add_event(ev)
            if self.writer is not None:
                self.writer.event(ev)
            if self.on_event is not None:
                self.on_event(ev)
        rec.checklist = turn_checklist(ctx, events)
        self.record.add_turn(rec)
        if self.writer is not None:
            self.writer.turn_finished(rec)
        if cache_ids:
            self._prev = _PrevTurn(cache_ids[-1], self.book.snapshot(cache_ids[-1]), len(tt.prompt))
        if self.on_turn is not None:
            self.on_turn(rec)

    def _decoder(self):
        tok = self.tokenizer
        if tok is None or not hasattr(tok, "decode"):
            return None

        def decode(ids):
            try:
                return tok.decode(ids, skip_special_tokens=False)
            except Exception:  # noqa: BLE001 - a foreign tokenizer may refuse odd ids
                return ""

        return decode

    # -- the end ----------------------------------------------------------------------------------
    def finish(self, status: str = "ok", error: str = "", notes: dict | None = None) -> None:
        """Close the open turn with ``status``, add ``notes`` and close the trace file. Idempotent."""
        with self.lock:
            if self.finished:
                return
            self.finished = True
            try:
                if self.enabled:
                    self._close_locked(status, error)
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
            self.enabled = False
            self.steps.enabled = False
            if self.writer is not None and not self.writer.closed:
                for key, value in (notes or {}).items():
                    self.writer.note(key, value)
                if self.errors:
                    self.writer.note("observer_errors", list(self.errors))
                self.writer.close()

    def turn_hit_by(self, tb) -> bool:
        """Whether traceback ``tb`` passes through the open turn's generate() or the model's forward."""
        t = self.turn
        while tb is not None:
            f = tb.tb_frame
            if (t is not None and f is t.gen_frame) or f.f_code in self.forward_codes:
                return True
            tb = tb.tb_next
        return False
