"""Shared fixtures. Nothing here imports Qt: tests/core also runs without PySide6 installed."""

from __future__ import annotations

import os
import tempfile

import pytest

# Tests never touch the user's real settings or autosave folders.
_TMP = tempfile.mkdtemp(prefix="kvinspect-tests-")
os.environ.setdefault("KVINSPECT_CONFIG_DIR", os.path.join(_TMP, "config"))
os.environ.setdefault("KVINSPECT_DATA_DIR", os.path.join(_TMP, "data"))
# Windows write no settings file or log file unless a test asks (kvinspect.core.paths.ephemeral).
os.environ.setdefault("KVINSPECT_EPHEMERAL", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # After pytest-xvfb has set DISPLAY (or not): offscreen only when there is no display. Not in
    # pytest-xdist's controller: its workers inherit its environment and start their own Xvfb.
    controller = config.getoption("dist", "no") != "no" and not os.environ.get("PYTEST_XDIST_WORKER")
    if not controller and not os.environ.get("DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


_loaded: dict = {}


def load_cached(spec: str):
    """Load a model once per test session (SmolLM2 takes ~15 s from its GGUF)."""
    from kvinspect.core.model.loading import load_model

    if spec not in _loaded:
        _loaded[spec] = load_model(spec, device="cpu")
    return _loaded[spec]


def load_vl(spec: str = "tiny-gemma3-vl"):
    """A vision-language built-in, or the test skipped where this transformers cannot build it (4.x without Pillow)."""
    from kvinspect.core.errors import ModelSpecError

    try:
        return load_cached(spec)
    except ModelSpecError as exc:
        pytest.skip(str(exc))


TINY = ("tiny-llama", "tiny-mistral", "tiny-gemma3", "tiny-llama4", "tiny-gemma2")
WINDOWED = ("tiny-mistral", "tiny-gemma3", "tiny-llama4", "tiny-gemma2")


@pytest.fixture(scope="session")
def smollm2_fetched():
    """SmolLM2 on disk (a failure where KVINSPECT_REQUIRE_SMOLLM2 is set, else a skip); not loaded here,
    for tests where a child process or the window loads it."""
    from kvinspect.core.model.fetch import is_fetched

    if not is_fetched("smollm2"):
        if os.environ.get("KVINSPECT_REQUIRE_SMOLLM2"):
            pytest.fail("SmolLM2 is not fetched (run: kvinspect models fetch smollm2)")
        pytest.skip("SmolLM2 not fetched (kvinspect models fetch smollm2)")


@pytest.fixture(scope="session")
def smollm2(smollm2_fetched):
    return load_cached("smollm2")


@pytest.fixture(params=TINY)
def tiny_model(request):
    return load_cached(request.param)


@pytest.fixture(params=WINDOWED)
def windowed_model(request):
    return load_cached(request.param)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A throw-away sshd on 127.0.0.1 (tests/sshd.py): ``sshd.ssh`` + ``sshd.host`` reach this machine.

    A skip when this machine cannot run one (openssh-server not installed), a failure where
    ``KVINSPECT_REQUIRE_SSHD=1`` (CI, ``make test``).
    """
    from .sshd import SshdUnavailable, require_sshd, start_sshd

    try:
        server = start_sshd(tmp_path_factory.mktemp("sshd"))
    except SshdUnavailable as exc:
        if require_sshd():
            pytest.fail(f"KVINSPECT_REQUIRE_SSHD is set but {exc}")
        pytest.skip(str(exc))
    yield server
    server.stop()
