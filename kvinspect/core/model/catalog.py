"""The built-in model catalogue: tiny demo models and the fetchable SmolLM2."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvinspect.core.model.tiny import TinySpec

#: Layer-kind letters used in listings: F full, S sliding, C chunked.
KIND_LETTER = {"full": "F", "sliding": "S", "chunked": "C", "linear": "L", "none": "-"}


@dataclass(frozen=True)
class BuiltinModel:
    """One built-in model spec, as ``kvinspect models`` lists it."""

    name: str
    title: str
    behaviour: str
    #: Layer kinds the model's cache must have (checked against transformers in tests).
    layer_kinds: tuple[str, ...]
    #: Window (sliding) or chunk size (chunked), None for full attention only.
    window: int | None = None
    tiny: TinySpec | None = None
    #: For downloadable models: how to fetch them (see core.fetch).
    fetch: str | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kinds_short(self) -> str:
        return ",".join(KIND_LETTER.get(k, "?") for k in self.layer_kinds)


BUILTINS: tuple[BuiltinModel, ...] = (
    BuiltinModel(
        name="tiny-llama",
        title="Tiny Llama (random weights)",
        behaviour="full attention: every layer keeps every token",
        layer_kinds=("full",) * 4,
        tiny=TinySpec("LlamaConfig", {"num_hidden_layers": 4}),
    ),
    BuiltinModel(
        name="tiny-mistral",
        title="Tiny Mistral (random weights)",
        behaviour="all layers sliding: storage stops at the window while seen keeps growing",
        layer_kinds=("sliding",) * 4,
        window=64,
        tiny=TinySpec("MistralConfig", {"num_hidden_layers": 4, "sliding_window": 64}),
    ),
    BuiltinModel(
        name="tiny-gemma3",
        title="Tiny Gemma3 text (random weights)",
        behaviour="hybrid: five sliding layers, then one global layer",
        layer_kinds=("sliding",) * 5 + ("full",),
        window=96,
        tiny=TinySpec(
            "Gemma3TextConfig",
            {"num_hidden_layers": 6, "sliding_window": 96, "query_pre_attn_scalar": 16},
        ),
    ),
    BuiltinModel(
        name="tiny-llama4",
        title="Tiny Llama4 text (random weights)",
        behaviour="chunked attention: RoPE layers attend within 64-token chunks, every 4th layer is global",
        layer_kinds=("chunked",) * 3 + ("full",),
        window=64,
        tiny=TinySpec(
            "Llama4TextConfig",
            {
                "num_hidden_layers": 4,
                "attention_chunk_size": 64,
                "num_local_experts": 1,
                "intermediate_size_mlp": 128,
                "interleave_moe_layer_step": 1,
            },
        ),
    ),
    BuiltinModel(
        name="tiny-gemma2",
        title="Tiny Gemma2 (random weights)",
        behaviour="alternating: sliding and global layers take turns",
        layer_kinds=("sliding", "full") * 2,
        window=48,
        tiny=TinySpec(
            "Gemma2Config",
            {"num_hidden_layers": 4, "sliding_window": 48, "query_pre_attn_scalar": 16},
        ),
    ),
    BuiltinModel(
        name="smollm2",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, real weights)",
        behaviour="a real chat model: 30 full-attention layers, 3 KV heads",
        layer_kinds=("full",) * 30,
        fetch="smollm2",
        aliases=("smollm2-135m", "smollm2-135m-instruct"),
    ),
)


def find_builtin(name: str) -> BuiltinModel | None:
    """The built-in called ``name`` (case-insensitive, aliases included), or None."""
    key = name.strip().lower()
    for b in BUILTINS:
        if key == b.name or key in b.aliases:
            return b
    return None


def builtin_names() -> list[str]:
    return [b.name for b in BUILTINS]
