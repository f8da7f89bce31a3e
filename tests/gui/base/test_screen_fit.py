"""A remembered or default window geometry is fitted to the screens there are now."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRect

from kvinspect.gui.base import screen_fit
from kvinspect.gui.base.screen_fit import FRAME, fit_geometry

LAPTOP = QRect(0, 0, 1366, 740)  # 1366 × 768 less a 28-px panel
RIGHT = QRect(1366, 0, 2560, 1400)  # a bigger monitor to its right


def _screen_area() -> QRect:
    from PySide6.QtGui import QGuiApplication

    return QGuiApplication.primaryScreen().availableGeometry()


def test_a_window_that_fits_keeps_its_size_and_place():
    assert fit_geometry(None, None, 1200, 700, [LAPTOP], LAPTOP) == (None, None, 1200, 700)
    assert fit_geometry(100, 20, 1200, 700, [LAPTOP], LAPTOP) == (100, 20, 1200, 700)
    assert fit_geometry(1500, 100, 1400, 860, [LAPTOP, RIGHT], LAPTOP) == (1500, 100, 1400, 860)


def test_the_default_size_shrinks_to_a_small_screen_and_is_centred_on_it():
    x, y, w, h = fit_geometry(None, None, 1400, 860, [LAPTOP], LAPTOP)
    assert (w, h) == (1366 - FRAME.width(), 740 - FRAME.height())
    assert (x, y) == (8, 0)  # the frame's title bar above it fits too
    # Only the side that does not fit loses the frame's room.
    x, y, w, h = fit_geometry(None, None, 1400, 860, [QRect(0, 0, 1280, 1024)], QRect(0, 0, 1280, 1024))
    assert (w, h) == (1280 - FRAME.width(), 860) and 0 <= x and y + h + FRAME.height() <= 1024


def test_a_window_saved_across_an_edge_is_moved_onto_the_screen_that_holds_most_of_it():
    x, y, w, h = fit_geometry(1000, 600, 1200, 700, [LAPTOP, RIGHT], LAPTOP)
    assert (w, h) == (1200, 700) and RIGHT.contains(QRect(x, y, w, h))  # mostly on the right monitor
    x, y, w, h = fit_geometry(-300, 500, 1000, 700, [LAPTOP, RIGHT], LAPTOP)
    assert (x, y, w, h) == (0, 40, 1000, 700)


def test_a_window_saved_on_a_monitor_that_is_gone_opens_on_the_primary_screen():
    # Saved on the bigger monitor, at its size; that monitor is unplugged now.
    x, y, w, h = fit_geometry(1500, 100, 2400, 1300, [LAPTOP], LAPTOP)
    assert (w, h) == (1366 - FRAME.width(), 740 - FRAME.height()) and LAPTOP.contains(QRect(x, y, w, h))
    # It would fit: the window system places it.
    assert fit_geometry(5000, 100, 1000, 600, [LAPTOP], LAPTOP) == (None, None, 1000, 600)


def test_the_window_opens_fitted_to_its_screen(qtbot, monkeypatch):
    """Saved larger than the screen and off every screen, the main window opens on the screen, as
    large as it fits (never below its minimum size). The offscreen screen is a placeholder, so the
    app leaves it alone; here it stands in for a real one."""
    from kvinspect.core.settings import Settings
    from kvinspect.gui.app import create

    monkeypatch.setattr(screen_fit, "PLACEHOLDER_PLATFORMS", ())
    settings = Settings()
    area = _screen_area()
    g = settings.window
    g.x, g.y, g.width, g.height = -9000, -9000, area.width() + 500, area.height() + 500
    _, win = create(settings=settings, persist=False)
    qtbot.addWidget(win)
    assert win.height() == max(area.height() - FRAME.height(), win.minimumHeight())
    assert win.width() == max(area.width() - FRAME.width(), win.minimumWidth())
    assert area.contains(win.geometry().topLeft())


def test_a_placeholder_screen_leaves_the_window_the_size_it_asked_for(qtbot):
    from PySide6.QtGui import QGuiApplication

    from kvinspect.core.settings import Settings
    from kvinspect.gui.app import create

    if QGuiApplication.platformName() not in screen_fit.PLACEHOLDER_PLATFORMS:
        pytest.skip("a real screen (Xvfb): the window is fitted to it, as the test above checks")
    settings = Settings()
    settings.window.width, settings.window.height = 1400, 860
    _, win = create(settings=settings, persist=False)
    qtbot.addWidget(win)
    assert (win.width(), win.height()) == (1400, 860)

