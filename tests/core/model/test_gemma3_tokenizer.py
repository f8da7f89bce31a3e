"""gemma3-270m's warm-load tokenizer (Rust-parsed from the stored conversion) against the GGUF's own.

The conversion cache builds the tokenizer straight from ``tokenizer.json`` instead of transformers'
``GemmaTokenizer`` (docs/probe.md, "The GGUF conversion cache"): it must give the very same ids and
text, special tokens and the transcript template included. Skipped where the model is not fetched
(a failure where ``KVINSPECT_REQUIRE_GEMMA3=1``) and on transformers < 5 (no conversion cache).
"""

from __future__ import annotations

import os

import pytest

from kvinspect.core.model import conversion_cache as cc
from kvinspect.core.model.fetch import fetched_path, is_fetched
from kvinspect.core.model.loading import _conversion_round_trips
from tests.conftest import load_cached


@pytest.fixture(scope="module")
def tokenizers():
    if not is_fetched("gemma3-270m"):
        if os.environ.get("KVINSPECT_REQUIRE_GEMMA3"):
            pytest.fail("gemma3-270m is not fetched (run: kvinspect models fetch gemma3-270m)")
        pytest.skip("gemma3-270m not fetched (kvinspect models fetch gemma3-270m)")
    if not _conversion_round_trips():
        pytest.skip("transformers < 5 does not use the conversion cache")
    from transformers import AutoTokenizer

    loaded = load_cached("gemma3-270m")  # cold: converts and stores; warm: reads the stored conversion
    gguf = fetched_path("gemma3-270m")
    ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)  # ~20 s: the GGUF vocabulary
    ref.chat_template = loaded.tokenizer.chat_template  # the built-in transcript template (the GGUF has none)
    return ref, loaded


def test_the_stored_conversion_loads_its_tokenizer_directly(tokenizers):
    _, loaded = tokenizers
    import transformers

    key = cc.entry_key(cc.gguf_sha256(fetched_path("gemma3-270m")), transformers.__version__, "float32")
    folder = cc.lookup(key)
    assert folder is not None and cc.fast_tokenizer(folder)
    assert loaded.tokenizer.padding_side == "left"  # GemmaTokenizer's class default, kept


@pytest.mark.parametrize("text", [
    "The history of the Roman Empire",
    "<bos>User: hi<eos><pad><start_of_turn>model\n<end_of_turn>",
    "  spaces,\ttabs\n\n\nand naïve café 日本語 😀 ∑ x²",
    "def f(x):\n    return x ** 2  # 0xFF",
])
def test_ids_and_text_equal_the_gguf_tokenizer(tokenizers, text):
    ref, loaded = tokenizers
    tok = loaded.tokenizer
    for special in (True, False):
        ids = ref(text, add_special_tokens=special)["input_ids"]
        assert tok(text, add_special_tokens=special)["input_ids"] == ids
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def test_the_transcript_template_tokenizes_the_same(tokenizers):
    ref, loaded = tokenizers
    tok = loaded.tokenizer
    chat = [{"role": "user", "content": "Tell me about Rome."}, {"role": "assistant", "content": " It began small."},
            {"role": "user", "content": "And then?"}]
    text = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == text
    ids = ref(text, add_special_tokens=False)["input_ids"]
    assert tok(text, add_special_tokens=False)["input_ids"] == ids and tok.decode(ids) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, len(tok)) == \
           (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id, len(ref))
