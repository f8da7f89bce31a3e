"""Report images from a trace, rendered headless: ``cache`` and ``memory`` (PNG, and SVG where Qt allows).

Run through :func:`kvinspect.child_render.render_in_child` (``kind="trace"``) in a child process on Qt's
offscreen platform, or called directly where a QApplication exists (tests, the GUI). Figures
are pyqtgraph layouts on a white background (GitHub shows report images on white and on
dark pages alike), exported from a shown, sized widget: exporting before ``show()`` gives
the default 640×480 (qt-and-ci.md §7). They speak the window's vocabulary: its colours
(:mod:`kvinspect.gui.base.theme`, light variants), its :class:`~kvinspect.gui.graphics.axes.StepAxis` and its byte units.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pyqtgraph.exporters  # noqa: F401  (registers pg.exporters)

# PySide6 before pyqtgraph, so pyqtgraph binds to it rather than to a PyQt that may be installed.
from PySide6 import QtCore, QtGui, QtWidgets  # noqa: I001

from kvinspect.core.cache import layer_kinds
from kvinspect.core.detect.events import Event
from kvinspect.core.errors import exc_line
from kvinspect.core.text_safety import terminal_text
from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.trace.tracefile import read_trace
from kvinspect.core.units import byte_scale
from kvinspect.gui.base import theme as th
from kvinspect.gui.graphics.axes import LAYER_LABEL_GAP, StepAxis, layer_ticks

EXPORT_WIDTH = 1600
#: Curves longer than this are peak-downsampled (min and max per bin survive).
MAX_POINTS = 4000
#: Widget size the figures are laid out at; the export scales it to EXPORT_WIDTH.
FIGURE_SIZE = (1000, 650)
#: The window's light theme: reports are drawn on white.
R = th.REPORT
TURN_SHADE = (0, 0, 0, 14)
FONT_PT = 11
MAX_LAYER_LABELS = 16  # on the heatmap's layer axis


def render(input_path: str | os.PathLike, out_dir: str | os.PathLike,
           formats: tuple[str, ...] = ("png", "svg")) -> tuple[list[Path], list[str]]:
    """Render ``cache`` and ``memory`` figures of a trace into ``out_dir``.

    Parameters
    ----------
    input_path
        A trace file or a folder holding ``trace.jsonl``.
    out_dir
        Where ``cache.png``, ``memory.png`` (and ``.svg``) go.
    formats
        ``"png"`` and/or ``"svg"``.

    Returns
    -------
    tuple
        ``(files, notes)``: the files written, and one line per image that was skipped.
    """
    record = read_trace(input_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # pyqtgraph reads these global options when items are made: set for the figures, restored after,
    # so a window in the same process keeps its own (a test's window lines drew antialiased after one).
    keys = ("background", "foreground", "antialias", "imageAxisOrder")
    saved = {k: pg.getConfigOption(k) for k in keys}
    pg.setConfigOptions(background=R.plot_bg, foreground=R.text, antialias=True, imageAxisOrder="row-major")
    try:
        return _render(record, out, formats)
    finally:
        pg.setConfigOptions(**saved)


def _render(record, out: Path, formats) -> tuple[list[Path], list[str]]:
    files: list[Path] = []
    notes: list[str] = []
    for name, build in (("cache", cache_figure), ("memory", memory_figure)):
        win = build(record)
        _downsample(win)
        win.resize(*FIGURE_SIZE)
        win.show()
        QtWidgets.QApplication.processEvents()
        # A layout wider or taller than the widget would be cut off by the exporter: grow to fit.
        need = win.ci.effectiveSizeHint(QtCore.Qt.SizeHint.MinimumSize)
        if need.width() > win.width() or need.height() > win.height():
            win.resize(max(win.width(), int(need.width()) + 2), max(win.height(), int(need.height()) + 2))
            QtWidgets.QApplication.processEvents()
        for fmt in formats:
            path = out / f"{name}.{fmt}"
            try:
                export(win, path, fmt)
                files.append(path)
            except Exception as exc:  # noqa: BLE001 - an image format the Qt stack can't do is skipped, not fatal
                notes.append(f"{path.name} skipped: {fmt.upper()} export failed on this Qt stack "
                             f"({exc_line(exc)[:160]}); the PNG is complete")
        win.close()
        win.deleteLater()
    QtWidgets.QApplication.processEvents()
    return files, notes


def _downsample(win: pg.GraphicsLayoutWidget, points: int = MAX_POINTS) -> None:
    """Peak-downsample long curves: a 1600-px image shows no more, and the SVG stays small."""
    for item in win.scene().items():
        if isinstance(item, pg.PlotDataItem) and item.xData is not None and len(item.xData) > points:
            item.setDownsampling(ds=int(np.ceil(len(item.xData) / points)), auto=False, method="peak")
    for item in win.scene().items():
        if isinstance(item, pg.FillBetweenItem):
            item.updatePath()  # it does not follow a downsampling change by itself


def export(win: pg.GraphicsLayoutWidget, path: Path, fmt: str) -> None:
    """Write one figure; PNG at :data:`EXPORT_WIDTH` pixels wide, SVG through pyqtgraph's exporter."""
    if fmt == "png":
        exp = pg.exporters.ImageExporter(win.scene())
        exp.parameters()["width"] = EXPORT_WIDTH
        exp.parameters()["antialias"] = True
        exp.export(str(path))
    elif fmt == "svg":
        pg.exporters.SVGExporter(win.scene()).export(str(path))
    else:
        raise ValueError(f"unknown image format {fmt!r}")
    if not path.is_file() or path.stat().st_size == 0:
        raise RuntimeError("the exporter wrote nothing")


