"""The lanes' curve item, redrawn only when its pixels change; why the lean items (this, the heatmap) exist.

Why not pyqtgraph's ``PlotDataItem``/``ImageItem`` (docs/redraw.md has the profile):

* a pen wider than 1 px goes through Qt's stroker: 0.94 ms for a 1,000-point curve, against
  0.06 ms for a cosmetic 1-px line. A wide line is drawn here as 1-px strokes offset by whole
  device pixels (``stroke_offsets``: two for 2 px), and looks the same without antialiasing;
* a new step in a 100k-step view moves a curve by a thousandth of a pixel. ``setData`` keeps the
  new arrays but rebuilds the path and asks for a repaint only when some point moved by a quarter
  pixel or more; with the item cached as a pixmap, an unchanged item costs a blit;
* on a live frame only a window's last bin can move (``WindowPrefix``): ``Curve.set_bins``
  compares those few points and makes the curve's arrays only when it is redrawn or read;
* in a whole run's view every bin lies within a pixel and only its high point is drawn: the
  curve is then made from the bins' centres and highs (``Curve._set_within``), its zigzag and
  quantised key only when they are asked for;
* the heatmap maps stored lengths to the 256 colours itself (one numpy take) and uploads a new
  image only when a cell's colour changed;
* each item keeps what it drew for its last few views (``ZoomMemo``: a path, an image, an
  axis' ticks), keyed by the window and the pixel size and checked against the window's data:
  a zoom and then Fit (or a theme change) takes the full view's back instead of building it.

``invalidate()`` (a forced redraw: resize, theme, new record) repaints everything regardless.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from kvinspect.core.trace.series import envelope
from kvinspect.gui.graphics.view_span import QUANTUM, GrowingItem, ZoomMemo, pixel_size


@functools.lru_cache(maxsize=8)
def bin_centres(x0: int, stride: int, n: int) -> np.ndarray:
    """x of ``n`` bins of ``stride`` steps from ``x0``, as ``series.envelope``'s (read-only: the
    curves of one window share it)."""
    x = x0 + np.arange(n, dtype=np.float64) * stride + (stride - 1) / 2
    x.flags.writeable = False
    return x


def stroke_offsets(width: float) -> list[tuple[int, int]]:
    """Device-pixel offsets of the 1-px strokes that draw a line ``width`` px wide.

    A diagonal brush: n strokes one pixel apart in x and y thicken horizontal, vertical and
    rising lines to n px (only a line falling at exactly 45° stays thinner), at n strokes, not n².
    """
    n = max(1, int(round(width)))
    return [(k, k) for k in range(n)]


def dash_points(x: np.ndarray, y: np.ndarray, px: tuple[float, float], pattern: tuple[float, ...],
                pairs: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The dashes of the polyline ``x, y`` as solid pieces: points and pyqtgraph's ``connect`` array.

    Qt dashes a clipped line from another phase than the whole line, so a dashed curve could not
    repaint a strip. Here the pattern (device pixels, on/off alternating, from the first point) is
    laid along the line's length in device pixels once, in item coordinates: a strip drawn with a
    solid pen then shows the whole line's pixels, and a point appended moves only the dashes after
    it. ``pairs``: only segments 2k → 2k+1 are drawn (``connect="pairs"``). None: nothing to dash.
    """
    period = float(sum(pattern))
    if len(x) < 2 or not period > 0 or len(pattern) % 2:
        return None
    # A piece is stroked from the pixel at its start to the one at its end, both lit: an "on" part of
    # n pixels is a piece n - 1 long (a dot, a point), its gap one longer, as Qt's dasher counts them.
    pairs_ = [(max(on - 1.0, 1e-3), on + off) for on, off in zip(pattern[0::2], pattern[1::2], strict=True)]
    pattern = tuple(v for on, both in pairs_ for v in (on, both - on))
    dx = np.diff(x) / px[0]
    dy = np.diff(y) / px[1]
    seg = np.hypot(dx, dy)
    drawn = np.isfinite(seg)
    if pairs:
        drawn[1::2] = False
    seg = np.where(drawn, seg, 0.0)
    along = np.concatenate([[0.0], np.cumsum(seg)])
    total = along[-1]
    if not total > 0:
        return None
    starts = np.concatenate([[0.0], np.cumsum(pattern)[:-1]])
    edges = (np.arange(int(total // period) + 1)[:, None] * period + starts[None, :]).ravel()
    edges = edges[(edges > 0) & (edges < total)]
    # Each edge lies on the segment that reaches past it (a drawn one: an undrawn segment has no length).
    i = np.clip(np.searchsorted(along, edges, side="right") - 1, 0, len(seg) - 1)
    t = (edges - along[i]) / np.where(seg[i] > 0, seg[i], 1.0)
    ex = x[i] + t * (x[i + 1] - x[i])
    ey = y[i] + t * (y[i + 1] - y[i])
    # The line's own points and the edges, in order along it (a point first where both fall together).
    order = np.argsort(np.concatenate([along, edges]), kind="stable")
    s = np.concatenate([along, edges])[order]
    px_ = np.concatenate([x, ex])[order]
    py_ = np.concatenate([y, ey])[order]
    # A piece is drawn when it lies on a drawn segment and its middle falls in an "on" part.
    seg_of = np.concatenate([np.arange(len(x)), i])[order]  # the segment a point starts (an edge: its own)
    piece_seg = np.minimum(seg_of[:-1], len(seg) - 1)
    mid = ((s[:-1] + s[1:]) / 2) % period
    on = (np.searchsorted(np.cumsum(pattern), mid, side="right") % 2 == 0) & (s[1:] > s[:-1]) & drawn[piece_seg]
    keep = np.zeros(len(s), dtype=bool)
    keep[:-1] |= on
    keep[1:] |= on
    if not keep.any():
        return None
    connect = np.append(on, False)[keep]
    return px_[keep], py_[keep], connect


class WindowPrefix:
    """How many leading points of a window's curve are the previous frame's (``Curve.setData``).

    Rows of a record never change once written, and a pyramid bin changes only while it is the
    last one: at the same first column and stride, every column but the previous last is the
    same. A forced redraw resets the curves' keys, so a new record never reuses a prefix.
    """

    __slots__ = ("_last",)

    def __init__(self):
        self._last: tuple | None = None

    def points(self, x0: int, stride: int, hi: np.ndarray, lo: np.ndarray | None) -> int:
        last, self._last = self._last, (x0, stride, len(hi))
        if last is None or last[:2] != (x0, stride):
            return 0
        per = 2 if stride > 1 and lo is not None else 1  # series.envelope: a min/max pair per bin
        return per * max(min(last[2], len(hi)) - 1, 0)


class Curve(GrowingItem):
    """A curve from x/y arrays (``connect``: "finite" breaks at NaN, "pairs" draws segments).

    ``fill_level``/``brush`` fill the area down to that level (the memory lane's stack). ``opts``
    carries what a legend sample reads (graphics/legend.py); ``sigStyleChanged`` tells it the pen changed.
    """

    sigStyleChanged = QtCore.Signal()

    def __init__(self, pen, name: str | None = None, connect: str = "finite",
                 fill_level: float | None = None, brush=None):
        super().__init__()
        self.opts = {"pen": pg.mkPen(pen), "name": name, "connect": connect, "fillLevel": fill_level,
                     "fillBrush": pg.mkBrush(brush) if brush is not None else None, "antialias": False,
                     "symbol": None}
        self._x = np.zeros(0)
        self._y = np.zeros(0)
        self._pending: tuple | None = None  # a window whose x/y are made only when asked for (set_bins)
        self._key: tuple | None = None  # what the current path shows, quantised to sub-pixels
        self._path: QtGui.QPainterPath | None = None
        self._dashes_made = False  # the path holds the dashes themselves (stroked with a solid pen)
        self._fill: QtGui.QPainterPath | None = None
        self._bounds = QtCore.QRectF()
        self._memo = ZoomMemo()  # (window, column, pixel size…) → (its data, what was drawn)
        self._set_strokes()
        # No pixmap cache: a live frame changes every curve anyway, and a cached item paints a strip
        # into a pixmap of the strip's size, where Qt's stroker cuts a sloped line at the pixmap's
        # edge and can step it a pixel off a full repaint's. Painted on the view, clipped, a strip
        # is exact (tests/gui/graphics/test_curve_strips.py), at the same cost (docs/redraw.md).

    # -- the parts the legend and pyqtgraph's view box use -----------------------------------------
    def name(self) -> str | None:
        return self.opts["name"]

    def setPen(self, pen) -> None:
        self.opts["pen"] = pg.mkPen(pen)
        pattern = self._pattern
        self._set_strokes()
        if self._pattern != pattern and self._key is not None:  # dashes on or off: the path itself changes
            self._materialise()
            self._memo = ZoomMemo()
            self._rebuild()
        self.update()
        self.sigStyleChanged.emit()

    def getData(self) -> tuple[np.ndarray, np.ndarray]:
        self._materialise()
        return self._x, self._y

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange=None):
        self._materialise()
        v = self._x if ax == 0 else self._y
        v = v[np.isfinite(v)]
        if ax == 1 and self.opts["fillLevel"] is not None:
            v = np.append(v, self.opts["fillLevel"])
        return (float(v.min()), float(v.max())) if len(v) else (None, None)

    # -- data ---------------------------------------------------------------------------------
    def setData(self, x, y, connect: str | None = None, same_prefix: int = 0,
                px: tuple[float, float] | None = None, per: int = 0) -> bool:
        """Take new arrays; True when the picture changed (and a repaint was asked for).

        ``same_prefix``: the caller knows the first points equal the previous call's (an
        append-only record seen at the same zoom, so only the last bin moves), so only the rest
        is quantised and compared; a live frame then costs a few points, not the whole curve.
        ``px``: the view box's ``pixel_size``, when the caller took it once for several curves.
        ``per``: ``x`` is ``series.envelope``'s with this many points a bin (ascending, finite), so
        the path is built without the checks for a zigzag, unordered or non-finite ``x``.
        """
        if connect is not None:
            self.opts["connect"] = connect
        px = px or pixel_size(self)
        meta = (px, self.opts["connect"])
        old = self._key
        if old is not None and old[1] is None and old[0] == meta:
            self._key_of()  # (made from the arrays it was drawn from, before they are replaced)
        self._pending = None
        self._x = np.asarray(x, dtype=np.float64)
        self._y = np.asarray(y, dtype=np.float64)
        if px is None or not len(self._x):
            self._key = None
            self._rebuild(px, per)
            return True
        k = min(same_prefix, len(self._x), len(old[1])) if old is not None and old[0] == meta else 0
        qx = np.rint(self._x[k:] * (QUANTUM / px[0]))
        qy = np.rint(self._y[k:] * (QUANTUM / px[1]))
        # Bytes, not np.array_equal: the same for NaN gaps, and a tenth of its overhead on a
        # few points (a -0.0 against 0.0 only redraws once more).
        if old is not None and old[0] == meta and len(old[1]) == len(self._x) \
                and qx.tobytes() == old[1][k:].tobytes() and qy.tobytes() == old[2][k:].tobytes():
            return False
        if k:
            qx, qy = np.concatenate([old[1][:k], qx]), np.concatenate([old[2][:k], qy])
        self._key = [meta, qx, qy]
        # Points before k are the last frame's: the path changes from the segment that ends at point k.
        strip = bool(k)
        self._rebuild(px, per, changed_from=float(self._x[k - 1]) - (len(self._offsets) + 1) * px[0] if strip else None)
        return True

    def set_bins(self, win: tuple, col: int, same_prefix: int, px: tuple[float, float] | None,
                 gaps: bool = False) -> bool:
        """``setData(*envelope(*win, col))``, and ``np.nan`` for negative values when ``gaps``.

        On a live frame only the last bin or two moved, usually by less than a quarter pixel:
        their quantised points are compared in plain Python first, and the curve's arrays are
        made only when it is redrawn or asked for (numpy's per-call cost is most of a small curve's).
        """
        x0, stride, hi, lo = win
        old = self._key
        per = 2 if stride > 1 and lo is not None else 1
        meta = (px, self.opts["connect"])
        if same_prefix and px is not None and old is not None and old[0] == meta \
                and per * len(hi) == len(old[1] if old[1] is not None else self._key_of()[1]) \
                and same_prefix <= len(old[1]):
            b0 = same_prefix // per
            sx, sy = QUANTUM / px[0], QUANTUM / px[1]
            xs, ys = [], []
            for j, h in enumerate(hi[b0:, col].tolist()):
                xs.append(x0 + (b0 + j) * stride + (stride - 1) / 2)
                ys.append(h)
            if per == 2:
                xs = [v for v in xs for _ in (0, 1)]
                ys = [v for pair in zip(lo[b0:, col].tolist(), ys) for v in pair]
            k = b0 * per
            if not any(gaps and v < 0 for v in ys) \
                    and [round(v * sx) for v in xs] == old[1][k:].tolist() \
                    and [round(v * sy) for v in ys] == old[2][k:].tolist():
                self._pending = (win, col, gaps)
                return False
        # A window drawn before (a zoom back out, a theme change): its data unchanged, its path is
        # taken back instead of making the envelope, quantising it and building the path again.
        # Not on a live frame (the same view, one bin further): its data are new by definition.
        memo_key = data = None
        if px is not None and (not same_prefix or old is None):
            memo_key = (x0, stride, len(hi), col, gaps, px, self.opts["connect"], len(self._offsets), self._pattern)
            data = hi[:, col].tobytes() + (lo[:, col].tobytes() if per == 2 else b"")
            hit = self._memo.get(memo_key)
            if hit is not None and hit[0] == data:
                if hit[1][2] is self._key:  # what is drawn already
                    return False
                self._restore(hit[1])
                return True
            if per == 2 and (old is None or old[0] != meta) and self._set_within(x0, stride, hi.dtype, data, gaps, px):
                self._memo.put(memo_key, (data, self._drawn()))
                return True
        x, y = envelope(*win, col)
        if gaps:
            y = np.where(y < 0, np.nan, y)
        changed = self.setData(x, y, same_prefix=same_prefix, px=px, per=per)
        if memo_key is not None:
            self._memo.put(memo_key, (data, self._drawn()))
        return changed

    def _set_within(self, x0: int, stride: int, dtype, data: bytes, gaps: bool, px: tuple[float, float]) -> bool:
        """``set_bins``' build when every bin is within a pixel, as in a whole run's view; False otherwise.

        ``_rebuild`` then draws each bin's high point only: that curve is made from the bins' centres
        and highs, without the zigzag, its quantised key or the finiteness checks (a bin within a
        pixel has two finite points). The zigzag and the key are made from ``data`` (the window's
        columns, a copy) when they are first asked for.
        """
        n = len(data) // (2 * np.dtype(dtype).itemsize)
        if n < 2 or self.opts["connect"] not in ("all", "finite"):
            return False
        hi = np.frombuffer(data, dtype=dtype, count=n)
        lo = np.frombuffer(data, dtype=dtype, offset=n * hi.itemsize)
        y, low = hi.astype(np.float64, copy=False), lo.astype(np.float64, copy=False)
        if gaps:
            y, low = np.where(y < 0, np.nan, y), np.where(low < 0, np.nan, low)
        if not np.abs(y - low).max() < px[1]:  # (a NaN or an infinity fails it too)
            return False
        x = bin_centres(x0, stride, n)
        self._pending = ((x0, stride, hi[:, None], lo[:, None]), 0, gaps)
        self._key = [(px, self.opts["connect"]), None, None]
        dashed = self._dashed(x, y, px)
        self._path = dashed if dashed is not None else pg.arrayToQPath(x, y, connect="all", finiteCheck=False)
        level = self.opts["fillLevel"]
        self._fill = None
        if level is not None and self.opts["fillBrush"] is not None:
            fx = np.concatenate([x[:1], x, x[-1:]])
            fy = np.concatenate([[level], y, [level]])
            self._fill = pg.arrayToQPath(fx, fy, connect="all", finiteCheck=not math.isfinite(level))
            self._fill.closeSubpath()
        ys = y if level is None else np.append(y, level)
        self._set_bounds(float(x[0]), float(x[-1]), float(ys.min()), float(ys.max()), px)
        self.show_changed(self._bounds)
        return True

    def _drawn(self) -> tuple:
        return self._x, self._y, self._key, self._path, self._fill, self._bounds, self._pending, self._dashes_made

    def _key_of(self) -> list | None:
        """The key of what is drawn, its quantised points made on first use (``_set_within``)."""
        key = self._key
        if key is not None and key[1] is None:
            self._materialise()
            px = key[0][0]
            key[1] = np.rint(self._x * (QUANTUM / px[0]))
            key[2] = np.rint(self._y * (QUANTUM / px[1]))
        return key

    def _restore(self, drawn: tuple) -> None:
        self._x, self._y, self._key, self._path, self._fill, self._bounds, self._pending, self._dashes_made = drawn
        self.show_changed(self._bounds)

    def _materialise(self) -> None:
        if self._pending is not None:
            win, col, gaps = self._pending
            self._pending = None
            x, y = envelope(*win, col)
            self._x = x
            self._y = np.where(y < 0, np.nan, y) if gaps else y

    def invalidate(self) -> None:
        """Forget what is shown: the next ``setData``/``set_bins`` repaints (from the memo when it can)."""
        self._key = None

    def _rebuild(self, px: tuple[float, float] | None = None, per: int = 0, changed_from: float | None = None) -> None:
        x, y = self._x, self._y
        if not len(x):
            self._path = self._fill = None
            self._bounds = QtCore.QRectF()
            self.show_changed(self._bounds)
            return
        px = px or pixel_size(self)
        if px is not None and self.opts["connect"] != "pairs" and len(x) >= 4 and len(x) % 2 == 0 \
                and (per == 2 if per else np.array_equal(x[0::2], x[1::2])):
            # A min/max zigzag (series.envelope): a bin whose two points are within a pixel gets
            # one point, its max. The same pixels, half the points to stroke.
            lows = ~(np.abs(y[1::2] - y[0::2]) < px[1])  # (NaN pairs are kept)
            if not lows.any():  # (every bin within a pixel, as in a whole run's view: no mask to apply)
                x, y = x[1::2], y[1::2]
            else:
                keep = np.ones(len(x), dtype=bool)
                keep[0::2] = lows
                x, y = x[keep], y[keep]
        ok = np.isfinite(y)
        # An envelope's x is finite: with every y finite too, 'all' and 'finite' give pyqtgraph's
        # path for finite points, without its checks.
        finite = bool(per) and bool(ok.all()) and self.opts["connect"] in ("all", "finite")
        dashed = self._dashed(x, y, px)
        self._path = dashed if dashed is not None else pg.arrayToQPath(x, y, connect="all", finiteCheck=False) \
            if finite else pg.arrayToQPath(x, y, connect=self.opts["connect"])
        level = self.opts["fillLevel"]
        self._fill = None
        if level is not None and self.opts["fillBrush"] is not None:
            fx = np.concatenate([x[:1], x, x[-1:]])
            fy = np.concatenate([[level], y, [level]])
            self._fill = pg.arrayToQPath(fx, fy, connect="all", finiteCheck=not (finite and math.isfinite(level)))
            self._fill.closeSubpath()
        if not ok.any():
            self._bounds = QtCore.QRectF()
        else:
            ys = y if finite else y[ok]
            ys = ys if level is None else np.append(ys, level)
            x0, x1 = (float(x[0]), float(x[-1])) if per else (float(x.min()), float(x.max()))
            self._set_bounds(x0, x1, float(ys.min()), float(ys.max()), px)
        self.show_changed(self._bounds, changed_from)

    def _dashed(self, x: np.ndarray, y: np.ndarray, px: tuple[float, float] | None) -> QtGui.QPainterPath | None:
        """The dashes as a solid path (``dash_points``); None for a solid pen, or outside a view (Qt's dashes then)."""
        self._dashes_made = False
        if not self._pattern or px is None or pg.getConfigOption("antialias"):  # (figures: the real pen)
            return None
        d = dash_points(x, y, px, self._pattern, pairs=self.opts["connect"] == "pairs")
        self._dashes_made = True
        return QtGui.QPainterPath() if d is None else pg.arrayToQPath(*d[:2], connect=d[2], finiteCheck=False)

    def _set_bounds(self, x0: float, x1: float, y0: float, y1: float, px: tuple[float, float] | None) -> None:
        px = px or (0.0, 0.0)
        m = len(self._offsets) + 1  # the strokes reach this many pixels past the points
        self._bounds = QtCore.QRectF(x0 - m * px[0], y0 - m * px[1], x1 - x0 + 2 * m * px[0], y1 - y0 + 2 * m * px[1])

    # -- painting -----------------------------------------------------------------------------
    def _set_strokes(self) -> None:
        pen = QtGui.QPen(self.opts["pen"])
        self._offsets = stroke_offsets(pen.widthF()) if pen.style() != QtCore.Qt.PenStyle.NoPen else []
        pen.setWidthF(1.0)
        pen.setCosmetic(True)
        # A dashed pen's dashes are made in the path (``dash_points``) and stroked solid, so that a
        # strip repaints as the whole line would; the 1-px pen's pattern is in device pixels.
        style = pen.style()
        self._pattern = tuple(pen.dashPattern()) if style not in (QtCore.Qt.PenStyle.SolidLine,
                                                                   QtCore.Qt.PenStyle.NoPen) else ()
        self._thin = pen
        self._solid = QtGui.QPen(pen)
        self._solid.setStyle(QtCore.Qt.PenStyle.SolidLine)

    def paint(self, p, *args) -> None:
        if self._path is None:
            return
        if self._fill is not None:
            p.fillPath(self._fill, self.opts["fillBrush"])
        if not self._offsets:
            return
        if pg.getConfigOption("antialias"):  # exported figures: the real pen, smooth
            p.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing, True)
            p.setPen(self.opts["pen"])
            p.drawPath(self._path)
            return
        p.setPen(self._solid if self._dashes_made else self._thin)
        if len(self._offsets) == 1:
            p.drawPath(self._path)
            return
        t = p.transform()
        for dx, dy in self._offsets:
            p.setTransform(t * QtGui.QTransform.fromTranslate(dx, dy))
            p.drawPath(self._path)
        p.setTransform(t)
