"""The lanes' axes: values, bytes, steps and layer kinds, with tick labels measured once per string."""

from __future__ import annotations

import bisect
import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from kvinspect.core.units import byte_scale
from kvinspect.gui.base import theme as th
from kvinspect.gui.graphics.view_span import ZoomMemo


class _Measure:
    """What ``AxisItem.generateDrawSpecs`` asks of its painter: the font, and text sizes (cached)."""

    def __init__(self, cache: dict, font: QtGui.QFont):
        self._cache, self._font = cache, font
        self._metrics = QtGui.QFontMetricsF(font)

    def setFont(self, font: QtGui.QFont) -> None:
        if font != self._font:
            self._font, self._metrics = font, QtGui.QFontMetricsF(font)
            self._cache.clear()

    def font(self) -> QtGui.QFont:
        return self._font

    def boundingRect(self, rect, flags, text: str) -> QtCore.QRectF:
        key = (text, int(flags), rect.width(), rect.height())
        if key not in self._cache:
            self._cache[key] = self._metrics.boundingRect(rect, int(flags), text)
        return QtCore.QRectF(self._cache[key])

    def label_size(self, text: str) -> tuple[float, float]:
        """Width and height of a tick label as pyqtgraph's specs take them (its height × 0.8)."""
        size = self._cache.get(text)
        if size is None:
            r = self._metrics.boundingRect(_PROBE, int(_CENTER), text)
            size = self._cache[text] = (r.width(), r.height() * 0.8)
        return size


_H_ALIGN = QtCore.Qt.AlignmentFlag.AlignHorizontal_Mask
_V_ALIGN = QtCore.Qt.AlignmentFlag.AlignVertical_Mask
_A = QtCore.Qt.AlignmentFlag
_CENTER = _A.AlignCenter
_RIGHT_VCENTER = _A.AlignRight | _A.AlignVCenter | QtCore.Qt.TextFlag.TextDontClip
_LEFT_VCENTER = _A.AlignLeft | _A.AlignVCenter | QtCore.Qt.TextFlag.TextDontClip
_HCENTER_BOTTOM = _A.AlignHCenter | _A.AlignBottom | QtCore.Qt.TextFlag.TextDontClip
_HCENTER_TOP = _A.AlignHCenter | _A.AlignTop | QtCore.Qt.TextFlag.TextDontClip
_PROBE = QtCore.QRectF(0, 0, 100, 100)


def _near(ordered: list[float], v: float, tol: float) -> bool:
    """Whether some value of ``ordered`` is within ``tol`` of ``v`` (``np.abs(a - v) <= tol``)."""
    j = bisect.bisect_left(ordered, v)
    return (j < len(ordered) and abs(ordered[j] - v) <= tol) or (j > 0 and abs(ordered[j - 1] - v) <= tol)


def _painter_size(p, text: str) -> tuple[float, float]:
    r = p.boundingRect(_PROBE, _CENTER, text)
    return r.width(), r.height() * 0.8


