"""Observe one model the user already holds: per-step series, turns, token checks, a live trace.

:class:`ModelObserver` adds two hooks to the model and nothing else: a forward pre-hook that
decides which turn a forward belongs to (see :mod:`.turns`), and the
:class:`~kvinspect.core.cache.observer.StepObserver` forward hook that records per-layer lengths,
memory and the input ids (and, called even when a forward raises, the failure). At the end of a
turn it replays the ids through the :class:`~kvinspect.core.detect.token_book.TokenBook` and
hands the turn to the :class:`~kvinspect.core.session.pipeline.TurnPipeline`, the same one
``kvinspect run`` uses. Nothing here ever raises into the user's code: an internal error stops
the observation and is reported.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, replace
from time import perf_counter

from kvinspect.core import compat
from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.observer import StepObserver, StepSample
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.detect.detectors import TurnContext
from kvinspect.core.detect.events import CACHE_RECREATED, DUPLICATE_CONTEXT, PREFIX_DIVERGENCE, Event
from kvinspect.core.detect.provenance import checkpoint_file, config_sources
from kvinspect.core.detect.retained import library_slots, retained_events
from kvinspect.core.detect.token_book import UNKNOWN, Fed, TokenBook, continues, detect_observed, impl_of, seen_before
from kvinspect.core.errors import exc_line
from kvinspect.core.observe.forward_ids import own_ids
from kvinspect.core.observe.forward_ids import rows as rows_of
from kvinspect.core.observe.header import device_label, observed_header
from kvinspect.core.observe.turns import (
    OpenTurn,
    drafting_for,
    drafts,
    find_tokenizer,
    forward_codes,
    frame_raised,
    frame_running,
    generate_codes,
    generate_result_ids,
    generate_settings,
    manual_boundary,
    outermost_frame,
    pause_exit_watch,
    sequences_of,
    unwatch_exit,
    user_location,
    watch_exit,
)
from kvinspect.core.observe.turns import armed as exit_armed
from kvinspect.core.session.pipeline import Failure, TurnPipeline, callback_sink
from kvinspect.core.trace.record import TraceRecord, TurnRecord
from kvinspect.core.trace.stream import Sink
from kvinspect.core.trace.tracefile import TraceWriter

log = logging.getLogger(__name__)


class _GuardedStepObserver(StepObserver):
    """The step observer, with its hook fenced off: an error stops observing, never the user's forward."""

    def __init__(self, *args, on_error, on_raise, **kwargs):
        super().__init__(*args, **kwargs)
        self._on_error = on_error
        self._on_raise = on_raise
        self._compiling = compat.compiling_test()

    def attach(self) -> _GuardedStepObserver:
        if self._handle is None:
            # always_call: torch runs the hook from its except block when the forward raises (output None).
            self._handle = self.model.register_forward_hook(self._safe_hook, with_kwargs=True, always_call=True)
        return self

    def _safe_hook(self, module, args, kwargs, output):
        if self._compiling():  # inside a compiled graph: the turn is read from outside it (docs/observe.md)
            return None
        try:
            if output is None:
                exc = sys.exc_info()[1]
                if exc is not None:
                    self._on_raise(exc, compat.cache_from_call(kwargs, None))
                    return None
            self._hook(module, args, kwargs, output)
        except Exception as exc:  # noqa: BLE001 - never break the observed program
            self._on_error(exc)
        return None


@dataclass
class _PrevTurn:
    cache_id: int
    held: list[int]
    prompt_len: int


def _library_refeed(dup: tuple[int, int, int, int], mode: str) -> str:
    import transformers

    step, cid, pos, count = dup
    how = "assisted decoding (assistant_model=)" if mode == "assisted" else "prompt-lookup decoding"
    return (f"transformers {transformers.__version__}: {how} does not slice the cached prefix off its first forward "
            f"(generation/utils.py, _assisted_decoding: next_sequence_length is None on the first iteration), so "
            f"it fed cache #{cid} the {count} tokens it already held again, at position {pos}")


_WORKAROUND = ("Your loop is right: give this call a new cache (or none) while transformers re-feeds the prefix; "
               "the prefill then costs the whole prompt but the reply is right. Plain greedy/sampled generate() "
               "reuses a filled cache correctly.")


