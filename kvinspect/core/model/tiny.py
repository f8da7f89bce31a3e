"""Tiny random-weight models built in-process, one per cache behaviour.

They exist so every cache shape a user must be able to see (full, sliding, hybrid,
chunked, alternating) can be loaded in about a second with no download. Weights are
seeded, so a given prompt always yields the same tokens.

The tokenizer is character-level over printable ASCII plus a ChatML-style template: it
needs no files, round-trips text exactly (so a correct multi-turn reuse never sees a
spurious prefix divergence), and makes token counts easy to reason about (one character,
one token).
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: ChatML, the same shape as SmolLM2's, without a default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIALS = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "<unk>"]
PAD_ID, BOS_ID, IM_START_ID, EOS_ID, UNK_ID = range(len(SPECIALS))
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]  # 95 printable + "\n"
VOCAB_SIZE = len(SPECIALS) + len(CHARS)
SEED = 1234


@dataclass(frozen=True)
class TinySpec:
    """What to build: a transformers config class name and its overrides."""

    config_class: str
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Oldest transformers major version whose cache this built-in shows (its layer classes are 5.x-only).
    min_transformers: int | None = None
    #: A vision-language built-in: its vision half (kvinspect.core.model.tiny_vl.VisionSpec).
    vision: Any = None


_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    pad_token_id=PAD_ID,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    tie_word_embeddings=True,
    # Larger than the usual 0.02 so greedy decoding wanders instead of repeating one token.
    initializer_range=0.3,
)
#: What random weights may emit: lowercase words. Everything else is suppressed, EOS included, so
#: every turn generates exactly max_new_tokens (predictable lengths for demos and tests), and no
#: special token ends up in a reply, where it would not survive the next render.
ALLOWED_OUTPUT = set(string.ascii_lowercase + " .,'")


def build_tokenizer():
    """A character-level fast tokenizer with a chat template; no files needed."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One token per character, newline included ("." alone would skip it).
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(spec: TinySpec):
    """Build the seeded random-weight model for ``spec`` (float32, eval mode, CPU)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config_cls = getattr(transformers, spec.config_class, None)
    major = int(transformers.__version__.split(".")[0])
    if config_cls is None or (spec.min_transformers is not None and major < spec.min_transformers):
        # Newer architectures (Qwen3-Next, DeepSeek V3.2, …) on an older transformers, or older ones whose
        # 4.x cache is a model-specific class instead of the 5.x state layers (LFM2, Falcon-H1).
        from kvinspect.core.errors import ModelSpecError

        need = f"transformers {spec.min_transformers}.x or newer" if config_cls is not None else \
            f"transformers with {spec.config_class}"
        raise ModelSpecError(f"this built-in needs {need}; installed: transformers {transformers.__version__}")
    config = config_cls(**{**_COMMON, **spec.overrides})
    # Seed only our own generator state: a fork keeps the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config)
    model.eval()
    set_generation_config(model)
    return model


def common_config() -> dict[str, Any]:
    return dict(_COMMON)


def set_generation_config(model, extra_suppressed: Iterable[int] = ()) -> None:
    gc = model.generation_config
    gc.eos_token_id = EOS_ID
    gc.pad_token_id = PAD_ID
    gc.bos_token_id = BOS_ID
    gc.suppress_tokens = suppressed_ids() + [int(i) for i in extra_suppressed]


def suppressed_ids() -> list[int]:
    vocab = SPECIALS + CHARS
    return [i for i, tok in enumerate(vocab) if tok not in ALLOWED_OUTPUT]
