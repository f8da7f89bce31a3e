"""The Tokens panel at 100k tokens: the view model, the layout, and one frame (goal: a frame ≤ 16 ms).

A synthetic record shaped like a long hybrid-model chat (48 layers, 5 sliding in 6, window
4096; 20 turns of 4,000 prompt + 1,000 reply tokens = 100k tokens, 20k forward passes), with
ids recorded the way the turn pipeline writes them. Measured, interleaved round by round,
median of the rounds, offscreen at 1000 × 560:

* ``token_view``: the cells and their states at the last step (what a slider move costs);
* ``layout``: wrapping the cells at the panel's width (a resize, or a new view);
* ``frame``: one paint of the canvas after scrolling to a random place (what a scroll costs);
* ``frame @1k``: the same panel painting a 1,000-token chat (enough to fill the viewport): the
  baseline. Drawing only what is visible should make the 100k frame cost about the same.

Wall and CPU time are printed (a shared machine stretches wall time; the ratio is of CPU time). Usage:
``QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/tokens_view.py [--tokens N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from PySide6 import QtWidgets  # noqa: E402


def synthetic_record(n_tokens: int, n_layers: int = 48, turns: int = 20, window: int = 4096):
    from kvinspect.core.tokens.ids import pack_ids
    from kvinspect.core.trace.record import TraceRecord, TurnRecord

    kinds = ["sliding" if (i % 6) != 5 else "full" for i in range(n_layers)]
    header = {"layers": [{"index": i, "config_attention": k, "window": window if k == "sliding" else None}
                         for i, k in enumerate(kinds)]}
    rec = TraceRecord(n_layers, header)
    per = n_tokens // turns
    reply = per // 5
    rng = np.random.default_rng(0)
    sliding = np.array([k == "sliding" for k in kinds])
    seq: list[int] = []
    prev = None
    known: set[int] = set()
    step = 0
    for u in range(turns):
        prompt = seq + rng.integers(0, 30_000, per - reply).tolist()
        gen = rng.integers(0, 30_000, reply).tolist()
        before = len(seq)
        n = 1 + len(gen) - 1  # prefill + one forward per fed reply token (the last is never fed)
        seen = before + (per - reply) + np.arange(n)
        stored = np.where(sliding[None, :], np.minimum(seen[:, None], window - 1), seen[:, None])
        rec.append_columns({
            "turn": np.full(n, u, np.int32), "t": np.arange(n, dtype=np.float64),
            "cache_id": np.ones(n, np.int32),
            "q_len": np.concatenate([[per - reply], np.ones(n - 1)]).astype(np.int32),
            "use_cache": np.ones(n, np.int8),
            "seen": np.repeat(seen[:, None], n_layers, 1).astype(np.int32), "stored": stored.astype(np.int32),
        })
        t = TurnRecord(index=u, status="ok", first_step=step, end_step=step + n, prompt_tokens=len(prompt),
                       new_tokens=len(gen))
        t.ids = pack_ids(prompt, gen, prev=prev, known=known, decode=lambda ids: f"w{ids[0] % 997}")
        rec.add_turn(t)
        prev = (u, prompt + gen)
        seq = prompt + gen[:-1]
        step += n
    return rec


def timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from kvinspect.core.tokens.states import token_view
    from kvinspect.gui.panels.tokens_panel import TokensPanel

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    big = synthetic_record(a.tokens)
    small = synthetic_record(1_000, turns=2)
    panels = {}
    for name, rec in (("big", big), ("small", small)):
        p = TokensPanel()
        p.resize(1000, 560)
        p.show()
        app.processEvents()
        p.render(rec)
        app.processEvents()
        panels[name] = p
    view = panels["big"].view
    print(f"{len(view):,} tokens, {big.n_steps:,} steps, {big.n_layers} layers; "
          f"{len(panels['big'].canvas._row_start) - 1:,} rows at 1000 px")
    rng = np.random.default_rng(1)
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in ("token_view", "layout", "frame", "frame @1k")}
    for _ in range(a.rounds):
        res["token_view"].append(timed(lambda: token_view(big)))
        canvas = panels["big"].canvas

        def layout():
            canvas._layout_key = None
            canvas._relayout()
        res["layout"].append(timed(layout))
        cell = int(rng.integers(0, len(view)))

        def frame(c=canvas, cell=cell):
            c.scroll_to_cell(cell)
            c.viewport().grab()
        res["frame"].append(timed(frame))
        sc = panels["small"].canvas
        res["frame @1k"].append(timed(lambda: (sc.scroll_to_cell(0), sc.viewport().grab())))
    base = statistics.median(c for _, c in res["frame @1k"])
    print(f"{'':12} {'wall ms':>9} {'cpu ms':>9} {'cpu vs frame @1k':>17}")
    for k, v in res.items():
        w = statistics.median(x for x, _ in v) * 1e3
        c = statistics.median(y for _, y in v) * 1e3
        print(f"{k:12} {w:9.2f} {c:9.2f} {c / (base * 1e3):16.2f}×")
    print(f"cells painted in the last frame: {panels['big'].canvas.painted_cells:,} of {len(view):,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
