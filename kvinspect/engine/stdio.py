"""The engine's stdin/stdout: taken for the protocol at start-up, written by one thread in batches.

:func:`take_stdio` keeps the real stdout (and stdin) for the protocol and points file descriptor 1
and ``sys.stdout`` at stderr, so whatever else prints (transformers warnings, tqdm, a ``print`` in
a forward hook, a C library writing to fd 1) lands on stderr, which the window relays to its log.
The protocol descriptors are not inherited by child processes (``pip download``, the plot renderer).

:class:`LineWriter` owns the protocol stdout. Producers (the generation thread, the heartbeat, the
request loop) only put messages on a queue and never block on the pipe. One writer thread drains
the queue, coalesces what piled up (consecutive tokens of a turn into one line, consecutive step
blocks into one block, heartbeats into the latest) and writes the batch in a single ``write``:
tokens and step blocks wait up to ``batch_s`` to be batched (and ``gather_s`` at least, so that a
step's block and its token go out together), replies and trace lines go out at once, with whatever
waited before them. ``batch_s`` is the window's paint interval once it says it (the ``pace``
signal); the pace runs from the last streamed batch of the same turn, so a turn's first token and
step block go out as soon as its prefill ends, not one interval after its ``turn_start`` line (a
person waits for that token). A heartbeat is not written while other lines stream: any line
shows the engine alive.
A window that falls behind therefore makes batches bigger; it never slows the model down.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np

from kvinspect.core.text_safety import LONE_SURROGATE
from kvinspect.core.trace.messages import json_default

log = logging.getLogger(__name__)

#: Kinds that may wait a little to be batched with others (everything else is written at once).
LAZY = frozenset({"token", "steps", "heartbeat", "progress", "compare_progress"})
#: Lazy kinds that set the pace of the next: a batch of them is followed by the next no sooner than ``batch_s``.
PACED = LAZY - {"heartbeat"}


def take_stdio() -> tuple[IO[bytes], IO[bytes]]:
    """Take fds 0 and 1 for the protocol; return ``(protocol_in, protocol_out)`` (binary).

    Afterwards fd 1 and ``sys.stdout`` are stderr, fd 0 and ``sys.stdin`` are ``/dev/null``.
    """
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    out_fd = os.dup(1)  # os.dup: not inheritable (PEP 446), so children never write protocol lines
    in_fd = os.dup(0)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    return os.fdopen(in_fd, "rb"), os.fdopen(out_fd, "wb", buffering=0)


def _json_default(o):
    try:
        return json_default(o)
    except TypeError:
        # Like compare.json's writer: an odd value becomes its text, and the line still goes out.
        return sorted(o) if isinstance(o, (set, frozenset)) else str(o)


def dumps(obj: dict) -> str:
    """One protocol line. A lone surrogate (a model's half of a pair, a request's echoed text) cannot be
    UTF-8: it goes out as the visible text ``\\udXXX``, never as an encoding error that stops the writer."""
    line = json.dumps(obj, separators=(",", ":"), default=_json_default, ensure_ascii=False)
    if LONE_SURROGATE.search(line):  # only inside JSON strings, where an escaped backslash is valid
        line = LONE_SURROGATE.sub(lambda m: f"\\\\u{ord(m.group()):04x}", line)
    return line



def read_lines(f: IO[bytes] | Iterable[bytes], limit: int) -> Iterator[bytes | None]:
    """The lines of ``f``; None for a line longer than ``limit`` bytes, which is skipped without being held.

    ``f`` may be any iterable of lines (tests feed a list), whose lines are then already whole.
    """
    if not hasattr(f, "readline"):
        for line in f:
            yield line if len(line) <= limit else None
        return
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # the rest of the long line, a block at a time
                raw = f.readline(1 << 20)
            yield None
            continue
        yield raw


_CLOSE = object()


def _kind(item) -> str:
    if isinstance(item, dict):
        return str(item.get("type"))
    return getattr(item, "kind", "?")


class LineWriter:
    """Writes protocol lines to ``f`` from its own thread. ``send`` never blocks.

    Items are control dicts (``{"type": …}``) or stream messages (:mod:`kvinspect.core.trace.messages`),
    serialised on the writer thread. ``on_broken`` runs (on the writer thread) when the pipe is gone.
    """

    def __init__(self, f: IO[bytes], *, batch_s: float = 0.02, gather_s: float = 0.01, quiet_s: float = 0.9,
                 on_broken=None):
        self.f = f
        self.batch_s = batch_s
        self.gather_s = gather_s  # a lazy line waits this long for others, at least
        self.quiet_s = quiet_s  # a heartbeat this soon after a written line is dropped
        self.on_broken = on_broken
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.lines_written = 0
        self.writes = 0
        self.broken = False
        self._last_write = 0.0
        self._paced_from = -math.inf  # the last batch of streamed lines went out then (-inf: a turn starts)
        self._thread = threading.Thread(target=self._run, name="kvinspect-engine-writer", daemon=True)
        self._thread.start()

    def send(self, item: Any) -> None:
        self.q.put(item)

    def close(self, timeout: float = 10.0) -> None:
        """Write everything queued so far, then stop the thread."""
        self.q.put(_CLOSE)
        self._thread.join(timeout)

    # -- writer thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except Exception:  # noqa: BLE001 - a writer that cannot write leaves a mute engine: end it, loudly
            log.critical("the protocol writer failed; the engine exits", exc_info=True)
            self.broken = True
            if self.on_broken is not None:
                self.on_broken()

    def _gather(self, batch: list, until: float) -> bool:
        """Add what arrives before ``until`` to ``batch``; a line that may not wait (a reply, a turn's
        line) ends the wait at once and goes out with the lazy ones before it. True: the writer closes."""
        while (left := until - time.monotonic()) > 0:
            try:
                nxt = self.q.get(timeout=left)
            except queue.Empty:
                break
            if nxt is _CLOSE:
                return True
            batch.append(nxt)
            if _kind(nxt) not in LAZY:
                break
        return False

    def _serve(self) -> None:
        closing = False
        while not closing:
            item = self.q.get()
            if item is _CLOSE:
                break
            kind = _kind(item)
            wait = 0.0
            if kind in LAZY:
                # A lazy line waits a little for its companions (a step's block and its token are
                # sent a millisecond or so apart): one write, so one read and one paint in the window.
                now = time.monotonic()
                wait = max(self._paced_from + self.batch_s, now + self.gather_s) - now
                if kind == "heartbeat" and now - self._last_write < self.quiet_s:
                    wait = 0.0  # (a heartbeat alone after a recent line says nothing new: see below)
            batch = [item]
            if wait > 0:
                closing = self._gather(batch, time.monotonic() + wait)
            while not closing:
                try:
                    nxt = self.q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _CLOSE:
                    closing = True
                    break
                batch.append(nxt)
            # Any line shows the engine alive: while lines stream, heartbeats are not written.
            if any(_kind(x) != "heartbeat" for x in batch):
                batch = [x for x in batch if _kind(x) != "heartbeat"]
            elif time.monotonic() - self._last_write < self.quiet_s:
                continue
            try:
                lines = [self._line(x) for x in coalesce(batch)]
            except Exception:  # noqa: BLE001 - a bug in one message must not end the stream
                log.exception("could not serialise a protocol message")
                lines = []
                for x in batch:
                    try:
                        lines.append(self._line(x))
                    except Exception:  # noqa: BLE001
                        log.exception("dropped a %s message", _kind(x))
            if not lines:
                continue
            data = ("\n".join(lines) + "\n").encode("utf-8")
            try:
                self.f.write(data)
            except (BrokenPipeError, OSError, ValueError):
                self.broken = True
                log.info("the protocol pipe is closed (the window is gone)")
                if self.on_broken is not None:
                    self.on_broken()
                return
            self._last_write = time.monotonic()
            for x in batch:
                k = _kind(x)
                if k == "turn_start":
                    self._paced_from = -math.inf  # the turn's first output waits for no pace
                elif k in PACED:
                    self._paced_from = self._last_write
            self.writes += 1
            self.lines_written += len(lines)

    @staticmethod
    def _line(item) -> str:
        if isinstance(item, dict):
            return dumps(item)
        from kvinspect.core.trace.messages import to_line

        return dumps(to_line(item))


def coalesce(batch: list) -> list:
    """Merge neighbours that mean the same as one: tokens of one turn, contiguous step blocks, heartbeats.

    Order is kept; only adjacent items merge, so a reader sees the same stream, in fewer lines.
    """
    from kvinspect.core.trace.messages import Steps, Token

    out: list = []
    for item in batch:
        prev = out[-1] if out else None
        if isinstance(item, Token) and isinstance(prev, Token) and prev.turn == item.turn:
            out[-1] = Token(prev.turn, prev.text + item.text)
        elif (isinstance(item, Steps) and isinstance(prev, Steps) and prev.first + prev.n == item.first
              and prev.cols.keys() == item.cols.keys()):
            cols = {k: np.concatenate([prev.cols[k], item.cols[k]]) for k in prev.cols}
            out[-1] = Steps(prev.first, prev.n + item.n, cols)
        elif isinstance(item, dict) and item.get("type") == "heartbeat":
            out = [x for x in out if not (isinstance(x, dict) and x.get("type") == "heartbeat")]
            out.append(item)
        else:
            out.append(item)
    return out
