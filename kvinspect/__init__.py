"""kvinspect: a live inspector for the KV cache of Hugging Face transformers models."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("kvinspect")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+src"

__all__ = ["Event", "Observation", "TraceRecord", "TurnRecord", "__version__", "observe"]

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from .core.detect.events import Event
    from .core.model.loading import LoadedModel
    from .core.observe.api import Observation
    from .core.trace.record import TraceRecord, TurnRecord

#: Public names imported on first use (each pulls in torch or numpy), so ``import kvinspect`` stays light.
_LAZY = {
    "Event": "kvinspect.core.detect.events",
    "Observation": "kvinspect.core.observe.api",
    "TraceRecord": "kvinspect.core.trace.record",
    "TurnRecord": "kvinspect.core.trace.record",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvinspect' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def observe(model: PreTrainedModel | LoadedModel, tokenizer: PreTrainedTokenizerBase | None = None, *,
            trace: str | os.PathLike[str] | None = None, flush_every_s: float = 0.5,
            on_event: Callable[[Event], None] | None = None,
            on_turn: Callable[[TurnRecord], None] | None = None) -> Observation:
    """Observe the KV cache of ``model`` while your own code runs; see :func:`kvinspect.core.observe.api.observe`.

    ``with kvinspect.observe(model, tokenizer, trace="out/run") as rec: ...`` records every forward
    pass in the block; ``rec.problems`` names the cache mistakes found.

    Parameters
    ----------
    model
        A transformers causal LM the caller already holds (or a kvinspect ``LoadedModel``).
    tokenizer
        Optional; used only to decode replies and divergence excerpts in messages.
    trace
        A folder (``trace.jsonl`` and, at the end, ``summary.json`` go there) or a ``.jsonl`` path;
        appended while the code runs (``kvinspect view --follow DIR``). None: in memory only.
    flush_every_s
        How often recorded steps are appended to the trace file during a long turn.
    on_event, on_turn
        Called with each detector :class:`Event` / each finished :class:`TurnRecord` (on the
        observed thread, or on the live ticker thread when a turn is closed there).

    Returns
    -------
    Observation
        A context manager; ``rec.record`` (a :class:`TraceRecord`), ``rec.turns``, ``rec.events``,
        ``rec.problems``, ``rec.mark(label)``.

    The implementation (torch and all) is imported on the first call, so that ``import kvinspect``
    stays light.
    """
    from .core.observe.api import observe as _observe

    return _observe(model, tokenizer, trace, flush_every_s=flush_every_s, on_event=on_event, on_turn=on_turn)
