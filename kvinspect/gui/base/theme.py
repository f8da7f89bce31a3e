"""Dark and light themes: the Qt palette, plot colours, and the colours that carry meaning.

The one palette of the project: the window's plots and panels and the report figures
(:mod:`kvinspect.gui.report_images.trace_figures`, :mod:`kvinspect.gui.report_images.compare_figures`) all take their colours from here, so a full
layer, a warning or the RSS curve look the same in the window and in a report.

Meaningful colours (layer kinds, severities, checklist status, memory series, devices,
compared configurations) are the same in both themes and were picked to stay readable on a
dark and a white background; only backgrounds, text, grid and the seen/stored curves change
with the theme. Report figures are drawn on white, in :data:`REPORT` (the light theme).
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6 import QtCore, QtGui, QtWidgets

from kvinspect.core.cache import layer_kinds

#: Layer kinds (core.cache.layer_kinds) by what the cache does (static-*/quantized map onto their attention).
KIND_COLORS = {
    "full": "#4C8DF6",
    "sliding": "#F28C28",
    "chunked": "#B36AF5",
    "state": "#21B3A1",  # recurrent/conv state, no token axis (older traces say "linear")
    "shared": "#8A8F98",  # reads another layer's K/V, stores none
    "indexed": "#A9E34B",  # sparse attention with an indexer-key cache (DSA)
}
#: The vocabulary's order, legend words and base kind, under the names the window uses.
KIND_ORDER = layer_kinds.KINDS
KIND_LEGEND = layer_kinds.LEGEND
kind_base = layer_kinds.base_kind
#: Anything without a colour of its own (an unknown severity or status).
NEUTRAL = "#8A8F98"

SEVERITY_COLORS = {"info": "#3D9BE9", "warn": "#E3A008", "error": "#E5484D"}
SEVERITY_ORDER = ("info", "warn", "error")
STATUS_COLORS = {"pass": "#2DA44E", "warn": "#D29922", "fail": "#E5484D", "running": NEUTRAL}
#: Text drawn on a STATUS/SEVERITY badge: dark on amber, white elsewhere.
BADGE_TEXT = {"#E3A008": "#1B1B1B", "#D29922": "#1B1B1B"}

#: Event kinds drawn as markers: (pyqtgraph symbol, colour). Kinds not listed use their severity.
EVENT_MARKERS = {
    "window_reached": ("o", "#F28C28"),
    "chunk_reached": ("o", "#B36AF5"),
    "cache_recreated": ("t1", "#E5484D"),
    "duplicate_context": ("d", "#FF6FB5"),
    "prefix_divergence": ("t", "#E3A008"),
    "config_override": ("s", "#3DC2EC"),
    "cache_disabled": ("x", "#E5484D"),
    "unbounded_window": ("star", "#E3A008"),
    "cache_fed_without_use_cache": ("p", "#E5484D"),
    "turn_failed": ("x", "#FF3B3B"),
    "turn_stopped": ("h", "#8A8F98"),
    "context_limit": ("arrow_up", "#E3A008"),
}

#: The lines where generate() cropped a verification forward's rejected drafts off the cache (assisted and
#: prompt-lookup decoding): a stored dip that is neither an eviction nor a new cache.
DRAFT_REJECTED_COLOR = "#4FB6C9"
DRAFT_REJECTED_LABEL = "draft rejected"

#: Devices in the memory plot: CPU grey-blue, accelerators green shades, others cycled.
DEVICE_COLORS = ("#6C8EBF", "#2DA44E", "#7DD87D", "#C9A227", "#B36AF5", "#21B3A1")
#: Process memory series: RSS, the accelerator allocator's allocated and reserved bytes.
RSS_COLOR = "#C678DD"
ALLOC_COLOR = "#E5C07B"
RESERVED_COLOR = "#D19A66"
#: One colour per compared configuration, in the order compare.json lists them.
CONFIG_COLORS = ("#1F77B4", "#D62728", "#2CA02C", "#FF7F0E", "#9467BD", "#8C564B", "#E377C2", "#17BECF",
                 "#7F7F7F", "#BCBD22")


def kind_color(kind: str | None) -> str:
    return KIND_COLORS[kind_base(kind)]


def severity_color(severity: str | None) -> str:
    return SEVERITY_COLORS.get(severity or "", NEUTRAL)


def status_color(status: str | None) -> str:
    return STATUS_COLORS.get(status or "", NEUTRAL)


def device_color(device: str, index: int) -> str:
    """``cpu`` keeps the first colour; the other devices cycle through the rest (``index``: stack order)."""
    return DEVICE_COLORS[0] if device == "cpu" else DEVICE_COLORS[1 + index % (len(DEVICE_COLORS) - 1)]


def badge_text_color(bg: str) -> str:
    return BADGE_TEXT.get(bg, "#FFFFFF")


@dataclass(frozen=True)
class Theme:
    name: str
    window: str
    base: str
    alt_base: str
    text: str
    dim_text: str
    button: str
    highlight: str
    plot_bg: str
    plot_fg: str
    grid_alpha: float
    turn_line: str
    cursor: str
    region: str  # veil + hatch over cells whose layer stopped growing; "#RRGGBBAA" (pyqtgraph order)
    seen: str  # Σ/mean seen tokens (drawn dashed)
    stored: str  # Σ/mean stored tokens (drawn solid)


DARK = Theme(
    name="dark", window="#1F2023", base="#16171A", alt_base="#1B1C20", text="#E4E6EB", dim_text="#9AA0A6",
    button="#2A2C31", highlight="#3D7EFF", plot_bg="#131417", plot_fg="#C3C7CE", grid_alpha=0.18,
    turn_line="#9AA0A6", cursor="#FFD60A", region="#FFFFFF40", seen="#C3C7CE", stored="#C3C7CE",
)
LIGHT = Theme(
    name="light", window="#F3F4F6", base="#FFFFFF", alt_base="#F7F8FA", text="#1F2328", dim_text="#59636E",
    button="#E9EBEF", highlight="#2F6FEB", plot_bg="#FFFFFF", plot_fg="#30363D", grid_alpha=0.22,
    turn_line="#6E7781", cursor="#D97706", region="#FFFFFF55", seen="#30363D", stored="#30363D",
)
THEMES = {"dark": DARK, "light": LIGHT}
#: What View offers and the settings store: "system" (the default) follows the desktop's scheme.
CHOICES = ("system", "dark", "light")
#: Report figures are drawn on white: the light theme's variants.
REPORT = LIGHT


def system_scheme() -> str:
    """``"light"`` or ``"dark"`` as the desktop says (Qt's style hints); ``"dark"`` when it does not say.

    Dark when unknown: a desktop that reports no scheme (the offscreen platform, a bare X server)
    gets the look kvinspect had before it could follow the system.
    """
    app = QtGui.QGuiApplication.instance()
    hints = app.styleHints() if app is not None else None
    scheme = getattr(hints, "colorScheme", None)  # Qt >= 6.5
    if scheme is not None and scheme() == QtCore.Qt.ColorScheme.Light:
        return "light"
    return "dark"


def get(name: str) -> Theme:
    """The theme for a stored choice: ``system`` resolves to the desktop's scheme now."""
    if name == "system":
        name = system_scheme()
    return THEMES.get(name, DARK)


def apply_palette(app: QtWidgets.QApplication, theme: Theme) -> None:
    """Fusion + a full palette: readable in either theme whatever the desktop's own style is."""
    app.setStyle("Fusion")
    c = QtGui.QColor
    p = QtGui.QPalette()
    role, grp = QtGui.QPalette.ColorRole, QtGui.QPalette.ColorGroup
    p.setColor(role.Window, c(theme.window))
    p.setColor(role.WindowText, c(theme.text))
    p.setColor(role.Base, c(theme.base))
    p.setColor(role.AlternateBase, c(theme.alt_base))
    p.setColor(role.Text, c(theme.text))
    p.setColor(role.Button, c(theme.button))
    p.setColor(role.ButtonText, c(theme.text))
    p.setColor(role.ToolTipBase, c(theme.base))
    p.setColor(role.ToolTipText, c(theme.text))
    p.setColor(role.PlaceholderText, c(theme.dim_text))
    p.setColor(role.Highlight, c(theme.highlight))
    p.setColor(role.HighlightedText, c("#FFFFFF"))
    p.setColor(role.Link, c(theme.highlight))
    p.setColor(role.BrightText, c("#FF5555"))
    dark = theme.name == "dark"
    p.setColor(role.Light, c("#3A3D44" if dark else "#FFFFFF"))
    p.setColor(role.Midlight, c("#303238" if dark else "#E3E5E8"))
    p.setColor(role.Mid, c("#2A2C31" if dark else "#C9CDD2"))
    p.setColor(role.Dark, c("#101113" if dark else "#A0A5AB"))
    p.setColor(role.Shadow, c("#000000" if dark else "#7A7F85"))
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(grp.Disabled, r, c("#6B7078" if dark else "#A4AAB0"))
    p.setColor(grp.Disabled, role.Button, c("#24262A" if dark else "#EEF0F2"))
    app.setPalette(p)
    # Tooltips keep the platform's own colours in some styles; say it once here.
    sheet = f"QToolTip {{ color: {theme.text}; background: {theme.base}; border: 1px solid {theme.dim_text}; }}"
    if dark:
        # Fusion draws indicator outlines a shade off the window colour: invisible on a dark window.
        border, on = "#8A9099", theme.highlight
        sheet += (
            f"QCheckBox::indicator, QRadioButton::indicator {{ width: 12px; height: 12px;"
            f" border: 1px solid {border}; background: {theme.base}; }}"
            f"QRadioButton::indicator {{ border-radius: 7px; }}"
            f"QCheckBox::indicator:checked {{ background: {on}; border-color: {on};"
            f" image: url({_check_svg()}); }}"
            f"QRadioButton::indicator:checked {{ background: qradialgradient(cx:0.5, cy:0.5, radius:0.5,"
            f" fx:0.5, fy:0.5, stop:0 #FFFFFF, stop:0.45 #FFFFFF, stop:0.55 {on}, stop:1 {on}); border-color: {on}; }}"
            f"QCheckBox::indicator:disabled, QRadioButton::indicator:disabled {{ border-color: #4A4E55; }}"
        )
    app.setStyleSheet(sheet)


def _check_svg() -> str:
    """A white tick for checked boxes (stylesheets draw no tick of their own once the indicator is styled)."""
    from kvinspect.gui.base.resources import resource_path

    return str(resource_path("icons/check-white.svg")).replace("\\", "/")
