"""Which turn a forward pass of observed user code belongs to, found without patching anything.

A ``generate()`` call is recognised by its frame on the Python stack (the code object of
``GenerationMixin.generate``, or of an override in the model's class): every forward made
under the same frame is one turn. Forwards made by the user's own loop follow the rules in
:func:`manual_boundary` (see docs/observe.md). Walking the stack costs about a microsecond
per forward; the frame of an open ``generate()`` is held until its turn is closed, so that
"is it still running?" can be answered by identity, never by a recycled ``id()``.
"""

from __future__ import annotations

import dis
import inspect
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from kvinspect.core.trace.record import TurnRecord

#: Top-level packages whose frames are library code, not the user's (for "generate() at x.py:12").
_LIBRARY_PACKAGES = ("torch", "transformers", "accelerate", "peft", "kvinspect")


def generate_codes(model_cls: type) -> frozenset:
    """Code objects of every ``generate`` in ``model_cls``'s MRO, decorators unwrapped."""
    codes = set()
    for cls in model_cls.__mro__:
        fn = cls.__dict__.get("generate")
        if fn is None:
            continue
        fn = inspect.unwrap(getattr(fn, "__func__", fn))
        code = getattr(fn, "__code__", None)
        if code is not None:
            codes.add(code)
    return frozenset(codes)


def forward_codes(model_cls: type) -> frozenset:
    fn = inspect.unwrap(getattr(model_cls, "forward", None) or (lambda: None))
    code = getattr(fn, "__code__", None)
    return frozenset({code}) if code is not None else frozenset()


def outermost_frame(codes: frozenset, depth: int = 2):
    """The outermost frame on this thread's stack running one of ``codes``, or None."""
    if not codes:
        return None
    found = None
    f: FrameType | None = sys._getframe(depth)
    while f is not None:
        if f.f_code in codes:
            found = f
        f = f.f_back
    return found


_watched: dict[FrameType, list] = {}  # generate() frames whose return is watched -> callbacks(frame, result)
#: Threads whose tracing an exit watch switched on. Any observer's pre-hook on such a thread switches it off,
#: so no model's forward (a draft model's inside an assisted call included) ever runs traced.
armed: set[int] = set()


def watch_exit(frame: FrameType, callback) -> bool:
    """Call ``callback(frame, result)`` when ``frame`` returns; False where a debugger or coverage owns tracing.

    Only the frame's own return event is asked for (``f_trace`` with line events off), and this
    thread's tracing is switched on with a C builtin as the global function (``getattr(frame,
    "call", None)`` is None: no other frame is traced) only between a forward and the next one:
    :func:`pause_exit_watch` switches it off again before each forward (docs/observe.md).
    """
    current = sys.gettrace()
    if current is not None and current is not getattr:
        return False
    cbs = _watched.get(frame)
    if cbs is None:
        cbs = _watched[frame] = []
        frame.f_trace_lines = False
        frame.f_trace = _frame_event
    if callback not in cbs:
        cbs.append(callback)
    if current is None:
        sys.settrace(getattr)
    armed.add(threading.get_ident())
    return True


def pause_exit_watch() -> None:
    """Switch this thread's tracing off while a forward runs (it only has to be on between forwards)."""
    armed.discard(threading.get_ident())
    if sys.gettrace() is getattr:
        sys.settrace(None)


def unwatch_exit(frame: FrameType | None, callback) -> None:
    if frame is None:
        return
    cbs = _watched.get(frame)
    if cbs is None:
        return
    if callback in cbs:
        cbs.remove(callback)
    if not cbs:
        del _watched[frame]
        frame.f_trace = None


def _frame_event(frame, event, arg):
    if event == "return":
        cbs = _watched.pop(frame, ())
        frame.f_trace = None
        pause_exit_watch()
        for cb in list(cbs):
            try:
                cb(frame, arg)
            except Exception:  # noqa: BLE001 - the callbacks guard themselves; nothing reaches the program
                pass
    return None


def drafting_for(model, frame: FrameType | None = None):
    """The model whose ``generate()`` runs ``model`` as its draft (``assistant_model=``), or None.

    ``frame``: the outermost ``generate()`` frame on the stack (found when not given)."""
    if frame is None:
        f: FrameType | None = sys._getframe(1)
        while f is not None:
            if f.f_code.co_name == "generate" and _calls_with_assistant(f, model):
                frame = f
            f = f.f_back
        if frame is None:
            return None
    try:
        loc = frame.f_locals
    except Exception:  # noqa: BLE001
        return None
    owner = loc.get("self")
    return owner if owner is not None and owner is not model and _calls_with_assistant(frame, model) else None


