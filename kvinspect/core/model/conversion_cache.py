"""The GGUF conversion cache: de-quantise a GGUF once, load the stored safetensors afterwards.

transformers de-quantises a GGUF in Python on every load (SmolLM2 11–23 s, Gemma 3 270M far
more, most of it the tokenizer rebuilt from the GGUF vocabulary). The first load stores what it
built, as a plain transformers folder (``model.safetensors``, ``config.json``, generation config,
tokenizer files), under the user cache dir; later loads read that folder with transformers' own
``from_pretrained``.

An entry is keyed by the GGUF's SHA-256, the transformers version and the dtype, so a new file,
a transformers upgrade or another dtype never reads an old conversion. ``manifest.json`` is
written last and lists every file's size, mtime and SHA-256; an entry whose manifest is missing,
for another key or format, or whose files differ in size, or changed mtime and no longer hash to
the manifest, is damaged or stale: it is removed and rebuilt, never loaded. (Unchanged size and
mtime are trusted without re-hashing the weights: hashing a 1 GB file every load would cost more
than the load.)

``save_pretrained`` refuses a model loaded from a GGUF ("quantized with gguf and not
serializable"), so the state dict is written with safetensors' own ``save_model`` (which drops
tied duplicates) and the config without its GGUF quantization entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from kvinspect.core.paths import cache_dir

log = logging.getLogger(__name__)

#: Bumped when what an entry holds changes: older entries are then stale.
FORMAT = 1
MANIFEST = "manifest.json"
_SHA_INDEX = "gguf-sha256.json"


def root() -> Path:
    return cache_dir() / "converted"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def gguf_sha256(path: Path) -> str:
    """The GGUF's SHA-256, remembered per (path, size, mtime) so a warm load does not re-hash it."""
    path = path.resolve()
    st = path.stat()
    index_file = root() / _SHA_INDEX
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
        if not isinstance(index, dict):
            index = {}
    except (OSError, ValueError):
        index = {}
    known = index.get(str(path))
    if isinstance(known, list) and len(known) == 3 and known[:2] == [st.st_size, st.st_mtime_ns]:
        return str(known[2])
    digest = sha256_file(path)
    index[str(path)] = [st.st_size, st.st_mtime_ns, digest]
    try:
        index_file.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(index_file, json.dumps(index, indent=1))
    except OSError as exc:  # a read-only cache dir only costs the re-hash next time
        log.info("could not remember the GGUF hash: %s", exc)
    return digest


def entry_key(gguf_sha: str, transformers_version: str, dtype: str) -> dict:
    return {"format": FORMAT, "gguf_sha256": gguf_sha, "transformers": transformers_version, "dtype": dtype}


def entry_dir(key: dict) -> Path:
    return root() / f"{key['gguf_sha256'][:20]}-tf{key['transformers']}-{key['dtype']}"


def check_entry(folder: Path, key: dict) -> str | None:
    """None when ``folder`` is a complete conversion for ``key``; else why it cannot be used."""
    if not folder.is_dir():
        return "absent"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable manifest (an interrupted conversion?)"
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return "stale: made for another file, transformers version, dtype or format"
    files = manifest.get("files")
    if not isinstance(files, dict) or "config.json" not in files or not any(n.endswith(".safetensors") for n in files):
        return "the manifest lists no weights or config"
    for name, meta in files.items():
        p = folder / name
        try:
            st = p.stat()
        except OSError:
            return f"{name} is missing"
        if st.st_size != meta.get("size"):
            return f"{name} has {st.st_size} bytes, not {meta.get('size')} (truncated or overwritten)"
        if st.st_mtime_ns != meta.get("mtime_ns") and sha256_file(p) != meta.get("sha256"):
            return f"{name} was modified since the conversion (SHA-256 differs)"
    return None


def lookup(key: dict) -> Path | None:
    """The usable entry for ``key``, or None; a damaged or stale one is removed on the way."""
    folder = entry_dir(key)
    why = check_entry(folder, key)
    if why is None:
        return folder
    if why != "absent":
        log.warning("conversion cache %s not used: %s; converting again", folder.name, why)
        shutil.rmtree(folder, ignore_errors=True)
    return None


def store(model, tokenizer, key: dict) -> Path | None:
    """Write ``model`` and ``tokenizer`` as the entry for ``key``; None when it cannot be written."""
    folder = entry_dir(key)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".converting-"))
    except OSError as exc:
        log.warning("conversion cache not written (%s): the next load converts again", exc)
        return None
    try:
        _write_model(model, tokenizer, tmp)
        files = {}
        for p in sorted(tmp.iterdir()):
            if p.is_file():
                st = p.stat()
                files[p.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_file(p)}
        _write_atomic(tmp / MANIFEST, json.dumps({"key": key, "files": files}, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except (OSError, ValueError, RuntimeError) as exc:
        # A full disk or an unserialisable model costs only the speed-up: the model is loaded already.
        log.warning("conversion cache not written (%s): the next load converts again", exc)
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    return folder


def _write_model(model, tokenizer, into: Path) -> None:
    from safetensors.torch import save_model

    save_model(model, str(into / "model.safetensors"), metadata={"format": "pt"})
    # transformers' own JSON form (it writes dtypes as names on every version), minus the GGUF quantizer entry.
    config = json.loads(model.config.to_json_string(use_diff=False))
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    (into / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    gc = getattr(model, "generation_config", None)
    if gc is not None:
        gc.save_pretrained(str(into))
    tokenizer.save_pretrained(str(into))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
