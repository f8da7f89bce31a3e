"""The wheel holds everything the app reads at run time (the clean-venv smoke test is packaging/smoke_wheel.sh)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from the checkout (no build isolation: the venv's setuptools, a few seconds, offline)."""
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (whl,) = out.glob("kvinspect-*.whl")
    return whl


def _source_files() -> set[str]:
    files = set()
    for p in (ROOT / "kvinspect").rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            files.add(p.relative_to(ROOT).as_posix())
    return files


def test_every_file_of_the_package_is_in_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_files() - names)
    assert missing == [], f"in kvinspect/ but not in the wheel (pyproject package-data?): {missing}"
    # What the window and `kvinspect trace` read by path at run time, named so a refactor cannot drop them.
    for must in ("kvinspect/resources/icons/kvinspect-256.png", "kvinspect/resources/icons/kvinspect.svg",
                 "kvinspect/resources/icons/check-white.svg", "kvinspect/core/observe/_trace_boot/sitecustomize.py",
                 "kvinspect/py.typed"):
        assert must in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "resources/", "packaging/"))]


def test_wheel_metadata_and_entry_points(wheel):
    z = zipfile.ZipFile(wheel)
    info = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    entry = z.read(info).decode()
    assert "kvinspect = kvinspect.cli:main" in entry and "kvinspect-gui = kvinspect.cli:gui_main" in entry
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    # torch without an upper bound: a GPU user's own CUDA build is kept (docs/packaging.md).
    assert any(line.startswith("Requires-Dist: torch>=") and "<" not in line for line in meta.splitlines())
    size = wheel.stat().st_size
    print(f"wheel {wheel.name}: {size / 1024:.0f} KiB, {len(z.namelist())} files")
    assert size < 2 * 1024 * 1024  # pure Python and a few icons: a model or a trace slipping in shows here
