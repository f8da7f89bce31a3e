"""Viewer and follow modes at scale: what a user waits for, and whether the window stays responsive.

On a synthetic 100k-step × 64-layer trace (benchmarks/trace_size.py's generator), in one
process, offscreen, window 1280×800:

* **open**: File → Open (read off the GUI thread) until the trace is on screen, and the
  longest gap of a 10 ms GUI-thread timer meanwhile (how long the window was frozen);
  baseline: the same read done on the GUI thread (``read_trace`` directly), i.e. what a
  naive viewer would freeze for.
* **replay**: one slider move (``set_step`` + full refresh, every panel) at random steps,
  interleaved with a baseline refresh of the whole trace at rest (``step=None``).
* **follow**: a writer thread appends the same trace chunk by chunk (one ``steps`` line
  every 0.5 s of simulated time, written at 20 chunks/s); reported: the latency from a
  chunk's write to the window's record holding it, and the longest GUI-thread gap.

Nothing is asserted; the figures are printed (median of repeats)::

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/viewer.py [--steps 100000 --layers 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
_TMP = Path(tempfile.mkdtemp(prefix="kvinspect-bench-viewer-"))
os.environ.setdefault("KVINSPECT_DATA_DIR", str(_TMP / "data"))
os.environ.setdefault("KVINSPECT_CONFIG_DIR", str(_TMP / "config"))

import numpy as np  # noqa: E402
from PySide6 import QtCore  # noqa: E402


class GapMeter(QtCore.QObject):
    """A 10 ms GUI-thread timer; ``max_gap`` is the longest the event loop kept it waiting."""

    def __init__(self):
        super().__init__()
        self.timer = QtCore.QTimer(self)
        self.timer.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.last = None
        self.gaps: list[float] = []

    def start(self):
        self.gaps, self.last = [], time.perf_counter()
        self.timer.start()

    def stop(self) -> float:
        self.timer.stop()
        return max(self.gaps, default=0.0)

    def p99(self) -> float:
        return float(np.percentile(self.gaps, 99)) if self.gaps else 0.0

    def _tick(self):
        now = time.perf_counter()
        self.gaps.append(now - self.last)
        self.last = now


def wait(app, until, timeout=600.0):
    end = time.time() + timeout
    while not until():
        app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents, 5)
        if time.time() > end:
            raise TimeoutError
        time.sleep(0.001)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--moves", type=int, default=30, help="slider moves measured")
    args = ap.parse_args()

    from trace_size import synthesise

    from kvinspect.core.settings import Settings
    from kvinspect.core.trace.tracefile import read_trace
    from kvinspect.gui.app import create

    path = _TMP / "big" / "trace.jsonl"
    path.parent.mkdir()
    synthesise(path, args.steps, args.layers, 20, 1024, 25.0, 0.5)
    size = path.stat().st_size
    s = Settings()
    s.window.width, s.window.height = 1280, 800
    app, win = create(settings=s, persist=False)
    wait(app, lambda: win.isVisible())
    meter = GapMeter()
    print(f"trace: {args.steps:,} steps × {args.layers} layers, {size / 1e6:.1f} MB; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

    # -- open: background read vs the same read on the GUI thread, interleaved ---------------------
    opened, gaps, direct = [], [], []
    for _ in range(args.repeats):
        win.back_to_live()
        meter.start()
        t0 = time.perf_counter()
        win.open_trace(str(path))
        wait(app, lambda: win.viewer.mode == "view")
        opened.append(time.perf_counter() - t0)
        gaps.append(meter.stop())
        t0 = time.perf_counter()
        read_trace(path)  # what the GUI thread would be blocked for without the background read
        direct.append(time.perf_counter() - t0)
    print(f"open:   on screen after {statistics.median(opened):.2f} s (median of {args.repeats}); longest GUI "
          f"freeze meanwhile {1000 * statistics.median(gaps):.0f} ms; baseline read on the GUI thread "
          f"{statistics.median(direct):.2f} s (freeze ratio {statistics.median(gaps) / statistics.median(direct):.2f})")

    # -- replay: one slider move vs a refresh at rest, interleaved ---------------------------------
    rng = np.random.default_rng(0)
    rec = win.record
    moves, rests = [], []
    for k in rng.integers(0, rec.n_steps, args.moves):
        t0 = time.perf_counter()
        win.viewer.set_step(int(k))
        app.processEvents()
        moves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        win.refresh(force=True)
        app.processEvents()
        rests.append(time.perf_counter() - t0)
    print(f"replay: one slider move (every panel at the step) {1000 * statistics.median(moves):.1f} ms median, "
          f"{1000 * max(moves):.1f} ms max; forced refresh at rest {1000 * statistics.median(rests):.1f} ms "
          f"(ratio {statistics.median(moves) / statistics.median(rests):.2f})")

    # -- follow: a writer appends the file chunk by chunk -----------------------------------------
    lines = path.read_bytes().split(b"\n")
    chunks, cur = [], []
    for ln in lines:
        if not ln:
            continue
        cur.append(ln + b"\n")
        if ln.startswith(b'{"type":"steps"'):
            chunks.append(b"".join(cur))
            cur = []
    if cur:
        chunks.append(b"".join(cur))
    target = _TMP / "follow" / "trace.jsonl"
    target.parent.mkdir()
    win.back_to_live()
    win.follow_trace(str(target.parent))
    latencies, written = [], []
    stop = threading.Event()

    def writer():
        with target.open("wb") as f:
            for c in chunks[: min(len(chunks), 400)]:
                if stop.is_set():
                    return
                f.write(c)
                f.flush()
                written.append((time.perf_counter(), c.count(b'{"type":"steps"')))
                time.sleep(0.05)

    meter.start()
    th = threading.Thread(target=writer, daemon=True)
    th.start()
    seen_chunks = 0
    n_expected = None
    t_end = time.time() + 120
    while th.is_alive() or (win.viewer.record is not None and seen_chunks < len(written)):
        app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents, 5)
        r = win.viewer.record
        if r is not None:
            with r.lock:
                n = r.n_steps
            # chunks whose last step is now in the record
            for i, (t_w, _) in enumerate(written):
                if i < seen_chunks:
                    continue
                want = _steps_through(chunks, i)
                if n >= want:
                    latencies.append(time.perf_counter() - t_w)
                    seen_chunks = i + 1
                else:
                    break
            n_expected = n
        if time.time() > t_end:
            break
        time.sleep(0.002)
    stop.set()
    gap = meter.stop()
    lat = statistics.median(latencies)
    print(f"follow: {len(latencies)} chunks; write → in the window's record {1000 * lat:.0f} "
          f"ms median, {1000 * max(latencies):.0f} ms max (poll every 400 ms); longest GUI freeze "
          f"{1000 * gap:.0f} ms (99th percentile of a 10 ms timer's gaps {1000 * meter.p99():.0f} ms); "
          f"{n_expected:,} steps read")
    win.close()
    return 0


_cum: list[int] = []


def _steps_through(chunks, i: int) -> int:
    """Steps in the file once chunk ``i`` is written."""
    import json

    while len(_cum) <= i:
        c = chunks[len(_cum)]
        n = sum(json.loads(ln)["n"] for ln in c.split(b"\n") if ln.startswith(b'{"type":"steps"'))
        _cum.append((_cum[-1] if _cum else 0) + n)
    return _cum[i]


if __name__ == "__main__":
    sys.exit(main())
