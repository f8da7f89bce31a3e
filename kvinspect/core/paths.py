"""Where kvinspect keeps files: user cache (fetched models), data (autosaved traces), config."""

from __future__ import annotations

import os
from pathlib import Path

APP = "kvinspect"


def cache_dir() -> Path:
    """Fetched models live here; ``KVINSPECT_CACHE_DIR`` overrides (CI, tests, shared disks)."""
    env = os.environ.get("KVINSPECT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(APP))


def data_dir() -> Path:
    """Autosaved traces live here; ``KVINSPECT_DATA_DIR`` overrides."""
    env = os.environ.get("KVINSPECT_DATA_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP))


def config_dir() -> Path:
    """Settings live here; ``KVINSPECT_CONFIG_DIR`` overrides (tests never touch the real one)."""
    env = os.environ.get("KVINSPECT_CONFIG_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP))


#: Set (to anything but ``0``) by the test suite, tests/conftest.py: see :func:`ephemeral`.
EPHEMERAL_ENV = "KVINSPECT_EPHEMERAL"


def ephemeral() -> bool:
    """``KVINSPECT_EPHEMERAL=1``: the window keeps nothing of its own between runs.

    It writes no settings file (unless a caller passes ``persist=True``) and no log file, and
    leaves the process's exception hooks alone when it only shows a trace. Tests set it so that
    no test depends on, or leaves behind, what another one saved.
    """
    return os.environ.get(EPHEMERAL_ENV, "").strip() not in ("", "0")