class LaneAxis(pg.AxisItem):
    """pyqtgraph's axis, cheaper to regenerate: every zoom regenerates the axes in view.

    * tick labels are measured once per string (font metrics, cached) and drawn as
      ``QStaticText`` (laid out once), not shaped again by ``drawText`` on every regeneration;
    * the ticks and labels are drawn straight from the specs, without recording a ``QPicture``;
    * the title's HTML (a text re-layout and a size check) is set only when it changed:
      pyqtgraph re-sets it on every range change of an axis with an SI prefix;
    * ``generateDrawSpecs`` gives pyqtgraph's specs without its per-tick ``Point`` objects and
      per-label ``boundingRect()`` calls: it was three quarters of an axis' repaint, and a range
      change repaints three axes (tests/gui/lanes/test_lanes_widget.py compares the two).
    """

    def tickValues(self, minVal, maxVal, size):
        """pyqtgraph's tick values; a tick already on a coarser level is dropped by the same test
        (within 1 % of a spacing). In plain Python, the same float operations as its numpy: an axis
        has a dozen or two ticks, and a numpy call costs more than that many Python ones."""
        if self.logMode:
            return super().tickValues(minVal, maxVal, size)
        lo, hi = sorted((minVal, maxVal))
        lo, hi = lo * self.scale, hi * self.scale
        ticks = []
        seen: list[float] = []  # sorted: the nearest coarser tick on each side decides
        for spacing, offset in self.tickSpacing(lo, hi, size):
            start = math.ceil((lo - offset) / spacing) * spacing + offset
            values = [(i * spacing + start) / self.scale for i in range(int((hi - start) / spacing) + 1)]
            if seen:
                tol = spacing / self.scale * 0.01
                values = [v for v in values if not _near(seen, v, tol)]
            seen = sorted(seen + values)
            ticks.append((spacing / self.scale, values))
        return ticks

    def generateDrawSpecs(self, p):
        st = self.style
        if self.grid is not False or st["tickAlpha"] is not None or any(st["stopAxisAtTick"]):
            return super().generateDrawSpecs(p)  # (not used by the lanes: pyqtgraph's own)
        if st["tickFont"] is not None:
            p.setFont(st["tickFont"])
        bounds = self.mapRectFromParent(self.geometry())
        o = self.orientation
        QP = QtCore.QPointF
        if o == "left":
            span = (QP(bounds.right() - 1, bounds.top() - 1), QP(bounds.right() - 1, bounds.bottom() + 1))
            tick_start = tick_stop = bounds.right()
            tick_dir, axis = -1, 0
        elif o == "right":
            span = (QP(bounds.left() + 1, bounds.top() - 1), QP(bounds.left() + 1, bounds.bottom() + 1))
            tick_start = tick_stop = bounds.left()
            tick_dir, axis = 1, 0
        elif o == "top":
            span = (QP(bounds.left() - 1, bounds.bottom() - 1), QP(bounds.right() + 1, bounds.bottom() - 1))
            tick_start = tick_stop = bounds.bottom()
            tick_dir, axis = -1, 1
        else:
            span = (QP(bounds.left() - 1, bounds.top() + 1), QP(bounds.right() + 1, bounds.top() + 1))
            tick_start = tick_stop = bounds.top()
            tick_dir, axis = 1, 1
        vt = self.deviceTransform_()
        if vt is None:
            return None
        d = vt.map(span[1]) - vt.map(span[0])
        length_px = (d.x() ** 2 + d.y() ** 2) ** 0.5  # (as pyqtgraph's Point.length: the same tick spacing)
        if length_px == 0:
            return None
        if self._tickLevels is None:
            levels = self.tickValues(self.range[0], self.range[1], length_px)
            level_strings = None
        else:
            levels = [(None, [v for v, _ in level]) for level in self._tickLevels]
            level_strings = [[s for _, s in level] for level in self._tickLevels]
        lo, hi = self.range
        dif = hi - lo
        if dif == 0:
            scale, offset = 1, 0
        elif axis == 0:
            scale = -bounds.height() / dif
            offset = lo * scale - bounds.height()
        else:
            scale = bounds.width() / dif
            offset = lo * scale
        ends = [lo * scale - offset, hi * scale - offset]
        x_min, x_max = min(ends), max(ends)

        positions: list[list[float | None]] = []
        tick_specs = []
        base_pen = self.tickPen()
        solid = base_pen.brush().style() == QtCore.Qt.BrushStyle.SolidPattern
        for i, (_spacing, ticks) in enumerate(levels):
            length = st["tickLength"] / (i * 0.5 + 1.0)
            pen = base_pen
            if solid:
                pen = QtGui.QPen(base_pen)
                color = QtGui.QColor(pen.color())
                color.setAlpha(int(255 / (i + 1)))
                pen.setColor(color)
            end = tick_stop + length * tick_dir
            row: list[float | None] = []
            for v in ticks:
                x = v * scale - offset
                if x < x_min or x > x_max:
                    row.append(None)
                    continue
                row.append(x)
                if axis == 0:
                    tick_specs.append((pen, QP(tick_start, x), QP(end, x)))
                else:
                    tick_specs.append((pen, QP(x, tick_start), QP(x, end)))
            positions.append(row)
        axis_spec = (self.pen(), span[0], span[1])
        if not st["showValues"]:
            return axis_spec, tick_specs, []

        text_offset = st["tickTextOffset"][axis]
        text_size2 = last_size2 = 0
        along: list[float] = []  # every measured label so far, as pyqtgraph's text_rects
        br = self.boundingRect()
        bl, bt, bw, bh = br.getRect()
        b_right, b_bottom = bl + bw, bt + bh
        far = max(0, st["tickLength"]) + text_offset
        align = {"left": _RIGHT_VCENTER, "right": _LEFT_VCENTER, "top": _HCENTER_BOTTOM}.get(o, _HCENTER_TOP)
        # Labels measured once per string (a _Measure), else through the painter as pyqtgraph does.
        measure = p.label_size if isinstance(p, _Measure) else lambda s: _painter_size(p, s)
        text_specs = []
        for i in range(min(len(levels), st["maxTextLevel"] + 1)):
            if level_strings is None:
                spacing, values = levels[i]
                strings = self.tickStrings(values, self.autoSIPrefixScale * self.scale, spacing)
            else:
                strings = list(level_strings[i])
            if len(strings) == 0:
                continue
            shown = [(x, s, *measure(s)) for x, s in zip(positions[i], strings) if x is not None]
            if shown:
                along += [h for _, _, _, h in shown] if axis == 0 else [w for _, _, w, _ in shown]
                across = max(w for _, _, w, _ in shown) if axis == 0 else max(h for _, _, _, h in shown)
                text_size2 = max(text_size2, across)
            if i > 0:
                fill = float(np.sum(along)) / length_px if along else 0.0
                if any(len(text_specs) >= n and fill >= limit for n, limit in st["textFillLimits"]):
                    break
            last_size2 = text_size2
            for x, s, w, h in shown:
                if o == "left":
                    left, top = tick_stop - far - w, x - h / 2
                elif o == "right":
                    left, top = tick_stop + far, x - h / 2
                elif o == "top":
                    left, top = x - w / 2.0, tick_stop - far - h
                else:
                    left, top = x - w / 2.0, tick_stop + far
                rect = QtCore.QRectF(left, top, w, h)
                # (pyqtgraph's `br & rect != rect`, which compares fuzzily, only where the plain
                # test is not clear: an empty label, or one touching or crossing the bounds)
                inside = w > 0 and h > 0 and bl < left and left + w < b_right and bt < top and top + h < b_bottom
                if not inside and br & rect != rect:
                    continue
                text_specs.append((rect, align, s))
        self._text_size2 = last_size2  # (what a memo hit tells _updateMaxTextSize again)
        self._updateMaxTextSize(last_size2)
        return axis_spec, tick_specs, text_specs

    def pen(self) -> QtGui.QPen:
        # pyqtgraph's copy through mkPen's type checks: a regeneration asks for two pens
        return QtGui.QPen(self._pen) if isinstance(self._pen, QtGui.QPen) else super().pen()

    def tickPen(self) -> QtGui.QPen:
        return QtGui.QPen(self._tickPen) if isinstance(self._tickPen, QtGui.QPen) else super().tickPen()

    def _specs_key(self, font: QtGui.QFont) -> tuple:
        """Everything ``generateDrawSpecs`` reads, for ``paint``'s memo of recent specs."""
        vt = self.deviceTransform_()
        pens = tuple((pen.color().rgba(), pen.widthF(), pen.style().value) for pen in (self.pen(), self.tickPen()))
        return (tuple(self.range), self.mapRectFromParent(self.geometry()).getRect(), self.boundingRect().getRect(),
                None if vt is None else (vt.m11(), vt.m12(), vt.m21(), vt.m22()), id(self._tickLevels),
                repr(self._tickSpacing), self._tickDensity, self.scale, self.autoSIPrefixScale, self.logMode, pens,
                font.key(), self._style_key())

    def _style_key(self) -> str:
        """``repr`` of the style, made again only when it changed (a fifth of the key's cost).

        Compared with a copy of its lists, which pyqtgraph's ``setStyle`` changes in place."""
        snap = self.__dict__.get("_style_snap")
        if snap is None or snap[0] != self.style:
            copy = {k: list(v) if isinstance(v, list) else v for k, v in self.style.items()}
            snap = self._style_snap = (copy, repr(sorted(self.style.items())))
        return snap[1]

    def _updateLabel(self):
        html = self.labelString()
        if html == getattr(self, "_label_html", None):
            self.picture = None
            self.update()
            return
        self._label_html = html
        super()._updateLabel()

    def _static(self, text: str, font: QtGui.QFont) -> tuple[QtGui.QStaticText, QtCore.QSizeF]:
        cache = self.__dict__.setdefault("_statics", {})
        if text not in cache:
            st = QtGui.QStaticText(text)
            st.setTextFormat(QtCore.Qt.TextFormat.PlainText)
            st.prepare(QtGui.QTransform(), font)
            cache[text] = (st, st.size())
        return cache[text]

    def paint(self, p, opt, widget):
        font = self.style["tickFont"] or p.font()
        if self.picture is None:  # ticks, range or size changed (pyqtgraph clears it)
            # The specs of the last few ranges are kept: a zoom back out (or a view alternating
            # between two ranges) finds them, 0.1 ms an axis. Tick levels set by hand are held
            # by the memo, so their id names them.
            memo = self.__dict__.setdefault("_specs_memo", ZoomMemo())
            key = self._specs_key(font)
            hit = memo.get(key)
            if hit is not None and hit[0] is self._tickLevels:
                self._specs = hit[1]
                self._updateMaxTextSize(hit[2])
            else:
                measure = _Measure(self.__dict__.setdefault("_measured", {}), font)
                self._text_size2 = None
                self._specs = self.generateDrawSpecs(measure)
                font = measure.font()
                if self._text_size2 is not None:  # (the lean specs, not pyqtgraph's)
                    memo.put(key, (self._tickLevels, self._specs, self._text_size2))
            if font != getattr(self, "_static_font", None):
                self._static_font = font
                self.__dict__["_statics"] = {}
            self.picture = True  # (pyqtgraph only tests it for None)
        specs = getattr(self, "_specs", None)
        if specs is None:
            return
        axis_spec, tick_specs, text_specs = specs
        p.setRenderHint(p.RenderHint.Antialiasing, False)
        p.setRenderHint(p.RenderHint.TextAntialiasing, True)
        pen, p1, p2 = axis_spec
        p.setPen(pen)
        p.drawLine(p1, p2)
        for pen, p1, p2 in tick_specs:
            p.setPen(pen)
            p.drawLine(p1, p2)
        if not text_specs:
            return
        p.setFont(self._static_font)
        p.setPen(self.textPen())
        p.setClipRect(self.boundingRect().toAlignedRect())
        for rect, flags, text in text_specs:
            st, size = self._static(text, self._static_font)
            h, v = int(flags) & int(_H_ALIGN), int(flags) & int(_V_ALIGN)
            if h & int(QtCore.Qt.AlignmentFlag.AlignRight):
                x = rect.right() - size.width()
            elif h & int(QtCore.Qt.AlignmentFlag.AlignHCenter):
                x = rect.center().x() - size.width() / 2
            else:
                x = rect.left()
            if v & int(QtCore.Qt.AlignmentFlag.AlignBottom):
                y = rect.bottom() - size.height()
            elif v & int(QtCore.Qt.AlignmentFlag.AlignVCenter):
                y = rect.center().y() - size.height() / 2
            else:
                y = rect.top()
            p.drawStaticText(QtCore.QPointF(x, y), st)