def _blame_library(e: Event, why: str, consequence: bool = False) -> None:
    """An event whose pattern is transformers' own doing: say so, and give the workaround, not a fix for the user."""
    e.data["origin"] = "library"
    if consequence:
        e.message = (f"{e.message}. The cache holds that context twice since an earlier call: {why}")
    else:
        e.message = f"{why}; the model now sees that context twice"
    e.advice = _WORKAROUND


def _top_seen(s) -> int:
    seen = s.seen
    return int(seen.max()) if len(seen) else 0


def _as_the_call_left_it(snap, samples, settings: dict):
    """The snapshot of a generate() turn closed after its call returned (it ended before ``max_new_tokens``, at an
    EOS, so its return was not watched): where the cache now holds fewer tokens than its last forward left, the
    program cut it after the call (reset, crop). Outside drafting modes nothing in generate() shortens a cache after
    its last forward (a beam reorder keeps lengths), so that forward's rows are what the call left."""
    last = next((s for s in reversed(samples) if s.cache_id == snap.cache_id), None)
    if last is None or len(last.seen) != len(snap.layers):
        return snap
    seen, stored = last.seen, last.stored
    if not any(lay.seen is not None and 0 <= lay.seen < int(seen[i]) for i, lay in enumerate(snap.layers)):
        return snap
    settings["edited_after_return"] = True
    layers = [lay if lay.seen is None else replace(lay, seen=int(seen[i]), stored=int(stored[i]))
              for i, lay in enumerate(snap.layers)]
    return replace(snap, layers=layers)


def _count_compiled(model, snap, samples, settings: dict) -> None:
    """The forwards of this call that ran compiled, where no hook runs: the cache grew past its last observed forward.

    transformers compiles ``__call__`` for the decode forwards of a call with a static cache and a compile
    config (``get_compiled_call``, which keeps it as ``_compiled_call``); each adds one position to the cache."""
    if not hasattr(model, "_compiled_call"):
        return
    last = next((s for s in reversed(samples) if s.cache_id == snap.cache_id), None)
    seen = [lay.seen for lay in snap.layers if lay.seen is not None and lay.seen >= 0]
    if last is None or not seen or not len(last.seen):
        return
    grown = max(seen) - _top_seen(last)
    if grown > 0:
        settings["compiled_forwards"] = int(grown)


def _draft_steps(samples, first_step: int, snap, prompt_len: int, refed: bool) -> dict:
    """Draft tokens proposed, accepted and rejected per verification forward, and the crops that removed them.

    Read from the forwards' own numbers: a forward's rejected drafts are what the cache lost before the next
    forward began (or before the call returned), its proposed drafts what it fed past the last accepted token."""
    def top(x):
        v = x.seen
        return int(v.max()) if len(v) else 0

    crops, proposed, rejected = [], 0, 0
    for i, s in enumerate(samples):
        if not s.cache_id:
            continue
        after = top(s)
        if i + 1 < len(samples):
            nxt = samples[i + 1]
            start_next = top(nxt) - nxt.q_len
        else:
            seen = [lay.seen for lay in snap.layers if lay.seen is not None] if snap is not None else []
            start_next = max(seen) if seen else after
        lost = max(after - start_next, 0)
        if i == 0:
            before = after - s.q_len
            fed_prompt = prompt_len if refed else max(prompt_len - before, 0)
            drafted = max(s.q_len - fed_prompt, 0)
        else:
            drafted = max(s.q_len - 1, 0)
        proposed += drafted
        rejected += lost
        if lost:
            crops.append([first_step + i, lost])
    return {"forwards": len(samples), "proposed": proposed, "accepted": max(proposed - rejected, 0),
            "rejected": rejected, "crops": crops, "label": "draft rejected"}


