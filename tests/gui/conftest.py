"""GUI fixtures. Platform: offscreen by default (see tests/conftest.py), xcb under pytest-xvfb."""

import os

import pytest


@pytest.fixture(autouse=True)
def _expect_platform(qapp):
    want = os.environ.get("KVINSPECT_EXPECT_PLATFORM")
    if want:
        assert qapp.platformName() == want, f"Qt platform is {qapp.platformName()}, expected {want}"
