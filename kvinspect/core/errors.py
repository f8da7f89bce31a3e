"""Typed errors for the user's mistakes, and the faults of the machine that are not bugs either.

Everything a user can get wrong (a model spec, a script, a trace file, a flag) raises a
subclass of :class:`KvInspectError` whose message is one line that says what was wrong and
what to do. Entry points print that line and exit 2 (CLI) or show it in a dialog (GUI).
:func:`runtime_fault` names the faults of the machine (out of memory, a full disk): one line
too, and exit 1. Anything else is a bug and is allowed to show a traceback.
"""

from __future__ import annotations

import errno


class KvInspectError(Exception):
    """Base class: a one-line, user-facing message."""

    #: What the ``kvinspect`` command exits with after printing the message: 2, the input was wrong.
    exit_code: int = 2

    def __str__(self) -> str:  # one line, always
        return " ".join(str(a) for a in self.args).replace("\n", " ").strip()


class ModelSpecError(KvInspectError):
    """The model spec names nothing loadable (missing path, unknown built-in, offline hub id)."""


class ModelLoadError(KvInspectError):
    """The spec resolved, but the files are not a usable causal LM (corrupt, truncated, wrong type)."""


class FetchError(KvInspectError):
    """Fetching a downloadable built-in model failed."""


class ScriptError(KvInspectError):
    """A chat script file is missing, not JSON, or not of the documented shape."""


class TraceError(KvInspectError):
    """A trace file is missing, damaged beyond use, or of an unsupported format version."""


class UnsupportedCacheError(KvInspectError):
    """The requested cache implementation cannot run here (e.g. offloaded without CUDA)."""


class Cancelled(KvInspectError):
    """The user cancelled a long operation."""


class RuntimeFault(KvInspectError):
    """The machine failed, not the user's input (out of memory, a full disk): one line, and exit 1."""

    exit_code = 1


def _message_line(exc: BaseException) -> str:
    return next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``str(exc)``, stripped; the type name when the message is empty."""
    return _message_line(exc) or type(exc).__name__


def exc_line(exc: BaseException) -> str:
    """``TypeName: first line`` of an exception; just ``TypeName`` when its message is empty."""
    text = _message_line(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- runtime faults ----------------------------------------------------------------------------------
#: OSError numbers that say the machine failed, not the user: a full disk or quota, an I/O error,
#: a file grown past the filesystem's limit, memory the kernel would not give.
RUNTIME_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EIO", "EFBIG", "ENOMEM")
                           if hasattr(errno, n))


#: How torch's allocators say it in a RuntimeError: CUDA and MPS ("… out of memory"), the CPU one.
_OOM_WORDS = ("out of memory", "can't allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or torch's out-of-memory (a RuntimeError saying so: CUDA, MPS, the CPU allocator)."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in _OOM_WORDS)


def runtime_fault(exc: BaseException) -> str | None:
    """One line for a fault of the machine rather than of the user's input (out of memory, disk full), else None.

    Entry points exit 1 for these (2 stays for the user's mistakes), without a traceback.
    """
    if is_out_of_memory(exc):
        first = _message_line(exc)
        if "out of memory" in first.lower():
            return first  # torch's own line: "CUDA out of memory. Tried to allocate 2.00 GiB …"
        return "out of memory" + (f" ({first})" if first else "")
    if isinstance(exc, OSError) and exc.errno in RUNTIME_ERRNOS:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return None
