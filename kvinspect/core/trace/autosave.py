"""Autosaved traces: where the GUI's sessions are written as they run, so a crash loses nothing.

The GUI passes :func:`autosave_path` to :class:`~.session.ChatSession` as ``trace_path``; the
trace writer then appends as the session runs (steps about every 0.5 s, a ``turn`` line and
an ``fsync`` at the end of each turn). A crash or ``kill -9`` therefore loses at most the turn
in progress, and :func:`~.tracefile.read_trace` opens what is left with that turn marked
``interrupted``. Old autosaves are pruned to the newest :data:`KEEP`.

An autosave belongs to the window that writes it: :func:`open_autosave` creates it and holds an
exclusive ``flock`` on it for as long as the file stays open (the window's session), and
:func:`prune_autosaves` deletes only a file whose lock it can take itself. An idle window's file
is never pruned, however old and however many newer ones exist; a crashed window's lock is gone
with its process, so its file is pruned in its turn. Where ``flock`` does not exist (Windows) a
file written in the last :data:`LIVE_SECONDS` is kept instead.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no flock; the age guard alone protects a live file
    fcntl = None  # type: ignore[assignment]

from kvinspect.core.paths import data_dir

KEEP = 20
SUFFIX = ".jsonl"
#: A file written to this recently may belong to a session that is still running elsewhere.
LIVE_SECONDS = 600.0


def autosave_dir() -> Path:
    """``data_dir()/autosave`` (``KVINSPECT_DATA_DIR`` moves it, e.g. in tests)."""
    return data_dir() / "autosave"


def autosave_path(model_name: str, *, keep: int = KEEP, now: datetime | None = None) -> Path:
    """A fresh, timestamped trace path for a new session; prunes older autosaves first.

    Parameters
    ----------
    model_name
        The model's name or spec; a path is reduced to its file name.
    keep
        How many autosaves to keep, counting the new one.
    now
        The timestamp to use (tests); default: the local time now.

    Returns
    -------
    Path
        ``…/autosave/YYYYmmdd-HHMMSS-<model>.jsonl``; the folder exists, the file does not.
    """
    folder = autosave_dir()
    folder.mkdir(parents=True, exist_ok=True)
    prune_autosaves(max(keep - 1, 0))
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = f"{stamp}-{_slug(model_name)}"
    path = folder / f"{base}{SUFFIX}"
    n = 2
    while path.exists():  # two sessions in the same second
        path = folder / f"{base}-{n}{SUFFIX}"
        n += 1
    return path


def open_autosave(model_name: str, *, keep: int = KEEP, now: datetime | None = None) -> IO[bytes]:
    """A new autosave (see :func:`autosave_path`), created and opened for writing, owned by the caller.

    The returned binary file holds an exclusive lock on the autosave until it is closed: no other
    window's :func:`prune_autosaves` deletes it meanwhile. ``f.name`` is its path.
    """
    for _ in range(100):  # another window may create the same name between the check and the open
        path = autosave_path(model_name, keep=keep, now=now)
        try:
            f = path.open("xb")
        except FileExistsError:
            continue
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a filesystem without locks (some network mounts): the age guard remains
                pass
        return f
    raise FileExistsError(f"no free autosave name for {model_name!r} in {autosave_dir()}")


def is_owned(path: Path) -> bool:
    """True when a live window holds ``path``'s lock (False where locks do not exist)."""
    if fcntl is None:
        return False
    try:
        with path.open("rb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError:
                return False
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except OSError:
        return False
    return False


@dataclass(frozen=True)
class Autosave:
    """One autosaved trace, as a "recent sessions" or "recover" menu lists it."""

    path: Path
    mtime: float
    size: int
    closed: bool  # the session ended cleanly (an ``end`` line); False: crashed, killed or still running

    @property
    def name(self) -> str:
        return self.path.name


def list_autosaves() -> list[Autosave]:
    """Autosaved traces, newest first."""
    folder = autosave_dir()
    if not folder.is_dir():
        return []
    out = []
    for p in folder.glob(f"*{SUFFIX}"):
        try:
            st = p.stat()
        except OSError:
            continue  # pruned or moved meanwhile
        out.append(Autosave(p, st.st_mtime, st.st_size, _ends_cleanly(p)))
    out.sort(key=lambda a: (a.mtime, a.name), reverse=True)
    return out


def prune_autosaves(keep: int = KEEP) -> list[Path]:
    """Delete all but the newest ``keep`` autosaves; never one a live window owns (its lock is held), nor
    one written to in the last :data:`LIVE_SECONDS` (a window of an older kvinspect holds no lock)."""
    removed = []
    now = time.time()
    for a in list_autosaves()[keep:]:
        if now - a.mtime < LIVE_SECONDS:
            continue
        if _unlink_unowned(a.path):
            removed.append(a.path)
    return removed


def _unlink_unowned(path: Path) -> bool:
    """Delete ``path`` while holding its lock, so a window cannot take it between the check and the unlink."""
    try:
        with path.open("rb") as f:
            if fcntl is not None:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # a live window's session
                except OSError:
                    pass  # no locks on this filesystem: the age guard decided
            path.unlink()
            return True
    except OSError:
        return False


def _slug(name: str) -> str:
    name = Path(str(name or "model").rstrip("/\\")).name or "model"
    name = re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return (slug or "model")[:60]


def _ends_cleanly(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - 512, 0))
            tail = f.read().rstrip().rsplit(b"\n", 1)[-1]
    except OSError:
        return False
    return b'"type":"end"' in tail
