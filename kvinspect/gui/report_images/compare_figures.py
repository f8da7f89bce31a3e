"""Compare plots from a compare.json document: the caches of two environments overlaid, latency and memory per
turn, stress, prompt-length sweep.

``render(input_path, out_dir, formats)`` is the headless entry (run in a child process by
:func:`kvinspect.child_render.render_in_child`); :func:`build_figures` returns the same figures as widgets, for the
Compare window to embed. Each configuration keeps one colour in every figure (:data:`.theme.CONFIG_COLORS`);
byte axes use the project's one unit scale (:func:`kvinspect.core.units.byte_scale`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets  # binding first, then pyqtgraph

from kvinspect.core.errors import exc_line
from kvinspect.core.units import byte_scale
from kvinspect.gui.base import theme as th

SYMBOLS = ("o", "s", "t", "d", "star", "p", "h", "t1", "+", "x")
SIZE = (1500, 600)
LINE_STYLES = (QtCore.Qt.PenStyle.SolidLine, QtCore.Qt.PenStyle.DashLine, QtCore.Qt.PenStyle.DotLine,
               QtCore.Qt.PenStyle.DashDotLine)


def config_style(index: int) -> tuple[str, str]:
    return th.CONFIG_COLORS[index % len(th.CONFIG_COLORS)], SYMBOLS[index % len(SYMBOLS)]


def _plot(layout: pg.GraphicsLayoutWidget, title: str, left: str, bottom: str, units: str | None = None,
          log_x: bool = False) -> pg.PlotItem:
    p = layout.addPlot(title=title)
    p.showGrid(x=True, y=True, alpha=0.25)
    for name in ("left", "bottom"):
        p.getAxis(name).setStyle(maxTickLevel=1)  # major and minor grid lines; a third level is just noise
    p.setLabel("left", left, units=units)
    p.setLabel("bottom", bottom)
    if log_x:
        p.setLogMode(x=True, y=False)
    return p


def _pen(index: int, width: float = 2.5):
    # Line styles cycle too: configurations with identical figures (dynamic vs recreate KV) stay visible.
    color, _ = config_style(index)
    return pg.mkPen(color, width=width, style=LINE_STYLES[index % len(LINE_STYLES)])


def _symbol_size(index: int) -> int:
    return max(6, 13 - 2 * (index % 4))


def _curve(p: pg.PlotItem, x, y, lo, hi, index: int, name: str, offset: float = 0.0):
    color, symbol = config_style(index)
    x = np.asarray(x, dtype=np.float64) + offset
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(y)
    if not ok.any():
        return None
    item = p.plot(x[ok], y[ok], pen=_pen(index), symbol=symbol, symbolSize=_symbol_size(index), symbolBrush=color,
                  symbolPen=pg.mkPen(color), name=name)
    if lo is not None and hi is not None:
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        m = ok & np.isfinite(lo) & np.isfinite(hi) & ((hi - lo) > 0)
        if m.any():
            p.addItem(pg.ErrorBarItem(x=x[m], y=y[m], top=hi[m] - y[m], bottom=y[m] - lo[m], beam=0.08,
                                      pen=pg.mkPen(color, width=1.5)))
    return item


def _stat(row: dict, key: str) -> tuple[float, float, float]:
    st = row.get(key)
    if not st:
        return (np.nan, np.nan, np.nan)
    return (st["median"], st["min"], st["max"])


def _turn_ticks(p: pg.PlotItem, n: int) -> None:
    step = max(1, n // 12)
    p.getAxis("bottom").setTicks([[(i, str(i)) for i in range(1, n + 1, step)]])
    p.setXRange(0.6, n + 0.4, padding=0)


def _legend_row(w: pg.GraphicsLayoutWidget, entries: list[tuple[object, str]], colspan: int) -> None:
    """One legend under the plots, across all columns: it never covers data."""
    if not entries:
        return
    w.nextRow()
    leg = pg.LegendItem(colCount=min(len(entries), 6), labelTextSize="10pt")
    for item, name in entries:
        leg.addItem(item, name)
    w.addItem(leg, colspan=colspan)


def _from_zero(p: pg.PlotItem, minimum: float = 1e-9, below: float = 0.0) -> None:
    top = max(_max_y(p), minimum) * 1.08
    p.setYRange(-below * top, top, padding=0)


def _ran(data: dict) -> list[tuple[int, dict]]:
    return [(i, c) for i, c in enumerate(data["configs"]) if c.get("per_turn")]


def latency_figure(data: dict) -> pg.GraphicsLayoutWidget | None:
    ran = _ran(data)
    if not ran:
        return None
    w = pg.GraphicsLayoutWidget()
    a = _plot(w, "Time to first token per turn (median; bars: min–max over repeats; x: failed)", "TTFT", "turn", "s")
    b = _plot(w, "Turn latency per turn (median; bars: min–max over repeats; x: failed)", "turn latency", "turn",
              "s")
    n = max(len(c["per_turn"]) for _, c in ran)
    k = len(ran)
    entries = []
    for j, (i, c) in enumerate(ran):
        rows = c["per_turn"]
        x = [r["index"] + 1 for r in rows]
        off = (j - (k - 1) / 2) * min(0.08, 0.5 / k)  # side by side, so the bars do not hide each other
        for p, key in ((a, "ttft_s"), (b, "total_s")):
            m, lo, hi = zip(*(_stat(r, key) for r in rows))
            item = _curve(p, x, m, lo, hi, i, c["name"], off)
            if p is a and item is not None:
                entries.append((item, c["name"]))
        failed = [r["index"] + 1 + off for r in rows if r.get("failed")]
        if failed:
            color, _ = config_style(i)
            for p in (a, b):
                p.addItem(pg.ScatterPlotItem(failed, [0.0] * len(failed), symbol="x", size=16,
                                             pen=pg.mkPen(color, width=3), brush=pg.mkBrush(color)))
    any_failed = any(r.get("failed") for _, c in ran for r in c["per_turn"])
    for p in (a, b):
        _turn_ticks(p, n)
        _from_zero(p, below=0.04 if any_failed else 0.0)  # room for the failure marks drawn at 0
    _legend_row(w, entries, 2)
    return w


def memory_figure(data: dict) -> pg.GraphicsLayoutWidget | None:
    ran = _ran(data)
    if not ran:
        return None
    w = pg.GraphicsLayoutWidget()
    kv_max = max((r["peak_kv_bytes"] or 0 for _, c in ran for r in c["per_turn"]), default=0)
    mem_max = max((r["peak_memory_bytes"] or 0 for _, c in ran for r in c["per_turn"]), default=0)
    kdiv, kunit = byte_scale(kv_max)
    mdiv, munit = byte_scale(mem_max)
    a = _plot(w, "KV cache per turn (peak bytes of the K/V tensors)", f"KV cache ({kunit})", "turn")
    b = _plot(w, f"{data.get('memory_label', 'peak memory')} per turn", munit, "turn")
    n = max(len(c["per_turn"]) for _, c in ran)
    entries = []
    for i, c in ran:
        rows = c["per_turn"]
        x = [r["index"] + 1 for r in rows]
        kv = [r["peak_kv_bytes"] / kdiv if r["peak_kv_bytes"] is not None else np.nan for r in rows]
        mem = [r["peak_memory_bytes"] / mdiv if r["peak_memory_bytes"] else np.nan for r in rows]
        item = _curve(a, x, kv, None, None, i, c["name"])
        _curve(b, x, mem, None, None, i, c["name"])
        if item is not None:
            entries.append((item, c["name"]))
    for p in (a, b):
        _turn_ticks(p, n)
        p.getAxis("left").enableAutoSIPrefix(False)
        # From zero: a process-wide counter zoomed to its last digits would suggest differences that are not there.
        _from_zero(p)
    _legend_row(w, entries, 2)
    return w


def stress_figure(data: dict) -> pg.GraphicsLayoutWidget | None:
    st = data.get("stress")
    if not st or not st.get("configs"):
        return None
    index = {c["name"]: i for i, c in enumerate(data["configs"])}
    w = pg.GraphicsLayoutWidget()
    p = _plot(w, f"Long conversation: tokens after each turn, until failure (x) or {st['max_turns']} turns",
              "conversation tokens", "turn")
    p.getAxis("left").enableAutoSIPrefix(False)
    n = 1
    entries = []
    for c in st["configs"]:
        i = index.get(c["name"], 0)
        color, _ = config_style(i)
        turns = [t for t in c["run"]["turns"] if t["status"] == "ok"]
        x = [t["index"] + 1 for t in turns]
        y = [t["prompt_tokens"] + t["new_tokens"] for t in turns]
        item = _curve(p, x, y, None, None, i, c["name"])
        if item is not None:
            entries.append((item, c["name"]))
        n = max(n, len(c["run"]["turns"]))
        if c.get("failed_at_turn"):
            p.addItem(pg.ScatterPlotItem([c["failed_at_turn"]], [c["tokens_at_failure"]], symbol="x", size=20,
                                         pen=pg.mkPen(color, width=3), brush=pg.mkBrush(color)))
        cap = c.get("max_cache_len")
        if cap:
            p.addItem(pg.InfiniteLine(pos=cap, angle=0, pen=_pen(i, 1.2), label=f"{c['name']} max_cache_len {cap}",
                                      labelOpts={"color": color, "position": 0.12}))
    mpe = next((c.get("max_position_embeddings") for c in st["configs"] if c.get("max_position_embeddings")), None)
    if mpe and _max_y(p) > 0.5 * mpe:
        p.addItem(pg.InfiniteLine(pos=mpe, angle=0, pen=pg.mkPen(th.NEUTRAL, width=1.2,
                                                                  style=QtCore.Qt.PenStyle.DashLine),
                                  label=f"max_position_embeddings {mpe}", labelOpts={"color": th.NEUTRAL,
                                                                                     "position": 0.85}))
    _turn_ticks(p, n)
    _from_zero(p)
    _legend_row(w, entries, 1)
    return w


def lengths_figure(data: dict) -> pg.GraphicsLayoutWidget | None:
    lg = data.get("lengths")
    if not lg or not lg.get("configs"):
        return None
    index = {c["name"]: i for i, c in enumerate(data["configs"])}
    w = pg.GraphicsLayoutWidget()
    a = _plot(w, "TTFT by prompt length (median; bars: min–max)", "TTFT", "prompt tokens (log scale)", "s", True)
    b = _plot(w, "Turn latency by prompt length", "turn latency", "prompt tokens (log scale)", "s", True)
    c3 = _plot(w, "Decode tokens/s by prompt length", "tokens/s", "prompt tokens (log scale)", None, True)
    entries = []
    k = len(lg["configs"])
    for j, c in enumerate(lg["configs"]):
        i = index.get(c["name"], 0)
        pts = [q for q in c["points"] if q.get("prompt_tokens")]
        if not pts:
            continue
        # Side by side (a few percent apart on the log axis) so the bars do not hide each other.
        x = [q["prompt_tokens"] * 10 ** ((j - (k - 1) / 2) * 0.012) for q in pts]
        for p, key in ((a, "ttft_s"), (b, "total_s"), (c3, "decode_tokens_per_s")):
            m, lo, hi = zip(*(_stat(q, key) for q in pts))
            item = _log_curve(p, x, m, lo, hi, i, c["name"])
            if p is a and item is not None:
                entries.append((item, c["name"]))
    # Ticks at the measured lengths only: pyqtgraph's log axis would crowd 4·10¹ 5·10¹ … labels together.
    lens = sorted({q["prompt_tokens"] for c in lg["configs"] for q in c["points"] if q.get("prompt_tokens")})
    for p in (a, b, c3):
        _from_zero(p)
        if lens:
            p.getAxis("bottom").setTicks([[(float(np.log10(n)), str(n)) for n in lens], []])
            pad = 0.08 * max(np.log10(lens[-1] / lens[0]), 1.0)
            p.setXRange(np.log10(lens[0]) - pad, np.log10(lens[-1]) + pad, padding=0)
    c3.getAxis("left").enableAutoSIPrefix(False)
    _legend_row(w, entries, 3)
    return w


def _log_curve(p: pg.PlotItem, x, y, lo, hi, index: int, name: str):
    # A log-x plot takes log10 of its curves' x itself; error bars are not transformed, so place them by hand.
    color, symbol = config_style(index)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(y)
    if not ok.any():
        return None
    item = p.plot(x[ok], y[ok], pen=_pen(index), symbol=symbol, symbolSize=_symbol_size(index), symbolBrush=color,
                  symbolPen=pg.mkPen(color), name=name)
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    m = ok & np.isfinite(lo) & np.isfinite(hi) & ((hi - lo) > 0)
    if m.any():
        p.addItem(pg.ErrorBarItem(x=np.log10(x[m]), y=y[m], top=hi[m] - y[m], bottom=y[m] - lo[m], beam=0.03,
                                  pen=pg.mkPen(color, width=1.5)))
    return item


def _max_y(p: pg.PlotItem) -> float:
    top = 0.0
    for item in p.listDataItems():
        _, y = item.getData()
        if y is not None and len(y):
            finite = y[np.isfinite(y)]
            if len(finite):
                top = max(top, float(finite.max()))
    for item in p.items:
        if isinstance(item, pg.ErrorBarItem):
            o = item.opts
            if o.get("y") is not None and o.get("top") is not None:
                top = max(top, float(np.nanmax(np.asarray(o["y"]) + np.asarray(o["top"]))))
        elif isinstance(item, pg.ScatterPlotItem):
            _, y = item.getData()
            if y is not None and len(y):
                top = max(top, float(np.nanmax(y)))
    return top


def cache_figure(data: dict) -> pg.GraphicsLayoutWidget | None:
    """Both sides' stored K/V rows per step, per layer kind, overlaid: where two environments part shows at a glance.

    One row per compared configuration, one plot per layer kind (its first layer); side A solid, side B
    dashed, each in its own colour, with side A's turn starts as faint vertical lines.
    """
    diffs = [d for d in data.get("diff") or [] if d.get("series")]
    if not diffs:
        return None
    w = pg.GraphicsLayoutWidget()
    entries: list[tuple[object, str]] = []
    cols = max(len(d["series"]) for d in diffs)
    names: list[str] = []
    for r, d in enumerate(diffs):
        if r:
            w.nextRow()
        na, nb = (f"{d[k]['name']} (transformers {d[k].get('transformers') or '?'})" for k in ("a", "b"))
        for s in d["series"]:
            p = _plot(w, f"{d['config']}: {s['kind']} layers (layer {s['layer']}), stored K/V rows per step",
                      "stored rows", "step")
            p.getAxis("left").enableAutoSIPrefix(False)
            for t0 in s.get("turn_starts_a") or []:
                p.addItem(pg.InfiniteLine(pos=t0, angle=90, pen=pg.mkPen(th.NEUTRAL, width=0.8,
                                                                         style=QtCore.Qt.PenStyle.DotLine)))
            for side, name, k, style in (("a", na, 0, QtCore.Qt.PenStyle.SolidLine),
                                         ("b", nb, 1, QtCore.Qt.PenStyle.DashLine)):
                y = np.asarray(s[side], dtype=np.float64)
                y[y < 0] = np.nan  # not recorded (a lost chunk) or no token axis
                x = np.arange(len(y), dtype=np.float64) * s.get("stride", 1)
                color, _ = config_style(k)
                item = p.plot(x, y, pen=pg.mkPen(color, width=3.0 if k == 0 else 2.2, style=style), name=name,
                              connect="finite")
                if name not in names:
                    names.append(name)
                    entries.append((item, name))
            _from_zero(p)
    _legend_row(w, entries, cols)
    return w


FIGURES = (
    ("latency_per_turn", latency_figure),
    ("memory_per_turn", memory_figure),
    ("stress", stress_figure),
    ("prompt_lengths", lengths_figure),
    ("cache", cache_figure),
)


def build_figures(data: dict, background: str = "w",
                  foreground: str = "k") -> list[tuple[str, pg.GraphicsLayoutWidget]]:
    """Every figure this comparison has data for, as ``(name, widget)``.

    White for reports by default; a window passes its theme's colours. pyqtgraph reads these
    from global options when items are created, so they are set for the build and restored after.
    """
    keys = ("antialias", "background", "foreground")
    saved = {k: pg.getConfigOption(k) for k in keys}
    pg.setConfigOptions(antialias=True, background=background, foreground=foreground)
    try:
        out = []
        for name, fn in FIGURES:
            widget = fn(data)
            if widget is not None:
                out.append((name, widget))
        return out
    finally:
        pg.setConfigOptions(**saved)


def render(input_path, out_dir, formats=("png",)):
    """Headless entry: write ``<name>.png`` (and ``.svg``) per figure into ``out_dir``."""
    from pyqtgraph.exporters import ImageExporter, SVGExporter

    data = json.loads(Path(input_path).read_text(encoding="utf-8"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    notes: list[str] = []
    app = QtWidgets.QApplication.instance()
    for name, widget in build_figures(data):
        # Export only from a shown, laid-out widget: before show() the scene has its default size.
        widget.resize(*SIZE)
        widget.show()
        app.processEvents()
        if "png" in formats:
            exp = ImageExporter(widget.scene())
            exp.parameters()["width"] = SIZE[0]
            path = out / f"{name}.png"
            exp.export(str(path))
            files.append(path)
        if "svg" in formats:
            path = out / f"{name}.svg"
            try:
                SVGExporter(widget.scene()).export(str(path))
                files.append(path)
            except Exception as exc:  # noqa: BLE001 - SVG breaks on Qt >= 6.11 (pyqtgraph#3485)
                notes.append(f"{name}.svg skipped: {exc_line(exc)}")
        widget.close()
        widget.deleteLater()
    if not files and not notes:
        notes.append("no plots: no configuration produced measured turns")
    return files, notes