# -- shared pieces ------------------------------------------------------------------------------------

def _step_plot(win: pg.GraphicsLayoutWidget, row: int) -> pg.PlotItem:
    return win.addPlot(row=row, col=0, axisItems={"bottom": StepAxis("bottom")})


def _font(pt: int = FONT_PT, bold: bool = False) -> QtGui.QFont:
    f = QtGui.QFont()
    f.setPointSize(pt)
    f.setBold(bold)
    return f


def _style_plot(p: pg.PlotItem, left: str, bottom: str | None) -> None:
    for name in ("left", "bottom"):
        ax = p.getAxis(name)
        ax.setTickFont(_font(FONT_PT - 1))
        ax.setPen(pg.mkPen(R.plot_fg))
        ax.setTextPen(pg.mkPen(R.text))
    p.getAxis("left").setWidth(96)  # the same on every row, so linked x axes line up
    p.setLabel("left", left, **{"font-size": f"{FONT_PT}pt"})
    if bottom:
        p.setLabel("bottom", bottom, **{"font-size": f"{FONT_PT}pt"})
    p.showGrid(x=False, y=True, alpha=0.15)


def _title(win: pg.GraphicsLayoutWidget, record: TraceRecord, what: str) -> None:
    h = record.header
    m = h.get("model") or {}
    s = h.get("session") or {}
    # An observed program chose its own cache (no cache_impl in the header): say nothing rather than "None".
    cache = f" · cache {s['cache_impl']}" if s.get("cache_impl") else ""
    n = len(record.turns)
    sub = (f"{m.get('name') or m.get('spec') or 'model'} · policy {s.get('policy') or '?'}{cache} · "
           f"{n} turn{'' if n == 1 else 's'} · {record.n_steps} forward passes · "
           f"transformers {(h.get('versions') or {}).get('transformers') or '?'} · {h.get('device') or '?'}")
    win.addLabel(f"<span style='font-size:15pt; font-weight:600'>{what}</span><br>"
                 f"<span style='font-size:10pt; color:{R.dim_text}'>{_esc(sub)}</span>", row=0, col=0)


