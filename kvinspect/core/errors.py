"""Typed errors for the user's mistakes.

Everything a user can get wrong (a model spec, a script, a trace file, a flag) raises a
subclass of :class:`KvInspectError` whose message is one line that says what was wrong and
what to do. Entry points print that line and exit 2 (CLI) or show it in a dialog (GUI);
anything else is a bug and is allowed to show a traceback.
"""

from __future__ import annotations


class KvInspectError(Exception):
    """Base class: a one-line, user-facing message."""

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