class ModelObserver:
    """Records every forward pass of ``model`` into a :class:`TraceRecord` (and a trace file)."""

    def __init__(self, model, *, tokenizer=None, trace_path=None, mode: str = "api",
                 command: list[str] | None = None, flush_every_s: float = 0.5,
                 on_event=None, on_turn=None, role: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.lock = threading.RLock()
        self.probe = CacheProbe(model.config)
        device = device_label(model)
        self.memory = MemorySampler(device, rss_every_s=0.25)  # as ChatSession: a read after each forward cost more than its use
        header = observed_header(model, device, self.memory, mode, command)
        if role:
            header["model"]["role"] = role  # "draft": the assistant_model of another model's generate()
        self.record = TraceRecord(self.probe.n_layers, header)
        self.writer = TraceWriter(trace_path) if trace_path else None
        sinks: list[Sink] = [self.writer] if self.writer is not None else []
        if on_event is not None or on_turn is not None:
            sinks.append(callback_sink(on_event=on_event, on_turn=on_turn))
        self.pipeline = TurnPipeline(self.record, self.probe, self.memory, sinks, flush_every_s=flush_every_s,
                                     max_positions=compat.max_positions(model.config), owns_peak=False,
                                     model=model)
        self.steps = _GuardedStepObserver(model, self.probe, self._on_sample, self.memory, keep_input_ids=True,
                                          on_error=self._fail, on_raise=self._forward_raised)
        self.book = TokenBook()
        self._compiling = compat.compiling_test()
        self.turn: OpenTurn | None = None
        self.errors: list[str] = []
        self.enabled = True
        self.finished = False
        self._gen_codes = generate_codes(type(model))
        self.forward_codes = forward_codes(type(model))
        self._pending_label: str | None = None
        self._prev: _PrevTurn | None = None
        self._pre_handle = None
        self.time_in_pre_hook = 0.0
        self._tokenizer_searches = 0
        self._gc_file: tuple[str | None, dict] | None = None  # the checkpoint's generation_config.json
        self._library_kept = library_slots()  # caches on model._cache already named
        self._refed: dict[int, str] = {}  # caches transformers re-fed its own cached prefix into -> the message

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
        # Inline, the common case first: another forward of the open generate() turn. Its frame was the
        # outermost generate() on this stack when the turn opened, so it still is: no walk to the top
        # of the stack, which right after a forward costs tens of microseconds (docs/observe.md).
        if self._compiling() or not self.enabled:
            return None
        t0 = perf_counter()
        if exit_armed and threading.get_ident() in exit_armed:
            pause_exit_watch()
        cur = self.turn
        if cur is not None and self._pending_label is None:
            gen = cur.gen_frame
            if gen is not None:
                f = sys._getframe(1)
                while f is not None:
                    if f is gen:
                        self.time_in_pre_hook += perf_counter() - t0
                        return None
                    f = f.f_back
        try:
            self._before_forward(args, kwargs, t0)
        except Exception as exc:  # noqa: BLE001 - never break the observed program
            self._fail(exc)
        self.time_in_pre_hook += perf_counter() - t0
        return None

    def before_forward(self, args, kwargs) -> None:
        """Turn bookkeeping before a forward pass runs, for a caller that hooks the forward itself; never raises."""
        self._pre_hook(None, args, kwargs)

    def _fail(self, exc: BaseException) -> None:
        msg = exc_line(exc)
        self.errors.append(msg)
        self.enabled = False
        self.steps.enabled = False
        log.warning("kvinspect stopped observing %s after an internal error: %s", type(self.model).__name__, msg)
        log.debug("observer error", exc_info=exc)

    def _before_forward(self, args, kwargs, t0: float) -> None:
        cur = self.turn
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
                if cur is not None and not manual_boundary(cur, cache_id, cache is not None, q_len):
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
            if s.cache is not None:
                turn.cache = s.cache
            s.input_ids = own_ids(s.input_ids)
            if turn.t_first is None:
                turn.t_first = s.t
            turn.t_last = s.t
            self.pipeline.step(s)
            after = turn.exit_after
            if (after is not None and len(turn.samples) >= after and turn.gen_frame is not None
                    and (not turn.exit_at_seen or _top_seen(s) >= turn.exit_at_seen)):
                # This forward may be the call's last: close the turn at its return, before the program can
                # touch the cache (reset, crop, del), and after transformers' own last edits (draft crops).
                if not watch_exit(turn.gen_frame, self._gen_returned):
                    turn.exit_after = None  # tracing is someone else's: the turn closes as before

    def _gen_returned(self, frame, result) -> None:
        with self.lock:
            t = self.turn
            if not self.enabled or t is None or t.gen_frame is not frame:
                return
            if frame_raised(frame):
                return  # whoever meets the exception closes the turn: the exit handler, or the next forward
            t.returned, t.result = True, result
            try:
                self._close_locked()
            except Exception as exc:  # noqa: BLE001 - never break the observed program
                self._fail(exc)

    def _forward_raised(self, exc: BaseException, cache) -> None:
        """A forward of the open turn raised (a full static cache, out of memory): the turn failed."""
        with self.lock:
            turn = self.turn
            if self.enabled and turn is not None and turn.failure is None:
                turn.failure = Failure.of(exc)
                if turn.cache is None:
                    turn.cache = cache  # measured once at the end: what the cache held when it failed

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
        owner = drafting_for(self.model, frame) if frame is not None else None
        if label is None:
            label = f"generate() at {where}" if kind == "generate" else f"model() at {where}"
            if owner is not None:
                label = f"draft for {type(owner).__name__}.generate() at {where}"
        settings = {**settings, "where": where}
        if owner is not None:
            settings["role"] = "draft"
            settings["draft_for"] = type(owner).__name__
        if frame is not None:
            settings["config_sources"] = self._config_sources(frame)
        tr = TurnRecord(index=index, user=label, policy="observed", cache_impl="",
                        first_step=self.record.n_steps, settings=settings)
        turn = OpenTurn(record=tr, kind=kind, marked=marked, thread_id=threading.get_ident(), t_start=t0,
                        gen_frame=frame, full_ids=own_ids(full_ids))
        if frame is not None:
            # A call that decodes one token a forward returns after max_new_tokens forwards at the latest (earlier
            # at an EOS: then it closes as a manual turn does); one that drafts may return after any forward.
            limit = settings.get("max_new_tokens")
            if drafts(settings.get("mode", "")):
                # A forward verifies drafts: the call may end once the cache, drafts included, reaches the prompt
                # plus max_new_tokens − 1 (the count only runs ahead of the reply, never behind it).
                turn.exit_after = 1
                width = full_ids.shape[-1] if full_ids is not None and len(getattr(full_ids, "shape", ())) == 2 else 0
                turn.exit_at_seen = width + limit - 1 if isinstance(limit, int) and width else 0
            else:
                turn.exit_after = limit if isinstance(limit, int) else None
        self.turn = turn
        self.pipeline.begin(tr)
        turn.samples = self.pipeline.samples  # one list: the boundary rules read what the pipeline keeps
        return turn

    def settle(self) -> None:
        """Close a ``generate()`` turn whose call has returned (from any thread)."""
        with self.lock:
            t = self.turn
            if (t is not None and t.kind == "generate" and t.gen_frame is not None
                    and not frame_running(t.gen_frame, t.thread_id) and not frame_raised(t.gen_frame)):
                # (one that raised stays open: its exception is still on its way up, and the exit
                # handler, which sees it, fails the turn with its message)
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
                self.pipeline.flush()
            else:
                self.pipeline.commit()  # the in-memory record current for a reader in another thread
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            self.lock.release()

    def _close_locked(self, status: str = "ok", error: str = "") -> None:
        turn = self.turn
        if turn is None:
            return
        if (status == "ok" and turn.kind == "generate" and not turn.returned and turn.failure is None
                and turn.gen_frame is not None and not frame_running(turn.gen_frame, turn.thread_id)
                and frame_raised(turn.gen_frame)):
            status, error = "failed", "generate() raised outside the model's forward, and the program went on"
        self.turn = None
        try:
            self._finish_turn(turn, status, error)
        finally:
            unwatch_exit(turn.gen_frame, self._gen_returned)
            turn.gen_frame = None
            turn.result = None
            turn.full_ids = None
            turn.cache = None
            turn.samples = []

    def _finish_turn(self, turn: OpenTurn, status: str, error: str) -> None:
        rec = turn.record
        samples = turn.samples
        result = None
        if turn.kind == "generate" and status == "ok" and turn.failure is None and turn.returned:
            result = sequences_of(turn.result)
        elif (turn.kind == "generate" and status == "ok" and turn.failure is None and turn.gen_frame is not None
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
        mode = rec.settings.get("mode", "")
        draft = rec.settings.get("role") == "draft"
        refeed = None
        if (not draft and drafts(mode) and tt.duplicates and fed and tt.duplicates[0][0] == fed[0].step
                and tt.held_before and full_prompt is not None):
            refeed = _library_refeed(tt.duplicates[0], mode)
            self._refed[tt.duplicates[0][1]] = refeed
            tt.reused = 0  # the call skipped nothing: it fed the cached prefix again
        if mode == "beam" and tt.first_cache_id and full_prompt is not None:
            # transformers reorders the cache's rows to the running beams after every step (reorder_cache with
            # beam_idx): past the prompt, which beam a row holds is its choice, not the ids row 0 was fed.
            self.book.forget_after(tt.first_cache_id, len(full_prompt))
            rec.settings["rows_reordered"] = True
        if result is not None and hasattr(result, "shape") and len(result.shape) == 2:
            rec.settings["returned_rows"] = int(result.shape[0])
        if turn.failure is not None and turn.cache is not None and not any(s.cache_id for s in samples):
            self.book.check_unfed(tt, self.probe.known_id(turn.cache), full_prompt, rec.first_step)
        snap = None
        if turn.cache is not None:
            try:
                snap = self.probe.snapshot(turn.cache)
            except Exception:  # noqa: BLE001 - a cache broken by a failed forward is simply not shown
                if turn.failure is None:
                    raise
                log.debug("could not measure the cache of the failed turn", exc_info=True)
        if snap is not None and turn.kind == "generate" and not turn.returned and not drafts(mode):
            snap = _as_the_call_left_it(snap, samples, rec.settings)
        if snap is not None and turn.kind == "generate" and not drafts(mode):
            _count_compiled(self.model, snap, samples, rec.settings)
        cache_ids = [s.cache_id for s in samples if s.cache_id]
        prev = self._prev
        embedded = bool(fed) and fed[0].ids is None and fed[0].q_len > 0  # inputs_embeds: no ids to compare
        if not (cache_ids and prev is not None and (continues(tt.prompt, prev.held, prev.prompt_len)
                                                    or (embedded and prev.cache_id == cache_ids[0]))):
            prev = None  # this turn does not continue the previous one's cache
        decode = self._decoder()
        ctx = TurnContext(turn_index=rec.index, policy="observed", cache_impl=impl_of(snap),
                          cached_before=tt.held_before, prompt=tt.prompt,
                          prev_cache_id=prev.cache_id if prev is not None else None,
                          cached_ids_before=list(prev.held) if prev is not None else [], reused=tt.reused,
                          decode=decode, role="draft" if draft else "")
        ctx.fed_embeddings = embedded
        if tt.cropped_from is not None and tt.cropped_to:
            ctx.cropped_from, ctx.cropped_to = tt.cropped_from, tt.cropped_to
        if status != "ok" and turn.failure is None:
            rec.status, rec.error = status, error
        rec.cache_impl = ctx.cache_impl
        rec.prompt_ids = tt.prompt
        reply = [t for t in tt.new_ids if t != UNKNOWN]
        rec.reply = decode(reply) if decode is not None and reply else ""
        rec.divergence_at = tt.divergence[2] if tt.divergence and not embedded else None
        rec.cropped_from = tt.cropped_from

        def detect(c: TurnContext, record: TraceRecord):
            events = detect_observed(c, record, tt, decode, self._special_ids())
            if draft:
                # generate() builds the draft's cache per call, feeds it and crops it: nothing there is the program's.
                events = [e for e in events if e.kind not in (CACHE_RECREATED, DUPLICATE_CONTEXT, PREFIX_DIVERGENCE)]
            for e in events:
                cid = e.data.get("cache_id")
                if e.kind == DUPLICATE_CONTEXT and refeed is not None:
                    _blame_library(e, refeed)
                elif e.kind == PREFIX_DIVERGENCE and cid in self._refed:
                    _blame_library(e, self._refed[cid], consequence=True)
                elif e.kind == CACHE_RECREATED and drafts(mode) and compat.assisted_refeeds_prefix():
                    import transformers

                    # The workaround for the re-feed below: a new cache for each drafting call.
                    e.severity = "info"
                    e.data["origin"] = "library"
                    e.message += (f"; with transformers {transformers.__version__} a filled cache cannot be reused by "
                                  f"assisted or prompt-lookup decoding (it feeds the cached prefix again), so a new "
                                  f"cache per call is the workaround, not a mistake")
                    e.advice = "Nothing to change while transformers re-feeds the prefix; reuse the cache once it slices it."
            if turn.marked:
                # The user grouped these forwards: several cache objects in one marked turn are theirs to have.
                events = [e for e in events if not (e.kind == CACHE_RECREATED and "cache_ids" in e.data)]
            return events

        t_end = turn.t_last if turn.t_last is not None else turn.t_start
        given, output = self._call_objects(turn, status)
        if turn.kind == "generate" and given is None and compat.cache_from_generate_output(output) is None:
            ctx.cache_outlives_call = False  # generate() built it for this call and dropped it

        def retained(tr: TurnRecord):
            return retained_events(tr.index, max(tr.end_step - 1, tr.first_step), self.model, result=output,
                                   given=given if turn.kind == "generate" else turn.cache,
                                   turn_kv_bytes=int(tr.kv_held_bytes or tr.kv_bytes or 0), measure=self._held_bytes,
                                   cache_id=self.probe.known_id, own_cache_id=tr.cache_id,
                                   named=self._library_kept)

        # Settings first: finish() writes the turn's line, and what is set after it stays in memory only.
        if drafts(mode) and not draft and samples:
            rec.settings["draft"] = _draft_steps(samples, rec.first_step, snap, len(full_prompt or []),
                                                 refed=refeed is not None)
        if snap is not None and snap.layers:
            batches = [lay.batch for lay in snap.layers if lay.batch]
            if batches:
                rec.settings["cache_rows"] = max(batches)
        self.pipeline.finish(rec, ctx, new_ids=tt.new_ids, snapshot=snap, t_start=turn.t_start, t_first=turn.t_first,
                             t_end=t_end, detect=detect, failure=turn.failure, extra_events=retained)
        if cache_ids:
            held = self.book.snapshot(cache_ids[-1])
            if mode == "beam" and result_row is not None:
                held = list(result_row[:-1])  # the returned sequence is the one a next prompt extends
            self._prev = _PrevTurn(cache_ids[-1], held, len(tt.prompt))

    def _call_objects(self, turn: OpenTurn, status: str):
        """(the cache the generate() call was given, the output it returned), None where unknown."""
        frame = turn.gen_frame
        if turn.kind != "generate" or frame is None:
            return None, None
        try:
            loc = frame.f_locals
            kwargs = loc.get("kwargs") if isinstance(loc.get("kwargs"), dict) else {}
            given = kwargs.get("cache", kwargs.get("past_key_values"))
            if turn.returned:
                return given, (turn.result if status == "ok" and turn.failure is None else None)
            done = status == "ok" and turn.failure is None and not frame_running(frame, turn.thread_id)
            return given, (loc.get("result") if done else None)
        except Exception:  # noqa: BLE001 - introspection is best effort
            return None, None

    def _held_bytes(self, cache) -> int | None:
        try:
            return int(self.probe.snapshot(cache).held_bytes)
        except Exception:  # noqa: BLE001 - a cache the probe cannot read is not counted
            return None

    def _config_sources(self, frame) -> dict:
        """Where this generate() call's cache_implementation / cache_config / use_cache came from."""
        if self._gc_file is None:
            self._gc_file = checkpoint_file(self.model)
        try:
            loc = frame.f_locals
            kwargs = loc.get("kwargs") if isinstance(loc.get("kwargs"), dict) else None
            return config_sources(self.model, kwargs=kwargs, effective=loc.get("generation_config"), file=self._gc_file)
        except Exception:  # noqa: BLE001 - introspection is best effort
            return {}

    def _special_ids(self) -> frozenset[int]:
        try:
            return frozenset(int(i) for i in getattr(self.tokenizer, "all_special_ids", None) or ())
        except (TypeError, ValueError):  # a foreign tokenizer's idea of special ids
            return frozenset()

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
            for key, value in (notes or {}).items():
                self.pipeline.note(key, value)
            if self.errors:
                self.pipeline.note("observer_errors", list(self.errors))
            self.pipeline.close()

    def forget_outputs(self) -> None:
        """Write nowhere any more (a forked child shares the parent's open trace file)."""
        self.pipeline.stream.sinks.clear()
        self.writer = None

    def turn_hit_by(self, tb) -> bool:
        """Whether traceback ``tb`` passes through the open turn's generate() or the model's forward."""
        t = self.turn
        while tb is not None:
            f = tb.tb_frame
            if (t is not None and f is t.gen_frame) or f.f_code in self.forward_codes:
                return True
            tb = tb.tb_next
        return False
