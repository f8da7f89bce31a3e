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
serializable"), so the state dict is written with safetensors and the config without its GGUF
quantization entry. Of two tied tensors the one transformers ties *from* is stored (the input
embedding, not ``lm_head``): stored the other way round, every load counts the embedding as
missing and random-initialises it before tying (1.5 s of ``normal_`` on Gemma 3's 262k x 640).

A warm load builds the tokenizer straight from ``tokenizer.json`` in Rust (``tokenizer_file=``)
with the small ``tokenizer_config.json`` as its arguments, instead of ``AutoTokenizer``, which
also parses the whole ``tokenizer.json`` in Python and runs the model's own tokenizer class
(Gemma 3's 33 MB file: 1.5 s against 3–4.5 s). The conversion checks, when it stores, that the
two give the same ids, decodes, special tokens and template on a set of probe strings; only then
does the manifest say ``"tokenizer": "fast"``, else a warm load uses ``AutoTokenizer``.
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

#: Bumped when what an entry holds changes: older entries are then stale. 2: tied weights stored
#: under their source's name, and the manifest's "tokenizer" entry.
FORMAT = 2
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
    index = {k: v for k, v in index.items() if os.path.exists(k)}  # files since deleted (a test's tmp copies)
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
        try:
            mismatch = tokenizer_mismatch(tokenizer, load_tokenizer(tmp))
        except Exception as exc:  # noqa: BLE001 - any failure of the direct load only means AutoTokenizer
            mismatch = f"{type(exc).__name__}: {exc}"
        if mismatch:
            log.info("the stored tokenizer is loaded with AutoTokenizer: the direct load differs (%s)", mismatch)
        manifest = {"key": key, "files": files, "tokenizer": "auto" if mismatch else "fast"}
        _write_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except (OSError, ValueError, RuntimeError) as exc:
        # A full disk or an unserialisable model costs only the speed-up: the model is loaded already.
        log.warning("conversion cache not written (%s): the next load converts again", exc)
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    return folder


def _write_model(model, tokenizer, into: Path) -> None:
    from safetensors.torch import save_file, save_model

    try:
        save_file(_unshared_state_dict(model), str(into / "model.safetensors"), metadata={"format": "pt"})
    except ValueError:  # tensors sharing memory other than by tying: safetensors' own choice of names
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
    if (into / "tokenizer.json").is_file():
        _compact_tokenizer_json(into / "tokenizer.json")
    # Class defaults (GemmaTokenizer pads on the left) are not saved: the direct load needs them spelled out.
    tc = into / "tokenizer_config.json"
    if tc.is_file():
        args = json.loads(tc.read_text(encoding="utf-8"))
        for name in _CLASS_DEFAULTS:
            if name not in args and isinstance(getattr(tokenizer, name, None), (str, list)):
                args[name] = getattr(tokenizer, name)
        tc.write_text(json.dumps(args, indent=2, ensure_ascii=False), encoding="utf-8")


def _compact_tokenizer_json(path: Path) -> None:
    """Rewrite ``tokenizer.json`` compact, its BPE merges in the ``"a b"`` form ``tokenizers`` also reads.

    The Rust parser reads string merges faster than pairs (Gemma 3's 515k merges: 0.69 s against
    0.90 s). Done only when no merge part holds a space (where "a b" would be ambiguous), and
    kept only if ``tokenizers`` reads it back to the very same merges.
    """
    from tokenizers import Tokenizer

    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return
    merges = model.get("merges")
    if not merges or not all(isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) and " " not in x for x in m)
                             for m in merges):
        return
    model["merges"] = [f"{a} {b}" for a, b in merges]
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    back = json.loads(Tokenizer.from_str(text).to_str()).get("model", {}).get("merges")
    if back == merges:
        path.write_text(text, encoding="utf-8")


#: Tokenizer settings a tokenizer class sets as class attributes, so ``save_pretrained`` omits them.
_CLASS_DEFAULTS = ("padding_side", "truncation_side", "model_input_names")


def _unshared_state_dict(model) -> dict:
    """The state dict with each tied tensor once, under the name transformers ties from."""
    targets = set(getattr(model, "all_tied_weights_keys", None) or ())  # 5.x: {tied name: source name}
    state = model.state_dict()
    seen: set[tuple] = set()
    out = {}
    for name in sorted(state, key=lambda n: n in targets):  # sources before the names tied to them
        t = state[name]
        ident = (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() and ident in seen:
            continue
        seen.add(ident)
        out[name] = t.contiguous()
    return out


#: tokenizer_config.json entries that say how it was saved, not how to build it.
_NOT_TOKENIZER_ARGS = ("tokenizer_class", "backend", "is_local", "local_files_only", "auto_map", "name_or_path")


def fast_tokenizer(folder: Path) -> bool:
    """Whether the entry's manifest says its tokenizer loads directly (checked when it was stored)."""
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("tokenizer") == "fast"
    except (OSError, ValueError, AttributeError):
        return False


def load_tokenizer(folder: Path):
    """The entry's tokenizer, parsed by the Rust ``tokenizers`` library from ``tokenizer.json``."""
    from transformers import PreTrainedTokenizerFast

    kwargs = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    for name in _NOT_TOKENIZER_ARGS:
        kwargs.pop(name, None)
    template = folder / "chat_template.jinja"
    if template.is_file():
        kwargs["chat_template"] = template.read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **kwargs)
    tok.name_or_path = str(folder)
    return tok


#: Probe texts for the store-time check: specials in text, whitespace runs, non-Latin scripts, bytes.
_PROBES = ("The history of the Roman Empire", "  two  spaces\n\n\tand a tab ", "naïve café 日本語 😀 \x00\x7f",
           "User: hi\nAssistant: hello\n\nUser:")


def tokenizer_mismatch(expected, got) -> str | None:
    """None when ``got`` encodes, decodes and templates like ``expected``; else the first difference."""
    specials = [t for t in expected.all_special_tokens if t]
    texts = [*_PROBES, "".join(specials), " ".join(f"a{t}b" for t in specials)]
    for attr in ("all_special_tokens", "all_special_ids", "bos_token_id", "eos_token_id", "pad_token_id",
                 "unk_token_id", "chat_template", "model_max_length", *_CLASS_DEFAULTS):
        if getattr(expected, attr, None) != getattr(got, attr, None):
            return attr
    if len(expected) != len(got):
        return "vocabulary size"
    if expected.chat_template:
        msgs = [{"role": "user", "content": texts[0]}, {"role": "assistant", "content": texts[1]}]
        try:
            texts.append(expected.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
        except Exception:  # noqa: BLE001 - a template that needs other roles: the probe texts still count
            pass
    for text in texts:
        for special in (True, False):
            ids = expected(text, add_special_tokens=special)["input_ids"]
            if got(text, add_special_tokens=special)["input_ids"] != ids:
                return f"ids of {text[:30]!r}"
            for skip in (True, False):
                if got.decode(ids, skip_special_tokens=skip) != expected.decode(ids, skip_special_tokens=skip):
                    return f"decode of {text[:30]!r}"
    return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
