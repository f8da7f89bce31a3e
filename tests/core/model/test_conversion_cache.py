"""The GGUF conversion cache: a stored conversion is used only while it is whole and current.

Entries are made from a tiny built-in (no GGUF needed) in a throw-away cache dir; the last test
loads SmolLM2 through the real cache and checks the conversion gives the GGUF's own logits.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from kvinspect.core.model import conversion_cache as cc
from kvinspect.core.model.loading import _conversion_round_trips, load_model
from tests.conftest import load_cached


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVINSPECT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def entry(cache_dir):
    lm = load_cached("tiny-llama")
    key = cc.entry_key("ab" * 32, "9.9.9", "float32")
    folder = cc.store(lm.model, lm.tokenizer, key)
    assert folder is not None and folder == cc.entry_dir(key)
    return lm, key, folder


def test_a_stored_conversion_loads_as_the_same_model(entry):
    if not _conversion_round_trips():  # 4.x: the folder loads but generate() then fails (docs/compat.md)
        pytest.skip("transformers < 5 does not use the conversion cache")
    lm, key, folder = entry
    assert cc.lookup(key) == folder
    assert {"model.safetensors", "config.json", "tokenizer.json", cc.MANIFEST} <= {p.name for p in folder.iterdir()}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvinspect.core.compat import dtype_kwarg

    model = AutoModelForCausalLM.from_pretrained(folder, **{dtype_kwarg(): torch.float32})  # as load_model does
    tok = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tok("a kv cache")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, lm.model(ids).logits)


def test_truncated_weights_are_detected_and_removed(entry):
    _, key, folder = entry
    w = folder / "model.safetensors"
    with w.open("r+b") as f:
        f.truncate(w.stat().st_size // 2)
    assert cc.check_entry(folder, key).startswith("model.safetensors has")
    assert cc.lookup(key) is None and not folder.exists()


def test_same_size_corruption_is_caught_by_the_hash(entry):
    _, key, folder = entry
    w = folder / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-10] ^= 0xFF
    w.write_bytes(bytes(data))  # same size, new mtime
    assert "SHA-256" in cc.check_entry(folder, key)
    assert cc.lookup(key) is None


def test_an_interrupted_conversion_has_no_manifest(entry):
    _, key, folder = entry
    (folder / cc.MANIFEST).unlink()
    assert "manifest" in cc.check_entry(folder, key)
    assert cc.lookup(key) is None


def test_another_transformers_version_or_format_is_stale(entry):
    _, key, folder = entry
    newer = {**key, "transformers": "99.0.0"}
    assert cc.entry_dir(newer) != folder and cc.lookup(newer) is None
    m = json.loads((folder / cc.MANIFEST).read_text())
    m["key"]["format"] = cc.FORMAT - 1
    (folder / cc.MANIFEST).write_text(json.dumps(m))
    assert cc.check_entry(folder, key).startswith("stale")


def test_the_gguf_hash_is_remembered_until_the_file_changes(cache_dir, tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 100)
    first = cc.gguf_sha256(f)
    calls = []
    real = cc.sha256_file
    monkeypatch.setattr(cc, "sha256_file", lambda p: calls.append(p) or real(p))
    assert cc.gguf_sha256(f) == first and calls == []
    f.write_bytes(b"GGUF" + b"\1" * 100)
    os.utime(f, ns=(1, 1))
    assert cc.gguf_sha256(f) != first and len(calls) == 1


def test_smollm2_second_load_reads_the_conversion_and_gives_the_same_logits(smollm2):
    again = load_model("smollm2", device="cpu")
    if not _conversion_round_trips():
        # 4.x neither reads nor writes the cache: every load de-quantises the GGUF.
        assert (smollm2.load_source, again.load_source) == ("gguf", "gguf")
        return
    assert again.load_source == "converted-cache"
    assert smollm2.load_source in ("gguf", "converted-cache")
    tok = again.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert tok(text)["input_ids"] == smollm2.tokenizer(text)["input_ids"]
    assert tok.chat_template == smollm2.tokenizer.chat_template
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(again.model(ids).logits, smollm2.model(ids).logits)


def test_tied_weights_are_stored_under_the_name_transformers_ties_from(entry):
    # Stored as lm_head, the embedding would load as "missing" and be random-initialised before the tie.
    from safetensors import safe_open

    lm, _, folder = entry
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    tied = getattr(lm.model, "all_tied_weights_keys", None) or {"lm_head.weight": "model.embed_tokens.weight"}
    for target, source in tied.items():
        assert source in names and target not in names


def test_the_direct_tokenizer_load_is_checked_when_stored(entry, monkeypatch):
    if not _conversion_round_trips():
        pytest.skip("transformers < 5 does not use the conversion cache")
    lm, key, folder = entry
    assert cc.fast_tokenizer(folder)
    tok = cc.load_tokenizer(folder)
    assert cc.tokenizer_mismatch(lm.tokenizer, tok) is None
    text = lm.tokenizer.apply_chat_template([{"role": "user", "content": "hi <s>"}], add_generation_prompt=True,
                                            tokenize=False)
    assert tok(text)["input_ids"] == lm.tokenizer(text)["input_ids"]
    tok.padding_side = "left" if tok.padding_side == "right" else "right"
    assert cc.tokenizer_mismatch(lm.tokenizer, tok) == "padding_side"
    # A tokenizer the direct load does not reproduce is marked for AutoTokenizer instead.
    monkeypatch.setattr(cc, "tokenizer_mismatch", lambda expected, got: "ids of 'x'")
    other = {**key, "gguf_sha256": "cd" * 32}
    assert not cc.fast_tokenizer(cc.store(lm.model, lm.tokenizer, other))


def test_smollm2_direct_tokenizer_equals_the_gguf_one(smollm2):
    """The warm path's tokenizer (Rust-parsed tokenizer.json) against the GGUF's own, ids and text."""
    if not _conversion_round_trips():
        pytest.skip("transformers < 5 does not use the conversion cache")
    import transformers
    from transformers import AutoTokenizer

    from kvinspect.core.model.fetch import fetched_path

    gguf = fetched_path("smollm2")  # the fixture's load stored (or read) its conversion
    folder = cc.lookup(cc.entry_key(cc.gguf_sha256(gguf), transformers.__version__, "float32"))
    assert folder is not None and cc.fast_tokenizer(folder)
    ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok = cc.load_tokenizer(folder)
    assert cc.tokenizer_mismatch(ref, tok) is None
    chat = [{"role": "user", "content": "What is <|im_end|> for?"}, {"role": "assistant", "content": "Ends a turn."}]
    text = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == text
    ids = ref(text)["input_ids"]
    assert tok(text)["input_ids"] == ids and tok.decode(ids) == ref.decode(ids) == text


def test_bpe_merges_are_stored_in_the_short_form_only_where_it_is_unambiguous(tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {"a": 0, "b": 1, "ab": 2, " ": 3, "a ": 4, "abab": 5}
    for merges, short in (([("a", "b"), ("ab", "ab")], True), ([("a", "b"), ("a", " ")], False)):
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        f = tmp_path / "tokenizer.json"
        tk.save(str(f))
        cc._compact_tokenizer_json(f)
        stored = json.loads(f.read_text(encoding="utf-8"))["model"]["merges"]
        assert all(isinstance(m, str) for m in stored) is short  # "a  " would not say which space splits
        assert Tokenizer.from_file(str(f)).encode("abab a ab").ids == tk.encode("abab a ab").ids
