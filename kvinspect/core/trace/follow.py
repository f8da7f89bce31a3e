"""Which file to follow, and reading what was appended to it: the Qt-free half of follow mode.

:class:`FollowSource` decides *which* file to read and when to start over;
:class:`~kvinspect.core.trace.tracefile.TraceReader` reads it: each :meth:`TraceReader.poll` reads
only the bytes appended since the last one and leaves a partial last line for the next. The
source tolerates what a synced or mounted folder does: the file appearing later, the header
arriving in pieces, the file being replaced by a longer copy of itself (sync tools rename a
fresh copy over it: same head, new inode; reading simply continues), and a new run that
rewrites it (a different head, or a shorter file: reading starts over). Given a folder, it
follows the newest ``trace*.jsonl`` (any ``*.jsonl`` in a folder without one, e.g. the autosave
folder) and switches to a file that appears later, saying so.

No Qt here: ``kvinspect view --follow`` polls a source once before the window opens.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from kvinspect.core.errors import TraceError
from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.trace.tracefile import TraceReader

HEAD_BYTES = 4096  # the start of the header line: it changes with every new run (created, model, …)


def check_follow_target(path: str | os.PathLike) -> Path:
    """Refuse a path that cannot ever hold a trace (a typo), with one line; a missing file may appear later."""
    p = Path(path).expanduser()
    if p.exists() or p.parent.is_dir():
        return p
    raise TraceError(f"cannot follow {path}: neither it nor its folder {p.parent} exists")


@dataclass
class FollowStatus:
    """One poll's outcome, as the window shows it."""

    path: Path | None  # the file followed now (None: waiting for one)
    target: Path
    record: TraceRecord | None = None  # set when a new record starts (first header, switch, restart)
    changed: bool = False
    message: str | None = None  # a one-line note: switched files, started over
    n_steps: int = 0
    n_turns: int = 0
    last_change: float | None = None  # time.time() of the last poll that read something
    ended: bool = False  # the writer closed the trace (an ``end`` line)


class FollowSource:
    """Which file to follow and its reader; :meth:`poll` reads what was appended since the last call.

    Parameters
    ----------
    target
        A trace file (it may not exist yet) or a folder (it may not hold a trace yet).
        ``kvinspect view --follow`` polls a source once before the window opens (a file that is
        not a trace is refused with one line) and hands it over, so nothing is read twice.
    """

    def __init__(self, target: str | os.PathLike):
        self.target = Path(target).expanduser()
        self.folder = self.target.is_dir() or (not self.target.exists() and self.target.suffix != ".jsonl")
        self.path: Path | None = None if self.folder else self.target
        self.reader: TraceReader | None = None
        self.last_change: float | None = None
        self._known: set[str] | None = None
        self._head = b""
        self._size = 0
        self._gone = False  # the followed file was deleted (and the user told so)

    # -- which file ---------------------------------------------------------------------------
    def _candidates(self) -> list[Path]:
        if not self.target.is_dir():
            return []
        files = [p for p in self.target.glob("trace*.jsonl") if p.is_file()]
        return files or [p for p in self.target.glob("*.jsonl") if p.is_file()]

    def _pick(self) -> Path | None:
        """The file to follow: the newest at first, then one that appeared since the last look."""
        files = self._candidates()
        names = {p.name for p in files}
        known, self._known = self._known, names
        if self.path is None or known is None:
            return max(files, key=_mtime, default=None)
        new = [p for p in files if p.name not in known]
        return max(new, key=_mtime) if new else self.path

    def _open(self, path: Path) -> None:
        self.path = path
        self.reader = TraceReader(path)
        self._head = b""
        self._size = 0

    # -- one poll -----------------------------------------------------------------------------
    def poll(self) -> FollowStatus:
        """Read what was appended; raises TraceError when the file is not a (readable) trace."""
        st = FollowStatus(path=self.path, target=self.target)
        if self.folder:
            pick = self._pick()
            if pick is not None and (self.reader is None or pick != self.path):
                old = self.path
                self._open(pick)
                if old is not None:
                    st.message = f"switched to {pick.name}: a newer trace appeared in {self.target.name}"
        elif self.reader is None and self.target.is_file():
            self._open(self.target)
        st.path = self.path
        if self.reader is not None and self.path is not None and not self.path.exists():
            if not self._gone:  # said once; the record read so far stays on screen
                self._gone = True
                st.message = f"{self.path.name}: the file was deleted; waiting for it"
            return self._fill(st)
        if self.reader is None or self.path is None:
            return self._fill(st)
        if self._gone:
            self._gone = False
            st.message = f"{self.path.name} is back: following it again"
        size = self.path.stat().st_size
        head = _head(self.path)
        same_head = head.startswith(self._head) or self._head.startswith(head)
        if self._head and (size < self._size or not same_head):
            # Shorter, or another header: a new run rewrote the file. A longer copy with the
            # same head (a sync tool's rename) is the same trace: keep reading where we were.
            self._open(self.path)
            st.message = f"{self.path.name} was rewritten (a new run): following it from the start"
        had = self.reader.record
        st.changed = self.reader.poll()
        self._size = max(size, self._size)
        if len(head) > len(self._head):
            self._head = head
        if st.changed:
            self.last_change = time.time()
        if self.reader.record is not None and self.reader.record is not had:
            st.record = self.reader.record
        return self._fill(st)

    def _fill(self, st: FollowStatus) -> FollowStatus:
        reader = self.reader
        rec = reader.record if reader is not None else None
        if reader is not None and rec is not None:
            with rec.lock:
                st.n_steps, st.n_turns = rec.n_steps, len(rec.turns)
            st.ended = reader.ended
        st.last_change = self.last_change
        return st

    @property
    def record(self) -> TraceRecord | None:
        return self.reader.record if self.reader is not None else None


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(HEAD_BYTES)
    except OSError:
        return b""
