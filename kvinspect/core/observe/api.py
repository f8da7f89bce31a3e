"""``kvinspect.observe(model)``: watch the KV cache of the user's own code, unchanged.

.. code-block:: python

    with kvinspect.observe(model, tokenizer, trace="out/mychat") as rec:
        my_chat_loop(model, tokenizer)          # generate() calls and/or a manual forward loop
    print(rec.problems)                         # e.g. ['cache_recreated']

Every forward pass the model makes inside the block is recorded (per-layer seen / stored /
window / device / bytes, memory, cache identity); each ``generate()`` call is a turn, and
``rec.mark("label")`` labels the next turn of a manual loop. At the end of each turn the
detectors run on what the code actually did. With ``trace=DIR`` the trace is appended while
the code runs, so ``kvinspect view --follow DIR`` can watch it live. Leaving the block
removes every hook; results are bit-identical with and without observation.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvinspect.core.errors import KvInspectError, exc_line
from kvinspect.core.observe.live import Ticker
from kvinspect.core.observe.model_observer import ModelObserver
from kvinspect.core.trace.summary import write_summary
from kvinspect.core.trace.tracefile import TRACE_NAME

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from kvinspect.core.detect.events import Event
    from kvinspect.core.model.loading import LoadedModel
    from kvinspect.core.trace.record import TraceRecord, TurnRecord

SUMMARY_NAME = "summary.json"


class ObserveError(KvInspectError):
    """``observe()`` was given something it cannot observe."""


def _unwrap(model, tokenizer):
    # A kvinspect LoadedModel carries its tokenizer: accept it as is.
    if hasattr(model, "model") and hasattr(model, "tokenizer") and hasattr(model, "resolved"):
        return model.model, tokenizer if tokenizer is not None else model.tokenizer
    return model, tokenizer


class Observation:
    """What :func:`observe` returns: the live record of one model, and the block around it."""

    def __init__(self, model: PreTrainedModel | LoadedModel, tokenizer: PreTrainedTokenizerBase | None = None,
                 trace: str | os.PathLike[str] | None = None, *, flush_every_s: float = 0.5,
                 on_event: Callable[[Event], None] | None = None,
                 on_turn: Callable[[TurnRecord], None] | None = None):
        model, tokenizer = _unwrap(model, tokenizer)
        if not (hasattr(model, "register_forward_hook") and hasattr(model, "config")):
            raise ObserveError(f"observe() needs a transformers model (a torch module with a config), "
                               f"got {type(model).__name__}")
        if getattr(model.config, "is_encoder_decoder", False):
            raise ObserveError(f"observe() inspects decoder-only causal LMs; {type(model).__name__} is "
                               f"an encoder-decoder model")
        self.out_dir: Path | None = None
        trace_path = None
        if trace is not None:
            p = Path(trace)
            if p.suffix == ".jsonl":
                self.out_dir, trace_path = p.parent, p
            else:
                self.out_dir, trace_path = p, p / TRACE_NAME
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ObserveError(f"cannot create the trace folder {self.out_dir}: {exc.strerror or exc}") from None
        self.observer = ModelObserver(model, tokenizer=tokenizer, trace_path=trace_path, mode="api",
                                      flush_every_s=flush_every_s, on_event=on_event, on_turn=on_turn)
        self._ticker: Ticker | None = None
        self._started = False
        self._closed = False
        self.summary_path: Path | None = None

    # -- lifetime ---------------------------------------------------------------------------------
    def start(self) -> Observation:
        """Attach the hooks (``with`` does this for you)."""
        if self._closed:
            raise ObserveError("this observation is closed; call kvinspect.observe(model) again")
        if not self._started:
            self._started = True
            self.observer.attach()
            atexit.register(self.close)  # a program that never closes the block still ends its trace
            if self.observer.writer is not None:
                # Live following: close finished generate() turns and flush steps while the code idles.
                self._ticker = Ticker()
                self._ticker.add(self.observer)
        return self

    def close(self, status: str = "ok", error: str = "") -> None:
        """Close the open turn, remove every hook, finish the trace and write ``summary.json``."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._ticker is not None:
            self._ticker.stop()
        self.observer.detach()
        self.observer.finish(status, error)
        trace_path = self.trace_path
        if self.out_dir is not None and trace_path is not None:
            name = SUMMARY_NAME if trace_path.name == TRACE_NAME else trace_path.stem + ".summary.json"
            self.summary_path = write_summary(self.out_dir / name, self.record)

    def __enter__(self) -> Observation:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        status, error = "ok", ""
        if exc_type is not None and self.observer.turn is not None and self.observer.turn_hit_by(tb):
            status = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"
            error = exc_line(exc) if exc is not None else exc_type.__name__
        self.close(status, error)

    # -- what the user reads ----------------------------------------------------------------------
    def mark(self, label: str) -> None:
        """Label the next turn (and keep a manual loop's forwards in it until the next mark)."""
        self.observer.mark(label)

    @property
    def record(self) -> TraceRecord:
        """The :class:`~kvinspect.core.trace.record.TraceRecord` (steps, turns, events)."""
        self.observer.settle()
        return self.observer.record

    @property
    def turns(self) -> list[TurnRecord]:
        return list(self.record.turns)

    @property
    def events(self) -> list[Event]:
        return list(self.record.events)

    @property
    def problems(self) -> list[str]:
        """Sorted kinds of the warning/error events so far (info events such as window_reached excluded)."""
        return sorted({e.kind for e in self.events if e.is_problem})

    @property
    def errors(self) -> list[str]:
        """Internal errors that stopped the observation (empty when all went well)."""
        return list(self.observer.errors)

    @property
    def trace_path(self) -> Path | None:
        w = self.observer.writer
        return w.path if w is not None else None

    def summary(self) -> dict:
        from kvinspect.core.trace.summary import build_summary

        return build_summary(self.record)


def observe(model: PreTrainedModel | LoadedModel, tokenizer: PreTrainedTokenizerBase | None = None,
            trace: str | os.PathLike[str] | None = None, *, flush_every_s: float = 0.5,
            on_event: Callable[[Event], None] | None = None,
            on_turn: Callable[[TurnRecord], None] | None = None) -> Observation:
    """Observe every forward pass ``model`` makes until the block ends.

    Parameters
    ----------
    model
        A transformers causal LM the caller already holds (or a kvinspect ``LoadedModel``).
    tokenizer
        Optional; used only to decode replies and divergence excerpts in messages.
    trace
        A folder (``trace.jsonl`` and, at the end, ``summary.json`` go there) or a ``.jsonl`` path.
        The file grows while the code runs: ``kvinspect view --follow DIR`` shows it live.
    flush_every_s
        How often recorded steps are appended to the trace file during a long turn.
    on_event, on_turn
        Callbacks for each detector event / finished :class:`~kvinspect.core.trace.record.TurnRecord`
        (called on the observed thread, or on the live ticker thread when a turn is closed there).

    Returns
    -------
    Observation
        A context manager; ``rec.record``, ``rec.turns``, ``rec.events``, ``rec.problems``, ``rec.mark(label)``.
    """
    return Observation(model, tokenizer, trace, flush_every_s=flush_every_s, on_event=on_event, on_turn=on_turn)