def _calls_with_assistant(frame: FrameType, model) -> bool:
    try:
        return frame.f_locals.get("assistant_model") is model
    except Exception:  # noqa: BLE001
        return False


def frame_running(frame, thread_id: int) -> bool:
    """Whether ``frame`` is still on the stack of thread ``thread_id`` (from any thread)."""
    f = sys._current_frames().get(thread_id)
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


_RETURNS = frozenset(dis.opmap[n] for n in ("RETURN_VALUE", "RETURN_CONST") if n in dis.opmap)


def frame_raised(frame) -> bool:
    """Whether ``frame``, which has finished, ended by an exception rather than a return.

    Its last instruction tells: a return, or the call or raise the exception left from. Another
    thread (the live ticker) sees a ``generate()`` that raised as a finished frame while the exception
    is still on its way up; the exit watch sees its ``return`` event with no value either way.
    """
    i, code = frame.f_lasti, frame.f_code.co_code
    return 0 <= i < len(code) and code[i] not in _RETURNS


_lib_dirs: tuple[str, ...] | None = None


def _library_dirs() -> tuple[str, ...]:
    global _lib_dirs
    if _lib_dirs is None:
        dirs = []
        for name in _LIBRARY_PACKAGES:
            mod = sys.modules.get(name)
            path = getattr(mod, "__file__", None)
            if path:
                dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
        dirs.append(os.path.dirname(os.path.abspath(threading.__file__)) + os.sep)  # stdlib (contextlib, functools)
        if "transformers" in sys.modules and "torch" in sys.modules:
            _lib_dirs = tuple(dirs)  # complete: cache it
        return tuple(dirs)
    return _lib_dirs


def user_frame(frame):
    """The first frame at or above ``frame`` that is not library code (the user's), or None."""
    libs = _library_dirs()
    f = frame
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith("<") and not os.path.abspath(fn).startswith(libs):
            return f
        f = f.f_back
    return None


def user_location(frame) -> str:
    """``file.py:LINE`` of the user's frame at or above ``frame``."""
    f = user_frame(frame)
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}" if f is not None else "?"


def _is_tokenizer(obj) -> bool:
    return any(c.__name__ == "PreTrainedTokenizerBase" for c in type(obj).__mro__)


def find_tokenizer(frame, vocab_size: int | None, depth: int = 6):
    """A tokenizer the user's code holds (its frames' locals, then ``__main__``), read-only.

    Only used to print texts in messages when none was given. A tokenizer whose size does not
    fit the model's vocabulary is skipped (a script may hold several).
    """
    spaces: list[Mapping[str, Any]] = []
    f = user_frame(frame)
    while f is not None and len(spaces) < depth:
        try:
            spaces.append(f.f_locals)
        except Exception:  # noqa: BLE001
            pass
        f = f.f_back
    main = sys.modules.get("__main__")
    if main is not None:
        spaces.append(vars(main))
    for ns in spaces:
        for value in list(ns.values()):
            # Only plain attribute storage is read: a property or a lazy module could run code.
            inner = getattr(value, "__dict__", None)
            held = inner.get("tokenizer") if isinstance(inner, dict) and not isinstance(value, type(sys)) else None
            for cand in (value, held):
                if cand is None or not _is_tokenizer(cand):
                    continue
                try:
                    n = len(cand)
                except Exception:  # noqa: BLE001
                    continue
                if not vocab_size or 0.9 * vocab_size <= n <= vocab_size:
                    return cand
    return None


@dataclass
class OpenTurn:
    """A turn being recorded: its record, what opened it, and the forwards seen so far."""

    record: TurnRecord
    kind: str  # "generate" | "forward"
    marked: bool  # opened by rec.mark(): the user's loop decides where it ends
    thread_id: int
    t_start: float
    gen_frame: Any = None  # the generate() frame (held: identity test; released on close)
    full_ids: Any = None  # generate()'s whole input_ids (tensor reference)
    samples: list = field(default_factory=list)
    cache: Any = None  # the last cache object used (for the end-of-turn snapshot)
    t_first: float | None = None
    t_last: float | None = None
    last_passed: bool | None = None  # whether the latest forward was passed a cache (manual turns)
    failure: Any = None  # a pipeline Failure: a forward of this turn raised
    returned: bool = False  # closed from the generate() call's own exit (its return event)
    result: Any = None  # what that call returned (taken from its return event)
    exit_after: int | None = None  # forwards after which the call may return (its exit is watched from then on)
    exit_at_seen: int = 0  # drafting calls: the cache length from which a forward may be the call's last

    @property
    def last(self):
        return self.samples[-1] if self.samples else None

    def had_decode(self) -> bool:
        """A one-token forward after the first one: the loop is decoding."""
        return any(s.q_len == 1 for s in self.samples[1:])