def _esc(s: str) -> str:
    """Trace text for a figure's rich-text label: no markup, and no control an SVG's XML cannot hold."""
    return terminal_text(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _turns(p: pg.PlotItem, record: TraceRecord, labels: bool, y_label: float | None = None) -> None:
    """Shade every other turn and mark each turn's first step; label them on the top plot."""
    n = record.n_steps
    every = _turn_stride(record)
    # Labels need room: a dozen at most once turns are many (each one word wide at 1600 px).
    label_every = 1 if every == 1 else every * -(-MAX_TURN_MARKS // MAX_TURN_LABELS)
    for t in record.turns:
        if t.index % every:
            continue  # a long session: every k-th turn is marked (items cost the exporter per item)
        x0 = t.first_step
        x1 = t.end_step if t.end_step > x0 else n
        if t.index % 2 == 1 and every == 1:
            region = pg.LinearRegionItem((x0 - 0.5, x1 - 0.5), movable=False, brush=pg.mkBrush(*TURN_SHADE),
                                         pen=pg.mkPen(None))
            region.setZValue(-20)
            p.addItem(region, ignoreBounds=True)
        if t.index:
            line = pg.InfiniteLine(x0 - 0.5, angle=90, pen=pg.mkPen(R.turn_line, width=1))
            p.addItem(line, ignoreBounds=True)
        if labels and t.index % label_every == 0:
            status = "" if t.status == "ok" else f" ({_esc(t.status)})"
            txt = pg.TextItem(f"turn {t.index + 1}{status}", color=R.text, anchor=(0, 0))
            txt.setFont(_font(FONT_PT - 1, bold=True))
            txt.setPos(x0, y_label if y_label is not None else 0)
            p.addItem(txt, ignoreBounds=True)


#: Turns marked one by one on a figure; beyond, every k-th (1,000 turns drew 15,000 items, and the
#: SVG exporter's cost is per item: 50 s for a 1,000-turn report; a 1600-px image shows no more).
MAX_TURN_MARKS = 60
MAX_TURN_LABELS = 12


def _turn_stride(record: TraceRecord) -> int:
    return max(1, -(-len(record.turns) // MAX_TURN_MARKS))


def _event_lines(p: pg.PlotItem, events: list[Event], labels: bool) -> None:
    """One dashed line per event step (several events at a step share it), labelled with the kinds."""
    by_step: dict[int, list[Event]] = {}
    for e in events:
        by_step.setdefault(e.step, []).append(e)
    for k, (step, evs) in enumerate(sorted(by_step.items())):
        worst = max(evs, key=lambda e: th.SEVERITY_ORDER.index(e.severity) if e.severity in th.SEVERITY_ORDER else 0)
        color = th.severity_color(worst.severity)
        label = None
        if labels:
            label = terminal_text(", ".join(dict.fromkeys(e.kind for e in evs)))  # plain text; a kind is the trace's
        line = pg.InfiniteLine(step, angle=90, pen=pg.mkPen(color, width=2, style=QtCore.Qt.PenStyle.DashLine),
                               label=label,
                               labelOpts={"position": 0.80 - 0.12 * (k % 4), "color": color, "anchors": [(0, 0.5), (0, 0.5)],
                                          "fill": pg.mkBrush(255, 255, 255, 220)})
        if label:
            line.label.setFont(_font(FONT_PT - 1))
        p.addItem(line, ignoreBounds=True)


def _draft_lines(p: pg.PlotItem, legend: pg.LegendItem, record: TraceRecord, y_top: float) -> None:
    """Where generate() cropped rejected drafts off the cache (assisted, prompt lookup): one thin line each,
    one legend entry, so the stored dips read as what they are, not as an eviction."""
    steps = sorted({s for t in record.turns for s, _n in t.rejected_drafts() if s < record.n_steps})
    if not steps:
        return
    xs = np.repeat(np.asarray(steps, dtype=np.float64), 2)
    ys = np.tile([0.0, y_top], len(steps))
    item = p.plot(xs, ys, connect="pairs",
                  pen=pg.mkPen(th.DRAFT_REJECTED_COLOR, width=1.2, style=QtCore.Qt.PenStyle.DashDotLine))
    rejected = sum(n for t in record.turns for _s, n in t.rejected_drafts())
    legend.addItem(item, f"{th.DRAFT_REJECTED_LABEL}: {rejected:,} draft tokens generate() cropped off the cache")


def _legend(win: pg.GraphicsLayoutWidget, row: int, columns: int) -> pg.LegendItem:
    """A legend in its own layout row: inside a plot it would hide data or the turn labels."""
    # LabelItem sizes render smaller than QFont sizes of the same pt: +2 keeps the legend as legible as the axes.
    legend = pg.LegendItem(colCount=columns, labelTextSize=f"{FONT_PT + 2}pt", horSpacing=28, frame=False)
    win.addItem(legend, row=row, col=0)
    return legend


def _no_steps(win: pg.GraphicsLayoutWidget) -> None:
    win.addLabel(f"<span style='font-size:13pt; color:{R.dim_text}'>No forward passes were recorded in this trace: "
                 "nothing to plot.</span>", row=1, col=0)


# -- cache figure -------------------------------------------------------------------------------------------

def cache_figure(record: TraceRecord) -> pg.GraphicsLayoutWidget:
    """Totals (Σ seen vs Σ stored) over a layers × steps heatmap of stored tokens, with kind bands."""
    win = pg.GraphicsLayoutWidget()
    win.ci.setSpacing(6)
    _title(win, record, "KV cache: tokens seen vs stored, per layer and step")
    n, L = record.n_steps, record.n_layers
    if not n or not L:
        _no_steps(win)
        return win
    x = np.arange(n, dtype=np.float64)
    seen = record.seen.astype(np.float64)
    stored = record.stored.astype(np.float64)
    seen[seen < 0] = np.nan
    stored[stored < 0] = np.nan

    legend = _legend(win, 1, 2)
    top = _step_plot(win, 2)
    _style_plot(top, f"tokens, Σ over {L} layers", None)
    tot_seen = np.nansum(seen, axis=1)
    tot_stored = np.nansum(stored, axis=1)
    # The window's pens: seen dashed, stored solid. Stored is a broad translucent band under the
    # dashed seen line: on full-attention layers the two coincide and both stay visible.
    stored_pen = QtGui.QColor(R.stored)
    stored_pen.setAlpha(90)
    stored_curve = top.plot(x, tot_stored, pen=pg.mkPen(stored_pen, width=7))
    seen_curve = top.plot(x, tot_seen, pen=pg.mkPen(R.seen, width=2.2, style=QtCore.Qt.PenStyle.DashLine))
    legend.addItem(seen_curve, "seen: tokens each layer has processed (Σ over layers)")
    legend.addItem(stored_curve, "stored: K/V rows the cache holds (Σ over layers)")
    y_top = max(float(np.nanmax(tot_seen)) if np.isfinite(tot_seen).any() else 1, 1) * 1.12
    top.setYRange(0, y_top, padding=0)
    _draft_lines(top, legend, record, y_top)
    _turns(top, record, labels=True, y_label=max(float(np.nanmax(tot_seen)), 1) * 1.11)
    _event_lines(top, record.events, labels=True)

    heat = _step_plot(win, 3)
    _style_plot(heat, "layer", "forward pass (step)")
    heat.setXLink(top)
    heat.showGrid(x=False, y=False)  # no lines over the heatmap; also lets the edge tick labels overflow
    vb = heat.getViewBox()
    vb.invertY(True)  # layer 0 on top, as in the tables
    band_w = max(n * 0.025, 1.0)
    img = pg.ImageItem(stored.T.astype(np.float32))  # row-major: rows = layers, columns = steps
    vmax = float(np.nanmax(stored)) if np.isfinite(stored).any() else 1.0
    cmap = pg.colormap.get("viridis")
    img.setColorMap(cmap)
    img.setLevels((0, max(vmax, 1)))
    img.setRect(QtCore.QRectF(-0.5, 0, n, L))
    heat.addItem(img)
    kinds = _layer_kinds(record)
    band = np.array([[_rgba(th.kind_color(k))] for k, _ in kinds], dtype=np.uint8)
    band_img = pg.ImageItem(band, levels=(0, 255))  # explicit: auto levels turn a one-kind band black
    band_img.setRect(QtCore.QRectF(-0.5 - band_w * 1.25, 0, band_w, L))
    heat.addItem(band_img)
    heat.setXRange(-0.5 - band_w * 1.3, n - 0.5, padding=0.01)
    heat.setYRange(0, L, padding=0)
    top.setXRange(-0.5 - band_w * 1.3, n - 0.5, padding=0.01)
    _layer_ticks(heat, L)
    for t in record.turns[_turn_stride(record)::_turn_stride(record)]:
        heat.addItem(pg.InfiniteLine(t.first_step - 0.5, angle=90,
                                     pen=pg.mkPen("#ffffff", width=2, style=QtCore.Qt.PenStyle.DashLine)),
                     ignoreBounds=True)
    _layer_event_marks(heat, record)
    win.ci.layout.setRowStretchFactor(2, 4)
    win.ci.layout.setRowStretchFactor(3, 6)

    bar = pg.ColorBarItem(values=(0, max(vmax, 1)), colorMap=cmap, orientation="horizontal", interactive=False,
                          width=14, label="stored tokens per layer (heatmap colour)")
    bar.getAxis("bottom").setTickFont(_font(FONT_PT - 1))
    win.addItem(bar, row=4, col=0)
    legend = " &nbsp; ".join(
        f"<span style='color:{th.kind_color(k)}; font-size:14pt'>■</span> {_esc(label)}"
        for k, label in dict.fromkeys(kinds))
    marks = " &nbsp; ".join(f"<span style='color:{c}'>▼</span> {s}" for s, c in th.SEVERITY_COLORS.items())
    win.addLabel(f"<span style='font-size:10pt'>Left strip, layer kind: {legend} &nbsp;&nbsp;|&nbsp;&nbsp; "
                 f"event markers: {marks} &nbsp;&nbsp;|&nbsp;&nbsp; dashed white: turn boundary</span>",
                 row=5, col=0)
    return win


def _layer_kinds(record: TraceRecord) -> list[tuple[str, str]]:
    """(kind, legend label) per layer: the kinds the window shows (:func:`~kvinspect.core.cache.layer_kinds.layer_kinds`)."""
    out = []
    for kind, win in zip(layer_kinds.layer_kinds(record), layer_kinds.layer_windows(record)):
        kind = layer_kinds.base_kind(kind)
        word = "chunk" if kind == layer_kinds.CHUNKED else "window"
        out.append((kind, f"{kind} ({word} {win})" if win else kind))
    return out


def _rgba(hex_color: str) -> list[int]:
    c = QtGui.QColor(hex_color)
    return [c.red(), c.green(), c.blue(), 255]


def _layer_ticks(p: pg.PlotItem, L: int) -> None:
    ax = p.getAxis("left")
    # The window's thinning rule, for at most 16 labels: the axis as tall as 16 label gaps.
    ax.setTicks(layer_ticks(L, MAX_LAYER_LABELS * LAYER_LABEL_GAP) + [[]])
    ax.setStyle(hideOverlappingLabels=False)  # else the label of layer 0, at the edge, is dropped


def _layer_event_marks(p: pg.PlotItem, record: TraceRecord) -> None:
    """Event markers on the heatmap: on the layers an event names, else a triangle above layer 0."""
    xs, ys, brushes = [], [], []
    for e in record.events:
        color = th.severity_color(e.severity)
        layers = e.layers or ([e.layer] if e.layer is not None else [])
        for lay in layers or [None]:
            xs.append(e.step)
            ys.append(lay + 0.5 if lay is not None else 0.5)
            brushes.append(pg.mkBrush(color))
    if xs:
        p.addItem(pg.ScatterPlotItem(xs, ys, symbol="t", size=13, brush=brushes, pen=pg.mkPen("w", width=1)),
                  ignoreBounds=True)


# -- memory figure ------------------------------------------------------------------------------------------

def memory_figure(record: TraceRecord) -> pg.GraphicsLayoutWidget:
    """KV bytes by device (stacked) over process memory (RSS, accelerator), per-turn peaks marked."""
    win = pg.GraphicsLayoutWidget()
    win.ci.setSpacing(6)
    _title(win, record, "Memory: KV cache bytes by device, process and accelerator memory")
    n = record.n_steps
    if not n:
        _no_steps(win)
        return win
    x = np.arange(n, dtype=np.float64)

    legend = _legend(win, 1, 2)
    kv = _step_plot(win, 2)
    by_dev = record.kv_bytes_by_device()
    total = np.zeros(n) if not by_dev else np.sum(list(by_dev.values()), axis=0).astype(np.float64)
    held = [t.kv_held_bytes for t in record.turns]
    div, unit = byte_scale(max(float(total.max()) if n else 0.0, *held, 1.0))
    _style_plot(kv, f"KV cache ({unit})", None)
    base = np.zeros(n)
    base_curve = kv.plot(x, base, pen=pg.mkPen(None))
    for k, (dev, b) in enumerate(by_dev.items()):
        color = th.device_color(dev, k)
        upper = base + b.astype(np.float64) / div
        curve = kv.plot(x, upper, pen=pg.mkPen(color, width=2))
        legend.addItem(curve, f"KV on {_esc(str(dev))} (logical bytes)")
        fill_color = QtGui.QColor(color)
        fill_color.setAlpha(70)
        fill = pg.FillBetweenItem(base_curve, curve, brush=pg.mkBrush(fill_color))
        fill.setZValue(-5)
        kv.addItem(fill)
        base, base_curve = upper, curve
    ends = [(max(t.end_step - 1, t.first_step), t.kv_held_bytes / div) for t in record.turns if t.kv_held_bytes]
    if ends:
        legend.addItem(kv.plot([e[0] for e in ends], [e[1] for e in ends], pen=None, symbol="d", symbolSize=11,
                               symbolBrush=pg.mkBrush(R.text)), "KV held at end of turn (storage kept alive)")
    ymax = max(float(base.max()), max((e[1] for e in ends), default=0.0), 1e-9)
    kv.setYRange(0, ymax * 1.15, padding=0)
    _turns(kv, record, labels=True, y_label=ymax * 1.14)
    _event_lines(kv, record.events, labels=False)

    proc = _step_plot(win, 3)
    proc.setXLink(kv)
    rss = record.rss.astype(np.float64)
    alloc = record.accel_allocated.astype(np.float64)
    reserved = record.accel_reserved.astype(np.float64)
    peaks_accel = [t.peak_accel_bytes for t in record.turns]
    pdiv, punit = byte_scale(max(float(rss.max()), float(alloc.max()), float(reserved.max()), *peaks_accel, 1.0))
    _style_plot(proc, f"process memory ({punit})", "forward pass (step)")
    if rss.any():
        legend.addItem(proc.plot(x, rss / pdiv, pen=pg.mkPen(th.RSS_COLOR, width=2)), "process RSS (upper bound for CPU KV)")
    if alloc.any():
        legend.addItem(proc.plot(x, alloc / pdiv, pen=pg.mkPen(th.ALLOC_COLOR, width=2)), "accelerator allocated")
    if reserved.any():
        legend.addItem(proc.plot(x, reserved / pdiv, pen=pg.mkPen(th.RESERVED_COLOR, width=1.5,
                                                                  style=QtCore.Qt.PenStyle.DotLine)),
                       "accelerator reserved")
    for item, name in _peaks(proc, record, rss, pdiv, punit):
        legend.addItem(item, name)
    _turns(proc, record, labels=False)
    _event_lines(proc, record.events, labels=False)
    if not (rss.any() or alloc.any()):
        proc.addItem(pg.TextItem("no memory counters recorded", color=R.dim_text))
    series = [a / pdiv for a in (rss, alloc, reserved) if a.any()] + [np.array(peaks_accel, float) / pdiv]
    lo = min(float(a[a > 0].min()) for a in series if (a > 0).any()) if any((a > 0).any() for a in series) else 0.0
    hi = max(float(a.max()) for a in series) if series else 1.0
    span = max(hi - lo, hi * 1e-3, 1e-9)
    proc.setYRange(lo - 0.05 * span, hi + 0.22 * span, padding=0)  # headroom for the peak labels
    return win


def _peaks(p: pg.PlotItem, record: TraceRecord, rss, div: float, unit: str) -> list[tuple]:
    """Mark each turn's RSS peak, and its accelerator peak (the allocator's own counter, reset per turn)."""
    xs, ys, items = [], [], []
    accel_line = None
    seg_x: list[float] = []
    seg_y: list[float] = []
    for t in record.turns:
        a, b = t.first_step, (t.end_step if t.end_step > t.first_step else record.n_steps)
        if b <= a:
            continue
        j = a + int(np.argmax(rss[a:b]))
        if rss[j] > 0 and (len(record.turns) <= MAX_TURN_MARKS or t.index % _turn_stride(record) == 0):
            xs.append(j)
            ys.append(rss[j] / div)
            n = record.n_steps
            ax = 1.0 if j > 0.9 * n else 0.0 if j < 0.1 * n else 0.5  # keep edge labels inside the plot
            if len(record.turns) <= 2 * MAX_TURN_LABELS:  # more would print over each other
                lab = pg.TextItem(f"peak {rss[j] / div:.2f} {unit}", color=th.RSS_COLOR, anchor=(ax, 1.2))
                lab.setFont(_font(FONT_PT - 2))
                lab.setPos(j, rss[j] / div)
                p.addItem(lab, ignoreBounds=True)
        if t.peak_accel_bytes:
            seg_x += [a, b - 1]
            seg_y += [t.peak_accel_bytes / div] * 2
    if seg_x:  # one item for every turn's segment: items cost the exporter per item
        accel_line = pg.PlotDataItem(np.array(seg_x, float), np.array(seg_y, float), connect="pairs",
                                     pen=pg.mkPen(th.ALLOC_COLOR, width=1.5, style=QtCore.Qt.PenStyle.DashLine))
        p.addItem(accel_line)
    if xs:
        items.append((p.plot(xs, ys, pen=None, symbol="o", symbolSize=9, symbolBrush=pg.mkBrush(th.RSS_COLOR)),
                      "peak RSS per turn"))
    if accel_line is not None:
        items.append((accel_line, "accelerator peak per turn"))
    return items
