"""The window opens with the app icon; `kvinspect gui --help` does not need a display."""

from kvinspect.gui.app import create
from kvinspect.gui.base.resources import app_icon


def test_window_opens(qtbot):
    app, win = create(exec_app=False)
    qtbot.addWidget(win)
    qtbot.waitExposed(win)
    assert win.windowTitle().startswith("kvinspect")
    assert not app_icon().isNull()
    assert not win.grab().isNull()
