"""A window's remembered (or default) geometry, fitted to the screens there are now.

The default size and a size saved on a bigger monitor can be larger than this screen (a 1366 × 768
laptop, a 1280-px Xvfb), and a position saved on a monitor that is gone can be off every screen.
Some window managers fit such a window themselves; others don't, and neither does X without one
(Xvfb): the window opens cut off at the screen's edge, and a toolbar button and the panels' text are
lost, in the window and in every screenshot of it.
"""

from __future__ import annotations

from PySide6 import QtCore, QtGui

#: Room for a window manager's frame and title bar, which are not known before the window is shown.
FRAME = QtCore.QSize(16, 48)
#: Platforms whose screen is a placeholder (offscreen: 800 × 800) that nobody looks at: a window
#: drawn there keeps the size it asked for (headless screenshots, tests).
PLACEHOLDER_PLATFORMS = ("offscreen", "minimal")


def fit_geometry(x: int | None, y: int | None, width: int, height: int, screens: list[QtCore.QRect],
                 primary: QtCore.QRect) -> tuple[int | None, int | None, int, int]:
    """(x, y, width, height) on ``screens`` (their available areas; ``primary`` for a window with no
    position): the screen that holds most of the saved rectangle, else the primary one and no saved
    position. A window that fits keeps its size, and a saved position is moved only as far as it
    takes to bring the window onto its screen; one that does not fit shrinks to the screen, less
    :data:`FRAME`, and a window with no position is then centred on it. ``x`` and ``y`` come back
    None where the window system may place the window."""
    area = primary
    if x is not None and y is not None:
        saved = QtCore.QRect(x, y, width, height)
        overlap = [(_area(s.intersected(saved)), i) for i, s in enumerate(screens)]
        best = max(overlap, default=(0, -1))
        if best[0] > 0:
            area = screens[best[1]]
        else:
            x = y = None  # the screen it was on is gone
    fits = width <= area.width() and height <= area.height()
    if not fits:
        width = min(width, max(area.width() - FRAME.width(), 1))
        height = min(height, max(area.height() - FRAME.height(), 1))
    if x is None or y is None:
        if fits:
            return None, None, width, height
        return (area.x() + (area.width() - width) // 2, area.y() + (area.height() - height - FRAME.height()) // 2,
                width, height)
    x = max(area.x(), min(x, area.x() + area.width() - width))
    y = max(area.y(), min(y, area.y() + area.height() - height))
    return x, y, width, height


def fit_to_screens(x: int | None, y: int | None, width: int, height: int) -> tuple[int | None, int | None, int, int]:
    """:func:`fit_geometry` on this application's screens; unchanged on a placeholder platform."""
    app = QtGui.QGuiApplication.instance()
    if app is None or QtGui.QGuiApplication.platformName() in PLACEHOLDER_PLATFORMS:
        return x, y, width, height
    primary = QtGui.QGuiApplication.primaryScreen()
    if primary is None:
        return x, y, width, height
    screens = [s.availableGeometry() for s in QtGui.QGuiApplication.screens()]
    return fit_geometry(x, y, width, height, screens, primary.availableGeometry())


def _area(r: QtCore.QRect) -> int:
    return max(r.width(), 0) * max(r.height(), 0) if r.isValid() else 0