def manual_boundary(turn: OpenTurn | None, cache_id: int | None, has_cache: bool, q_len: int) -> bool:
    """Whether a forward made outside ``generate()`` starts a new turn.

    ``has_cache``: a cache was passed in; ``cache_id`` is the probe's id for it (None: an object
    never seen before). A new turn starts after a ``generate()`` turn; when the cache passed
    changes (except to the one the previous forward built, the usual
    ``out = model(ids); model(next, past_key_values=out.past_key_values)`` loop); when a
    multi-token (prefill) forward follows decode steps; and, with no cache passed, when the
    input is not the previous input plus one token. A turn opened by ``rec.mark()`` never splits.
    """
    if turn is None or turn.kind == "generate":
        return True
    if turn.marked:
        return False
    last = turn.last
    if last is None or turn.last_passed is None:
        return False
    if has_cache != turn.last_passed:
        return not (has_cache and cache_id is not None and cache_id == last.cache_id)
    if has_cache:
        if cache_id != last.cache_id:
            return True
        return q_len > 1 and turn.had_decode()
    return q_len != last.q_len + 1


def generate_settings(frame) -> tuple[Any, dict]:
    """``(input_ids, settings)`` read from a running ``generate()`` frame (read-only, once a turn)."""
    try:
        loc = frame.f_locals
    except Exception:  # noqa: BLE001 - introspection is best effort
        return None, {}
    ids = loc.get("input_ids")
    if ids is None or not hasattr(ids, "shape"):
        ids = loc.get("inputs") if hasattr(loc.get("inputs"), "shape") else None
    gc = loc.get("generation_config")
    settings: dict[str, Any] = {}
    if gc is not None:
        for key in ("max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "num_beams",
                    "num_return_sequences", "prompt_lookup_num_tokens", "use_cache", "cache_implementation"):
            v = getattr(gc, key, None)
            if isinstance(v, (int, float, str, bool)) or v is None:
                settings[key] = v
    assistant = loc.get("assistant_model")
    if assistant is not None:
        settings["assistant_model"] = type(assistant).__name__
    settings["mode"] = decoding_mode(settings)
    if hasattr(ids, "shape") and len(ids.shape) == 2:
        settings["batch"] = int(ids.shape[0])
        kwargs = loc.get("kwargs") if isinstance(loc.get("kwargs"), dict) else {}
        mask: Any = kwargs.get("attention_mask")
        if settings["batch"] > 1 and mask is not None and hasattr(mask, "shape") and tuple(mask.shape) == tuple(ids.shape):
            # Left padding: each row's pad positions are cache rows too (seen/stored count them), not conversation.
            pads = [int(n) for n in (mask == 0).sum(dim=1).tolist()]
            if any(pads):
                settings["pad_tokens"] = pads
    return ids, settings


def decoding_mode(settings: Mapping[str, Any]) -> str:
    """``greedy``, ``sample``, ``beam``, ``assisted`` or ``prompt_lookup``: how generate() decodes this call."""
    if settings.get("assistant_model"):
        return "assisted"
    if settings.get("prompt_lookup_num_tokens"):
        return "prompt_lookup"
    if (settings.get("num_beams") or 1) > 1:
        return "beam"
    return "sample" if settings.get("do_sample") else "greedy"


def drafts(mode: str) -> bool:
    """Whether a decoding mode feeds draft tokens that the call then crops off the cache again."""
    return mode in ("assisted", "prompt_lookup")


def generate_result_ids(frame) -> Any:
    """The sequences a finished ``generate()`` frame returned, when its locals still say so."""
    try:
        result = frame.f_locals.get("result")
    except Exception:  # noqa: BLE001
        return None
    return sequences_of(result)


def sequences_of(result) -> Any:
    """The sequences in what ``generate()`` returned (a tensor, or an output with ``.sequences``)."""
    if result is None:
        return None
    if hasattr(result, "shape"):
        return result
    seq = result.get("sequences") if hasattr(result, "get") else getattr(result, "sequences", None)
    return seq if hasattr(seq, "shape") else None
