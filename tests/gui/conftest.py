"""GUI fixtures (the window, the engine fork server); plain helpers are in tests/gui/helpers.py.

Platform: offscreen by default (see tests/conftest.py), xcb under pytest-xvfb."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _engine_zygote():
    """The fork server the windows' engines start from (tests/engine_zygote.py), or None.

    ``KVINSPECT_TEST_ZYGOTE=0`` starts every engine as a plain ``python -m kvinspect engine``.
    """
    if os.environ.get("KVINSPECT_TEST_ZYGOTE", "1") == "0" or not hasattr(os, "fork"):
        yield None
        return
    script = Path(__file__).resolve().parent.parent / "engine_zygote.py"
    sock = os.path.join(tempfile.mkdtemp(prefix="kvz-"), "s")
    proc = subprocess.Popen([sys.executable, str(script), "serve", sock], stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        pytest.fail("the engine fork server did not start (tests/engine_zygote.py)")
    yield f"{sys.executable} -S {script} connect {sock}"
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def _zygote_engines(_engine_zygote, monkeypatch, request):
    # Tests about the process tree itself (who is whose child) mark themselves plain_engine.
    if _engine_zygote and request.node.get_closest_marker("plain_engine") is None:
        monkeypatch.setenv("KVINSPECT_ENGINE_COMMAND", _engine_zygote)


@pytest.fixture(autouse=True)
def _expect_platform(qapp):
    want = os.environ.get("KVINSPECT_EXPECT_PLATFORM")
    if want:
        assert qapp.platformName() == want, f"Qt platform is {qapp.platformName()}, expected {want}"


@pytest.fixture
def window(qtbot, tmp_path):
    """A real main window with default settings that never writes the settings file.

    Closing it (qtbot does, at teardown) shuts its engine down.
    """
    from kvinspect.core.settings import Settings
    from kvinspect.gui.app import create

    settings = Settings()
    settings.window.width, settings.window.height = 1280, 800
    _, win = create(settings=settings, persist=False)
    qtbot.addWidget(win)
    qtbot.waitExposed(win)
    yield win
    win.errors.close_all()