class ValueAxis(LaneAxis):
    """An axis with labelled major ticks and one level of minor ticks, not pyqtgraph's three.

    Every zoom regenerates the axes in view, and each tick costs two points and a line: the
    third level was two thirds of the ticks of a step axis (and the grid never drew it).
    """

    def tickSpacing(self, minVal, maxVal, size):
        return super().tickSpacing(minVal, maxVal, size)[:2]


class BytesAxis(ValueAxis):
    """Ticks at round numbers of one binary unit (0, 50 KiB, 100 KiB…), labelled with it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.enableAutoSIPrefix(False)  # the tick labels carry the unit; no "(x1e+09)" on the label

    @staticmethod
    def _scale(lo: float, hi: float) -> tuple[float, str]:
        # From the span, not the magnitude: 1.076–1.082 GiB reads better as 1102…1108 MiB.
        return byte_scale(abs(hi - lo) or max(abs(lo), abs(hi), 1.0))

    def tickSpacing(self, minVal, maxVal, size):
        u, _ = self._scale(minVal, maxVal)
        return [(a * u, b * u) for a, b in super().tickSpacing(minVal / u, maxVal / u, size)]

    def tickStrings(self, values, scale, spacing):
        if not values:
            return []
        u, unit = self._scale(*sorted(self.range))  # the same view range tickSpacing saw
        step = spacing / u if spacing else 1
        digits = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
        return [f"{v / u:.{digits}f} {unit}" if v else "0" for v in values]


class StepAxis(ValueAxis):
    """The forward-pass axis of the window's lanes and of the report figures: whole step ticks from 0.

    The view may reach left of step 0 (the report's layer-kind strip, padding), where pyqtgraph's
    default ticks would label ``-1``; a short trace would get ``0.5`` steps, which do not exist;
    and SI scaling (``k`` for thousands) reads wrong for steps: labels are integers, ``1,000``.
    """

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.enableAutoSIPrefix(False)

    def tickValues(self, minVal, maxVal, size):
        levels = [(spacing, [v for v in values if v >= 0 and float(v).is_integer()])
                  for spacing, values in super().tickValues(minVal, maxVal, size) if spacing >= 1]
        levels = [(spacing, values) for spacing, values in levels if values]
        if not levels and math.isfinite(minVal) and math.isfinite(maxVal):
            # Zoomed into a step or two (or a two-step trace): the default spacing was below a step.
            lo, hi = max(0, math.ceil(minVal)), math.floor(maxVal)
            levels = [(1.0, [float(v) for v in range(lo, hi + 1)])] if hi - lo < 1000 else []
        return levels

    def tickStrings(self, values, scale, spacing):
        return [f"{int(round(v)):,}" if abs(v - round(v)) < 1e-6 else "" for v in values]


class LayerAxis(LaneAxis):
    """The heatmap's layer axis, with each layer's kind as a colour chip right next to its row."""

    CHIP = 7

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.colors: list[QtGui.QColor] = []
        self.enableAutoSIPrefix(False)
        self.setStyle(tickLength=0, tickTextOffset=self.CHIP + 5)  # labels clear of the chips

    def set_kinds(self, kinds: list[str]) -> None:
        self.colors = [QtGui.QColor(th.kind_color(k)) for k in kinds]
        self.update()

    def paint(self, p, opt, widget) -> None:
        super().paint(p, opt, widget)
        view = self.linkedView()
        if view is None or not self.colors:
            return
        y0, y1 = view.viewRange()[1]
        h = self.geometry().height()
        if y1 <= y0 or h <= 0:
            return
        inverted = view.yInverted()

        def to_px(v: float) -> float:
            f = (v - y0) / (y1 - y0)
            return f * h if inverted else (1 - f) * h

        x = self.geometry().width() - self.CHIP
        for i, c in enumerate(self.colors):
            a, b = sorted((to_px(i), to_px(i + 1)))
            if b < 0 or a > h:
                continue
            p.fillRect(QtCore.QRectF(x, a, self.CHIP, max(b - a, 1.0)), c)


LAYER_LABEL_GAP = 14  # px between layer labels, at least


def layer_ticks(n_layers: int, px_height: float) -> list:
    """Major ticks at layer centres, thinned so labels never overlap (≥ LAYER_LABEL_GAP px apart)."""
    if n_layers <= 0:
        return [[]]
    per = max(px_height, 1.0) / n_layers
    every = next((e for e in (1, 2, 5, 10, 20, 50, 100, 200, 500) if per * e >= LAYER_LABEL_GAP), 1000)
    return [[(i + 0.5, str(i)) for i in range(0, n_layers, every)]]
