"""Autosaved traces: where the GUI's sessions are written as they run, so a crash loses nothing.

The GUI passes :func:`autosave_path` to :class:`~.session.ChatSession` as ``trace_path``; the
trace writer then appends as the session runs (steps about every 0.5 s, a ``turn`` line and
an ``fsync`` at the end of each turn). A crash or ``kill -9`` therefore loses at most the turn
in progress, and :func:`~.tracefile.read_trace` opens what is left with that turn marked
``interrupted``. Old autosaves are pruned to the newest :data:`KEEP`.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

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
    """Delete all but the newest ``keep`` autosaves; never one written to in the last few minutes."""
    removed = []
    now = time.time()
    for a in list_autosaves()[keep:]:
        if now - a.mtime < LIVE_SECONDS:
            continue
        try:
            a.path.unlink()
            removed.append(a.path)
        except OSError:
            pass
    return removed


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
