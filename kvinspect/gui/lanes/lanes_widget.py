"""The live plot panel: heatmap, tokens and memory lanes on one shared step axis, plus overlays.

``render(record, step=None)`` is the only way data gets in; the main window's paint clock
(:mod:`kvinspect.gui.base.paint_clock`) calls it up to 10 times a second while a model streams, and
at the interactive rate after :attr:`PlotsWidget.wantsPaint` (a zoom, a pan, a resize, new picks). It
does nothing when neither the record's version, the visible range nor the size moved. Overlays (turn boundaries, event markers, window-reached regions, the cursor) are
added with ``ignoreBounds`` so they never disturb auto-ranging.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.media.bands import image_bands
from kvinspect.core.trace.series import MEAN_SEEN, MEAN_STORED, RSS, RecordSeries
from kvinspect.core.units import fmt_bytes
from kvinspect.gui.base import theme as th
from kvinspect.gui.base.record_layers import layer_kinds, layer_windows
from kvinspect.gui.base.status_text import StatusText
from kvinspect.gui.graphics.axes import StepAxis
from kvinspect.gui.graphics.color_scale import gradient_pixmap
from kvinspect.gui.graphics.cursor_line import vline
from kvinspect.gui.graphics.curve import Curve
from kvinspect.gui.graphics.event_markers import MarkersItem
from kvinspect.gui.graphics.heatmap import Heatmap
from kvinspect.gui.graphics.marker_lines import VLines
from kvinspect.gui.graphics.regions import RegionsItem
from kvinspect.gui.graphics.sticky_range import growth_ceiling
from kvinspect.gui.graphics.view_span import CACHE, ViewSpan, cache_text
from kvinspect.gui.lanes.heatmap_lane import HeatmapLane
from kvinspect.gui.lanes.lane_axes import fixed_axes
from kvinspect.gui.lanes.layer_picks import MAX_PICKED, default_picks
from kvinspect.gui.lanes.memory_lane import MemoryLane
from kvinspect.gui.lanes.reached_regions import region_spans
from kvinspect.gui.lanes.tokens_lane import TokensLane

_VIEW_ITEMS = (Curve, Heatmap, RegionsItem, ViewSpan, pg.InfiniteLine)
AHEAD_STEPS = 512  # a running turn's ranges take in this many of its steps to come at most
MAX_LINES = 200  # turn/recreate lines drawn as items; beyond that only the most recent
MARKER_Y = (0.2, 0.52)  # rows in the event lane (0..1) for events at one step; turn labels sit on top


def _draft_pen():
    return pg.mkPen(th.DRAFT_REJECTED_COLOR, width=1, style=QtCore.Qt.PenStyle.DashDotLine)


def draft_crops(turns, step: int | None = None) -> dict[int, int]:
    """Step -> draft tokens cropped after it, over ``turns`` (up to ``step`` when replaying)."""
    out: dict[int, int] = {}
    for t in turns:
        for at, n in t.rejected_drafts():
            if step is None or at <= step:
                out[at] = out.get(at, 0) + n
    return out


class PlotsWidget(QtWidgets.QWidget):
    """Header (legend, layer picker, follow/fit) over one GraphicsLayoutWidget with three lanes."""

    eventClicked = QtCore.Signal(int)  # index into record.events
    pickedChanged = QtCore.Signal(list)
    loadRequested = QtCore.Signal()
    wantsPaint = QtCore.Signal()  # the view moved or its settings changed: render soon, at the interactive rate

    def __init__(self, parent=None):
        super().__init__(parent)
        self.record = None
        self.series: RecordSeries | None = None
        self.step: int | None = None
        self.follow = True
        self.picked: list[int] = []
        self._stamp = None
        self._events_n = -1
        self._turns_key = None
        self._theme = th.DARK
        self._follow_top: float | None = None
        self._refitted = False  # refit() asked for a view as a fresh one would draw it
        self._ahead_turn: int | None = None  # the first step of the running turn whose reach the view takes in
        self._growing = False
        self._rendering = False  # inside render(): what it changes (a record, a follow step) it draws itself
        self._spans_memo: dict = {}
        self._drafts: dict[int, int] = {}  # step -> rejected drafts generate() cropped after it
        self._caching = True
        self._uncached: list = []
        self.held = False  # the view's repaint waits for release_paint()
        # Items are cached as pixmaps in QPixmapCache (graphics/view_span.py); its default 10 MiB holds
        # fewer than a view's items at 1000 × 600, and evicting them every frame costs more than
        # not caching at all.
        QtGui.QPixmapCache.setCacheLimit(max(QtGui.QPixmapCache.cacheLimit(), 96 * 1024))
        self._build()

    # -- layout ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.legend = QtWidgets.QLabel()
        self.legend.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.readout = QtWidgets.QLabel("hover a plot for values")
        self.readout.setObjectName("readout")
        self.readout.setMinimumWidth(40)
        self.readout.setSizePolicy(QtWidgets.QSizePolicy.Policy.Ignored, QtWidgets.QSizePolicy.Policy.Preferred)
        self.pick_button = QtWidgets.QToolButton(text="Layers ▾")
        # Fusion draws the menu arrow over the text of a small tool button: an arrow in the text instead.
        self.pick_button.setStyleSheet("QToolButton::menu-indicator { image: none; width: 0px; }")
        self.pick_button.setToolTip("Pick layers to plot as curves (or click a heatmap row)")
        self.pick_button.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.InstantPopup)
        self.pick_menu = QtWidgets.QMenu(self)
        self.pick_button.setMenu(self.pick_menu)
        self.follow_box = QtWidgets.QCheckBox("Follow")
        self.follow_box.setChecked(True)
        self.follow_box.setToolTip("Keep the whole run in view as it grows (off once you zoom or pan)")
        self.follow_box.toggled.connect(self.set_follow)
        fit = QtWidgets.QToolButton(text="Fit")
        fit.setToolTip("Show every step (Ctrl+0)")
        fit.clicked.connect(lambda: self.set_follow(True))

        self.scale_img = QtWidgets.QLabel()
        self.scale_img.setPixmap(gradient_pixmap(72, 10))
        self.scale_img.setToolTip("Heatmap colour: stored tokens per layer, 0 to the largest in view (while a reply streams, a "
                                 "round number above it, so colours stay put; zoom in to spread the colours)")
        # (its text changes as a reply streams: a QLabel would lay the window out each time)
        self.scale_hi = StatusText(align=QtCore.Qt.AlignmentFlag.AlignLeft, margin=0)
        top = QtWidgets.QHBoxLayout()
        top.setContentsMargins(6, 2, 6, 0)
        top.setSpacing(4)
        top.addWidget(self.legend)
        top.addSpacing(8)
        top.addWidget(QtWidgets.QLabel("0"))
        top.addWidget(self.scale_img)
        top.addWidget(self.scale_hi)
        top.addSpacing(12)
        top.addWidget(self.readout, 1)
        top.addWidget(self.pick_button)
        top.addWidget(self.follow_box)
        top.addWidget(fit)

        self.view = pg.GraphicsLayoutWidget()
        self.view.ci.setContentsMargins(2, 4, 8, 2)
        self.view.ci.setSpacing(2)
        lay = self.view.ci
        self.lane = lay.addPlot(row=0, col=1, axisItems={"bottom": StepAxis("bottom")})
        self.lane.hideButtons()
        self.lane.setMenuEnabled(False)
        fixed_axes(self.lane)
        self.lane.getAxis("left").setStyle(showValues=False, tickLength=0)
        self.lane.setMinimumHeight(40)
        self.lane.setMaximumHeight(40)
        self.lane.getViewBox().setMouseEnabled(x=True, y=False)
        self.lane.setYRange(0, 1, padding=0)
        self.heat = HeatmapLane(lay, 1)
        self.tokens = TokensLane(lay, 2)
        self.memory = MemoryLane(lay, 3)
        lay.layout.setRowStretchFactor(1, 5)
        lay.layout.setRowStretchFactor(2, 3)
        lay.layout.setRowStretchFactor(3, 3)
        self.lanes = [self.lane, self.heat.plot, self.tokens.plot, self.memory.plot]
        for p in self.lanes:
            if p is not self.heat.plot:
                p.setXLink(self.heat.plot)
        for p in self.lanes:
            p.getViewBox().sigRangeChangedManually.connect(self._on_manual_range)
        # Nothing polls the view any more: a zoom, pan or resize asks for its own paint.
        hvb = self.heat.plot.getViewBox()
        hvb.sigXRangeChanged.connect(self._on_range)
        hvb.sigResized.connect(self._on_range)
        self.heat.plot.setXRange(0, 64, padding=0)
        # Axes are mostly text, the slowest thing to paint in software; cache them as pixmaps,
        # repainted only when their ticks change (measured: 42 → 20 ms a frame). Legends cache themselves.
        for p in self.lanes:
            for name in ("left", "bottom", "right"):
                p.getAxis(name).setCacheMode(QtWidgets.QGraphicsItem.CacheMode.DeviceCoordinateCache)

        self.markers = MarkersItem(tip=self._marker_tip, hover_size=14)
        self.markers.setZValue(30)
        self.markers.setCacheMode(CACHE)
        self.markers.sigClicked.connect(self._on_marker_clicked)
        self.lane.addItem(self.markers, ignoreBounds=True)
        self.turn_lines = VLines(self.lanes, pg.mkPen(th.DARK.turn_line, width=1, style=QtCore.Qt.PenStyle.DotLine),
                                 label_color=th.DARK.dim_text)
        self.recreate_lines = VLines(self.lanes, pg.mkPen(th.EVENT_MARKERS["cache_recreated"][1], width=2,
                                                          style=QtCore.Qt.PenStyle.DashLine))
        self.draft_lines = VLines(self.lanes, _draft_pen())
        # In the lanes only while shown (show_step): a hidden InfiniteLine still re-places itself
        # on every view change, 0.1 ms each of a zoom's frame.
        self.cursor = [vline(th.DARK.cursor, width=2) for _ in self.lanes]
        for c in self.cursor:
            c.setZValue(40)
            c.setVisible(False)
        self.placeholder = pg.TextItem("Send a message: each forward pass adds a column here.", anchor=(0, 0.5))
        self.heat.plot.addItem(self.placeholder, ignoreBounds=True)
        self.placeholder.setPos(2, 0.5)

        self._hover = pg.SignalProxy(self.view.scene().sigMouseMoved, rateLimit=30, slot=self._on_hover)
        self.view.scene().sigMouseClicked.connect(self._on_click)

        live = QtWidgets.QWidget()
        box = QtWidgets.QVBoxLayout(live)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(0)
        box.addLayout(top)
        box.addWidget(self.view, 1)
        self.pages = QtWidgets.QStackedLayout(self)
        self.pages.addWidget(self._empty_page())
        self.pages.addWidget(live)
        self._update_legend([])

    _EMPTY_TITLE = "No model loaded"
    _EMPTY_BODY = (
        "Load a built-in tiny model (no download), SmolLM2, a hub id, a model folder or a .gguf file.<br>"
        "Then chat: every forward pass adds a column to a layers × steps map of what the KV cache "
        "stores,<br>with the tokens it has seen, its memory per device, and a marker wherever "
        "something happened.<br><br>Or open a saved trace (Ctrl+O), or follow one another program "
        "is writing (File → Follow trace…).")

    def _empty_page(self) -> QtWidgets.QWidget:
        """Before any model: what this area will show, and the one button that starts it."""
        page = QtWidgets.QWidget()
        self.empty_text = QtWidgets.QLabel()
        self.empty_text.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
        self.empty_text.setWordWrap(True)
        self.empty_load = QtWidgets.QPushButton("Load model…  (Ctrl+L)")
        self.empty_load.clicked.connect(self.loadRequested)
        self.set_empty_message(None)
        box = QtWidgets.QVBoxLayout(page)
        box.addStretch(2)
        box.addWidget(self.empty_text)
        box.addSpacing(12)
        box.addWidget(self.empty_load, 0, QtCore.Qt.AlignmentFlag.AlignHCenter)
        box.addStretch(3)
        return page

    def set_empty_message(self, title: str | None, body: str = "") -> None:
        """What the area says while there is no record (None: the start page, with its Load button)."""
        default = title is None
        self.empty_text.setText(f"<h2>{self._EMPTY_TITLE if default else title}</h2>"
                                f"<p>{self._EMPTY_BODY if default else body}</p>")
        self.empty_load.setVisible(default)

    # -- public ---------------------------------------------------------------------------
    @property
    def growing(self) -> bool:
        """A generation is running (set by the window): ranges grow in coarse steps, not to a tight fit."""
        return self._growing

    @growing.setter
    def growing(self, on: bool) -> None:
        self._growing = bool(on)
        self.tokens.yrange.growing = self.memory.kv_range.growing = self._growing

    def render(self, record, step: int | None = None, force: bool = False, hold_whole: bool = False) -> bool:
        """Draw ``record`` (up to ``step`` when given). Returns True when something was redrawn.

        ``hold_whole``: when the view moves (a range step, a new record, a forced redraw), Qt's paint of
        it waits for :meth:`release_paint` (``held`` says so). Such a frame repaints every lane, and a
        caller painting in parts lets the event loop run between the render and that paint.
        """
        self._rendering = True
        try:
            return self._render(record, step, force, hold_whole)
        finally:
            self._rendering = False

    def release_paint(self) -> None:
        """Let Qt paint the view a held render moved: all of it, at the event loop's next paint."""
        if self.held:
            self.held = False
            self.view.viewport().setUpdatesEnabled(True)  # (which asks for a paint of the whole viewport)

    def _render(self, record, step: int | None, force: bool, hold_whole: bool) -> bool:
        if record is not self.record:
            self._set_record(record)  # (its new view resizes, fits and picks its layers: drawn below)
            force = True
        if record is None:
            return False
        s = self.series
        changed = s.update()
        n = s.n if step is None else min(s.n, step + 1)
        vb = self.heat.plot.getViewBox()
        stepped = False  # the view grew by a step while a run streams
        # A running turn's ranges take in where it may get to (its max_new_tokens, AHEAD_STEPS at
        # most): a range step repaints lanes whole (3–8 ms against a strip's 1–2), and a turn that
        # grew its ranges as it went stepped them five to ten times.
        ahead, since = s.turn_ahead(AHEAD_STEPS) if self.growing and self.follow and step is None else (0, n)
        new_turn = ahead > 0 and since != self._ahead_turn  # its reach is taken in at once
        self._ahead_turn = since if ahead else None
        if self.follow:
            # While generating, grow the view in steps, not every frame: axes keep their cached
            # ticks and the picture stays calm. At rest, fit the data exactly.
            top = self._follow_top
            reach = n + ahead
            want = max(64.0, growth_ceiling(max(n * 1.15, reach))) if self.growing else max(16.0, float(n))
            if top is None or n > top or reach < 0.4 * top or ((new_turn or not self.growing) and top != want):
                top = self._follow_top = want
                stepped = self.growing
                self.heat.plot.setXRange(0, top, padding=0)
        (a, b), _ = vb.viewRange()
        cols = max(int(vb.width()), 100)
        stamp = (s.n, step, round(a, 3), round(b, 3), cols, int(vb.height()))
        moved = force or self._stamp is None or stamp[2:] != self._stamp[2:]
        if moved and hold_whole and not self.held and self.isVisible():
            # The scene tells the viewport what its items changed from the event loop (a queued call):
            # with the viewport's updates off until then, nothing is painted before release_paint(),
            # which repaints it whole, as a moved view's items all are.
            self.held = True
            self.view.viewport().setUpdatesEnabled(False)
        # A live step of the view keeps the pixmap caches: this frame redraws every item into its
        # cache, once. Turned off, the next frame would draw them all again to turn them back on.
        self._set_caching(not moved or stepped)
        if not (changed or force or stamp != self._stamp):
            return False
        self._stamp = stamp
        if force:
            self._invalidate()
        b = min(b, n - 1) if n else b
        self.placeholder.setVisible(n == 0)
        top = self.heat.refresh(s, a, b, cols, growing=self.growing and step is None,
                                reach=s.projected_longest(ahead, since))
        self.scale_hi.setText(f"{top:,}" if n else "")
        if self._refitted:  # a turn's end: the scale's text as wide as a fresh view's, not the widest it showed
            self._refitted = False
            self.scale_hi.fit()
        # Curves: one min/max bin per 2 px is as sharp as the eye can tell, at half the points to stroke.
        self.tokens.refresh(s, a, b, max(cols // 2, 50), reach=s.projected(MEAN_SEEN, ahead, since))
        with record.lock:
            turns = list(record.turns)
            events_n = len(record.events)
        finished = turns
        if step is not None:
            # Replay: what had happened by the step; a turn's peak is known once it ended.
            turns = [t for t in turns if t.first_step <= step]
            finished = [t for t in turns if t.status != "running" and t.end_step - 1 <= step]
        self.memory.refresh(s, record, finished, a, b, max(cols // 2, 50), ahead=ahead, since=since)
        self._update_overlays(record, turns, events_n, n, force, step)
        # pyqtgraph applies a new range to its items' transform only when the view paints, and the
        # items it moves are then marked dirty in the middle of that paint: Qt painted the view a
        # second time, 1–2 ms. Applied now, one paint draws the frame.
        for vb in (*(p.getViewBox() for p in self.lanes), self.memory.vb2):
            vb.updateMatrix()
        return True

    def refit(self) -> None:
        """Fit the lanes' y ranges to the data as a new view would (at the next render).

        They remember the run's history (they change in steps while it grows, so axes stay calm):
        at a turn's end the window refits them, and the turn looks the same however often it was
        painted on the way.
        """
        for r in (self.tokens.yrange, self.memory.kv_range, self.memory.proc_range):
            r.reset()
        self._stamp = None
        self._refitted = True

    def set_follow(self, on: bool) -> None:
        self.follow = bool(on)
        self._follow_top = None
        if self.follow_box.isChecked() != self.follow:
            self.follow_box.setChecked(self.follow)
        self._stamp = None
        self._ask_paint()

    def show_step(self, step: int | None, layers: list[int] | None = None) -> None:
        """Move the cursor to ``step`` (None hides it) and bring it into view."""
        for p, c in zip(self.lanes, self.cursor):
            c.setVisible(step is not None)
            if step is None:
                if c.scene() is not None:
                    p.removeItem(c)
                continue
            c.setPos(step)
            if c.scene() is None:
                p.addItem(c, ignoreBounds=True)
        if step is None:
            return
        (a, b), _ = self.heat.plot.getViewBox().viewRange()
        if not (a <= step <= b):
            self.set_follow(False)
            span = max(b - a, 64)
            self.heat.plot.setXRange(step - span / 2, step + span / 2, padding=0)

    def set_picked(self, layers: list[int]) -> None:
        if self.record is None:
            self.picked = list(layers)[:MAX_PICKED]
            return
        n = self.record.n_layers
        self.picked = sorted({i for i in layers if 0 <= i < n})[:MAX_PICKED]
        self.series.keep_layers(self.picked)
        self.tokens.set_picked(self.record, self.picked)
        self._rebuild_pick_menu()
        self._stamp = None
        self._ask_paint()
        self.pickedChanged.emit(list(self.picked))

    def apply_theme(self, t: th.Theme) -> None:
        self._theme = t
        self.view.setBackground(t.plot_bg)
        for p in self.lanes:
            for name in ("left", "bottom", "right"):
                ax = p.getAxis(name)
                ax.setPen(pg.mkPen(t.plot_fg))
                ax.setTextPen(pg.mkPen(t.plot_fg))
        bg = pg.mkColor(t.plot_bg)
        bg.setAlpha(130)  # see-through: what passes under a legend stays visible
        for legend in (self.tokens.legend, self.memory.legend):
            legend.set_style(t.plot_fg, bg)  # curves pass under the legend: keep its text readable
        self.heat.apply_theme(t)
        self.tokens.apply_theme(t)
        self.memory.apply_theme(t)
        self.placeholder.setColor(t.dim_text)
        for c in self.cursor:
            c.setPen(pg.mkPen(t.cursor, width=2))
        self.turn_lines.restyle(pg.mkPen(t.turn_line, width=1.0, style=QtCore.Qt.PenStyle.DotLine), t.dim_text)
        self._turns_key = None
        self._events_n = -1
        self._update_legend(layer_kinds(self.record) if self.record is not None else [])
        self._stamp = None
        self._ask_paint()

    # -- internals ------------------------------------------------------------------------
    def _ask_paint(self) -> None:
        if not self._rendering:
            self.wantsPaint.emit()

    def _set_caching(self, on: bool) -> None:
        """Pixmap caches on while the view stands still, off while it moves.

        A live frame changes a few items, and the rest cost a blit each. A zoom, pan or resize
        changes every item: caching would then render each into its pixmap and blit it, about
        4 ms a frame more than painting directly (docs/redraw.md).
        """
        if on == self._caching:
            return
        self._caching = on
        if on:
            for item in self._uncached:
                try:
                    item.setCacheMode(CACHE)
                except RuntimeError:  # removed and deleted meanwhile (a record swap)
                    pass
            self._uncached = []
        else:
            # Only what the view moves: axes, legends and labels keep theirs (they change when
            # their ticks or entries do, and their text is the slowest thing to paint).
            self._uncached = [i for i in self.view.scene().items()
                              if i.cacheMode() == CACHE and isinstance(i, _VIEW_ITEMS)]
            for item in self._uncached:
                item.setCacheMode(QtWidgets.QGraphicsItem.CacheMode.NoCache)

    def _invalidate(self) -> None:
        """A forced redraw repaints every data item, even those whose pixels would not change
        (each builds what it draws again, or takes it back from its ``ZoomMemo``).

        The lanes name their data items: scanning the scene's ~200 items for them cost more
        than invalidating them (docs/redraw.md, "Round 7: the full view").
        """
        for item in (*self.heat.data_items(), *self.tokens.data_items(), *self.memory.data_items()):
            item.invalidate()

    def _set_record(self, record) -> None:
        self.record = record
        self._spans_memo = {}
        self.series = RecordSeries(record) if record is not None else None
        self._stamp = None
        self._events_n = -1
        self._turns_key = None
        self.turn_lines.place([])
        self.recreate_lines.place([])
        self.draft_lines.place([])
        self._drafts = {}
        self.markers.clear()
        self.show_step(None)
        self.pages.setCurrentIndex(0 if record is None else 1)
        if record is None:
            return
        self.heat.reset(record)
        self.tokens.reset(record)
        self.memory.reset(record)
        kinds = layer_kinds(record)
        self._update_legend(kinds)
        self.picked = []
        self.set_picked(default_picks(kinds))  # a new model: its first layer of each kind
        self.set_follow(True)

    def _update_legend(self, kinds: list[str]) -> None:
        present = [k for k in th.KIND_ORDER if k in {th.kind_base(x) for x in kinds}]
        chips = " ".join(
            f"<span style='color:{th.KIND_COLORS[k]}; font-size:13pt'>■</span>&nbsp;{th.KIND_LEGEND.get(k, k)}"
            for k in present)
        if self._drafts:  # only when the record has any: a legend entry for nothing is noise
            chips += (f" &nbsp;<span style='color:{th.DRAFT_REJECTED_COLOR}'>┆</span>&nbsp;"
                      f"{th.DRAFT_REJECTED_LABEL}")
        self.legend.setText(f"<b>KV cache per layer</b> &nbsp;{chips}&nbsp; "
                            f"<span style='color:{self._theme.dim_text}'>stored:</span>")

    def _rebuild_pick_menu(self) -> None:
        self.pick_menu.clear()
        if self.record is None:
            return
        kinds, windows = layer_kinds(self.record), layer_windows(self.record)
        for i in range(self.record.n_layers):
            w = f", window {windows[i]}" if windows[i] else ""
            act = self.pick_menu.addAction(f"Layer {i} ({kinds[i]}{w})")
            act.setCheckable(True)
            act.setChecked(i in self.picked)
            act.toggled.connect(lambda on, i=i: self._toggle_layer(i, on))

    def _toggle_layer(self, i: int, on: bool) -> None:
        want = set(self.picked)
        (want.add if on else want.discard)(i)
        self.set_picked(sorted(want))

    def _update_overlays(self, record, turns, events_n: int, n: int, force: bool, step: int | None = None) -> None:
        key = (tuple((t.index, t.first_step, t.status) for t in turns), step)
        if key != self._turns_key or events_n != self._events_n:
            # Only when turns or events changed: a forced redraw (zoom, resize) moves nothing here.
            self._turns_key, self._events_n = key, events_n
            t = self._theme
            shown = turns[-MAX_LINES:]
            self.turn_lines.place([float(x.first_step) for x in shown], [f"turn {x.index + 1}" for x in shown])
            with record.lock:
                events = list(record.events)
            shown = [e for e in events if step is None or e.step <= step]
            recreated = [e for e in shown if e.kind == "cache_recreated"][-MAX_LINES:]
            self.recreate_lines.place([float(e.step) for e in recreated])
            self._drafts = draft_crops(turns, step)
            self.draft_lines.place([float(x) for x in sorted(self._drafts)][-MAX_LINES:])
            spots, at_step = [], {}
            for idx, e in enumerate(events):
                if step is not None and e.step > step:
                    continue
                symbol, color = th.EVENT_MARKERS.get(e.kind, ("o", th.severity_color(e.severity)))
                row = at_step.get(e.step, 0)  # several events at one step: stacked, problems on top
                at_step[e.step] = row + 1
                # Size by severity: an error (duplicated context, cache fed with use_cache=False) must not
                # look smaller than a warning's dashed line.
                size = {"error": 15, "warn": 12}.get(e.severity, 10)
                spots.append({"pos": (e.step, MARKER_Y[min(row, len(MARKER_Y) - 1)]), "symbol": symbol, "size": size,
                              "brush": pg.mkBrush(color), "pen": pg.mkPen(t.plot_bg, width=1), "data": idx})
            self.markers.setData(spots)
            self.heat.update_kinds(record)
            self.tokens.set_windows(record)
            self._update_legend(layer_kinds(record))
            cache_text(self.view.scene())  # new turn labels, legend rows
        # Regions grow with the data (open until the cache object changes): every redraw.
        spans = region_spans(record, self.series, memo=self._spans_memo)
        if step is not None:
            spans = [(x0, min(x1, step + 1.0), l0, l1) for x0, x1, l0, l1 in spans if x0 <= step]
        self.heat.set_regions(spans)
        self.tokens.set_image_bands(image_bands(record), step)

    def _marker_tip(self, x, y, data):
        if self.record is None or data is None or data >= len(self.record.events):
            return ""
        e = self.record.events[int(data)]
        return f"{e.kind} ({e.severity}) · turn {e.turn + 1} · step {e.step}\n{e.message}"

    def _on_marker_clicked(self, item, points, ev=None) -> None:
        if len(points):
            self.eventClicked.emit(int(points[0].data()))

    def _on_manual_range(self, *args) -> None:
        if not self._rendering:
            self.set_follow(False)

    def _on_range(self, *args) -> None:
        self._ask_paint()  # (render's own follow step is drawn by that render)

    def showEvent(self, e) -> None:
        super().showEvent(e)
        self._ask_paint()  # skipped while hidden: draw what changed meanwhile

    def _lane_at(self, scene_pos):
        for p in self.lanes:
            if p.getViewBox().sceneBoundingRect().contains(scene_pos):
                return p
        return None

    def _on_hover(self, args) -> None:
        text = self.describe(args[0])
        if text:
            self.readout.setText(text)
            QtWidgets.QToolTip.showText(QtGui.QCursor.pos(), text.replace(" · ", "\n"), self.view)

    def describe(self, scene_pos) -> str:
        """What is under the mouse: layer, step, seen, stored, window (heatmap); values elsewhere."""
        p = self._lane_at(scene_pos)
        if p is None or self.series is None or self.series.n == 0:
            return ""
        if p is self.lane:
            return ""  # the markers have their own tooltips
        pt = p.getViewBox().mapSceneToView(scene_pos)
        step = int(round(pt.x()))
        if not 0 <= step < self.series.n:
            return ""
        if p is self.heat.plot:
            layer = int(np.floor(pt.y()))
            if not 0 <= layer < self.record.n_layers:
                return f"step {step:,}"
            return self.describe_cell(step, layer)
        row = self.series.curve_row(step)
        if p is self.tokens.plot:
            return f"step {step:,} · seen {row[MEAN_SEEN]:.0f} · stored (mean of layers) {row[MEAN_STORED]:.1f}"
        parts, below = [], 0.0
        for name, col in self.series.device_columns():  # columns are cumulative (stacked)
            parts.append(f"KV on {name} {fmt_bytes(row[col] - below)}")
            below = row[col]
        return f"step {step:,} · " + " · ".join(parts + [f"RSS {fmt_bytes(row[RSS])}"])

    def describe_cell(self, step: int, layer: int) -> str:
        cell = self.series.at(step, layer)
        if cell is None:
            return ""
        kind = layer_kinds(self.record)[layer]
        window = layer_windows(self.record)[layer]
        seen = "–" if cell["seen"] < 0 else f"{cell['seen']:,}"
        stored = "–" if cell["stored"] < 0 else f"{cell['stored']:,}"
        turn = self.record.turn_of_step(step)
        text = (f"layer {layer} ({kind}) · step {step:,} (turn {turn + 1}) · seen {seen} · stored {stored} · "
                f"window {window or '–'} · {fmt_bytes(cell['bytes'])} on {cell['device']}")
        rejected = self._drafts.get(step)
        if rejected:
            text += f" · {th.DRAFT_REJECTED_LABEL}: {rejected:,} token{'s' if rejected != 1 else ''} cropped after this step"
        return text

    def _on_click(self, ev) -> None:
        if ev.button() != QtCore.Qt.MouseButton.LeftButton or self.record is None:
            return
        p = self._lane_at(ev.scenePos())
        if p is not self.heat.plot:
            return
        pt = self.heat.plot.getViewBox().mapSceneToView(ev.scenePos())
        layer = int(np.floor(pt.y()))
        if 0 <= layer < self.record.n_layers and ev.double():
            self._toggle_layer(layer, layer not in self.picked)
