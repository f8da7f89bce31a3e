"""``memory_retained``: KV bytes still reachable after a turn from something other than the user's cache.

A cache kept on the model by ``generate()`` (the transformers PR that stopped a static cache
staying on ``self._cache`` after ``generate``), or a cache left in a returned output the program
keeps (``return_dict_in_generate=True`` hands back ``past_key_values``), holds its K/V tensors
alive after the turn, invisible to code that only looks at its own cache object. After each turn
the model's own attributes and the call's returned output are searched for cache objects other
than the one the call was given; each found is one event naming the holder and its bytes. Info,
or warn above :data:`WARN_FRACTION` of the turn's KV bytes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, MutableSet
from typing import Any

from kvinspect.core.detect.events import MEMORY_RETAINED, Event
from kvinspect.core.units import fmt_bytes

WARN_FRACTION = 0.10


def _is_cache(obj: Any) -> bool:
    # Duck-typed, as the probe reads caches: every transformers cache class has these two.
    return hasattr(obj, "get_seq_length") and (hasattr(obj, "layers") or hasattr(obj, "key_cache"))


def holders(model, result: Any = None) -> Iterator[tuple[str, Any]]:
    """``(name, cache)`` for caches on the model's own attributes and in a returned output."""
    for name, value in list(vars(model).items()):
        if name.startswith("_modules") or name in ("_parameters", "_buffers"):
            continue
        if _is_cache(value):
            yield f"model.{name}", value
    if result is not None and not hasattr(result, "shape"):
        pkv = getattr(result, "past_key_values", None)
        if pkv is None and hasattr(result, "get"):
            try:
                pkv = result.get("past_key_values")
            except Exception:  # noqa: BLE001 - an output class without a mapping interface
                pkv = None
        if pkv is not None and _is_cache(pkv):
            yield "the output generate() returned (.past_key_values)", pkv


LIBRARY_SLOT = "model._cache"


def library_slots() -> MutableSet[Any]:
    """The set :func:`retained_events` keeps the library's kept caches in, so each is named once."""
    return weakref.WeakSet()


def _library_event(turn_index: int, step: int, nbytes: int, turn_kv_bytes: int, cid: int | None,
                   keeps: bool) -> Event:
    import transformers

    who = (f"transformers {transformers.__version__} keeps the cache generate() built (cache_implementation "
           f"static, hybrid or sliding) on model._cache for its next call to reuse" if keeps else
           "model._cache, where older transformers releases keep the cache generate() built, holds a cache")
    # Not the program's doing: generate() itself keeps the static/hybrid cache it built on the model
    # (GenerationMixin._get_cache) for the next call to reuse. Named once, as info, so a correct
    # program on such a release carries no problem.
    return Event(
        MEMORY_RETAINED, "info", turn_index, step,
        f"{who}: {fmt_bytes(nbytes)} of KV stay alive as long as the model, beside your own cache",
        "Nothing is wrong in your loop. To free it: del model._cache, or pass your own cache object to every "
        "generate() call so generate() builds none.",
        data={"holder": LIBRARY_SLOT, "bytes": int(nbytes), "turn_kv_bytes": int(turn_kv_bytes), "cache_id": cid,
              "origin": "library"},
    )


def retained_events(turn_index: int, step: int, model, *, result: Any = None, given: Any = None,
                    turn_kv_bytes: int, measure: Callable[[Any], int | None],
                    cache_id: Callable[[Any], int | None], own_cache_id: int = 0,
                    named: MutableSet[Any] | None = None) -> list[Event]:
    """One event per cache found in :func:`holders` that is not ``given`` (the cache the call was passed).

    ``own_cache_id``: the cache the turn itself used. Found in the returned output, it is the cache a
    program keeps to continue the conversation (``out.past_key_values``), not memory hidden from it.
    ``named`` (from :func:`library_slots`): the caches transformers keeps on ``model._cache`` that an
    earlier turn named already; each is named once, as the library's."""
    out: list[Event] = []
    seen: set[int] = set()
    for name, cache in holders(model, result):
        if cache is given or id(cache) in seen:
            continue
        if own_cache_id and not name.startswith("model.") and cache_id(cache) == own_cache_id:
            continue
        seen.add(id(cache))
        library = name == LIBRARY_SLOT
        if library and named is not None and cache in named:
            continue
        nbytes = measure(cache)
        if not nbytes:
            continue
        if library:
            if named is not None:
                named.add(cache)
            out.append(_library_event(turn_index, step, nbytes, turn_kv_bytes, cache_id(cache),
                                      keeps=hasattr(model, "_get_cache")))
            continue
        share = nbytes / turn_kv_bytes if turn_kv_bytes else 1.0
        severity = "warn" if share > WARN_FRACTION else "info"
        out.append(Event(
            MEMORY_RETAINED, severity, turn_index, step,
            f"{fmt_bytes(nbytes)} of KV are still reachable from {name} after turn {turn_index + 1} "
            f"({share:.0%} of the turn's {fmt_bytes(turn_kv_bytes)}): memory your own cache variable does not show",
            "Drop the reference when the turn is done (del the output, or keep only .sequences), or pass your own "
            "cache so generate() builds none; a cache kept on the model lives as long as the model.",
            data={"holder": name, "bytes": int(nbytes), "turn_kv_bytes": int(turn_kv_bytes),
                  "cache_id": cache_id(cache), "share": round(share, 4)},
        ))
    return out
