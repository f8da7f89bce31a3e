"""The built-in model catalogue: tiny demo models and the fetchable real ones (SmolLM2, Gemma 3 270M)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvinspect.core.cache.layer_kinds import kinds_short
from kvinspect.core.model.templates import TRANSCRIPT_TEMPLATE
from kvinspect.core.model.tiny import VOCAB_SIZE, TinySpec
from kvinspect.core.model.tiny_vl import VisionSpec


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
    #: A base model: it continues text rather than chats (said in the picker and ``kvinspect models``).
    continues_text: bool = False
    #: Jinja template used when the checkpoint carries none (kvinspect.core.model.templates).
    chat_template: str | None = None

    @property
    def kinds_short(self) -> str:
        """``S,F,S,F`` for a few layers; per-kind counts (``S×15,F×3``) once a list would not fit."""
        return kinds_short(self.layer_kinds)


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
        name="tiny-gemma3-vl",
        title="Tiny Gemma 3 vision-language (random weights)",
        behaviour="random weights; images as 16-token bidirectional spans; three sliding (80) layers, one global",
        layer_kinds=("sliding",) * 3 + ("full",),
        # Longer than one image turn, shorter than two: the first image leaves the sliding layers in turn 2.
        window=80,
        tiny=TinySpec(
            "Gemma3TextConfig",
            {"num_hidden_layers": 4, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
             "sliding_window": 80, "query_pre_attn_scalar": 16},
            vision=VisionSpec("gemma3", {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                         "num_attention_heads": 2, "patch_size": 7}),
        ),
    ),
    BuiltinModel(
        name="tiny-qwen2-vl",
        title="Tiny Qwen2-VL (random weights)",
        behaviour="random weights; M-RoPE positions, an image's span sized by the picture (112² 16 tokens, 56² 4)",
        layer_kinds=("full",) * 2,
        tiny=TinySpec(
            "Qwen2VLTextConfig",
            {"num_hidden_layers": 2, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
            vision=VisionSpec("qwen2", {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2,
                                        "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                        "in_chans": 3, "mlp_ratio": 2}, image_size=112),
            min_transformers=5,
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
        name="tiny-qwen3next",
        title="Tiny Qwen3-Next (random weights)",
        behaviour="recurrent state: 3 layers keep a fixed-size state (no tokens), 1 full layer",
        layer_kinds=("state",) * 3 + ("full",),
        tiny=TinySpec(
            "Qwen3NextConfig",
            {
                "num_hidden_layers": 4,
                "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                "linear_num_value_heads": 2, "linear_num_key_heads": 2,
                "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                "num_experts": 2, "num_experts_per_tok": 1,
                "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
            },
        ),
    ),
    BuiltinModel(
        name="tiny-lfm2",
        title="Tiny LFM2 (random weights)",
        behaviour="conv state: 3 layers keep a short convolution state (no tokens), 1 full layer",
        layer_kinds=("state", "state", "full", "state"),
        tiny=TinySpec("Lfm2Config", {"num_hidden_layers": 4,
                                     "layer_types": ["conv", "conv", "full_attention", "conv"]}, min_transformers=5),
    ),
    BuiltinModel(
        name="tiny-falcon-h1",
        title="Tiny Falcon-H1 (random weights)",
        behaviour="hybrid layers: each layer keeps K/V for every token and a fixed-size Mamba state",
        layer_kinds=("full",) * 2,
        tiny=TinySpec("FalconH1Config", {"num_hidden_layers": 2, "mamba_d_ssm": 32, "mamba_n_heads": 4,
                                         "mamba_d_head": 8, "mamba_d_state": 8, "mamba_chunk_size": 8},
                       min_transformers=5),
    ),
    BuiltinModel(
        name="tiny-gemma3n",
        title="Tiny Gemma 3n text (random weights)",
        behaviour="KV sharing: the last three layers read the K/V of earlier ones and store none",
        layer_kinds=("sliding", "sliding", "full", "shared", "shared", "shared"),
        window=32,
        tiny=TinySpec(
            "Gemma3nTextConfig",
            {
                "num_hidden_layers": 6,
                "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
                "sliding_window": 32, "num_kv_shared_layers": 3,
                "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": VOCAB_SIZE,
                "laurel_rank": 4, "altup_num_inputs": 2,
                "activation_sparsity_pattern": [0.0] * 6, "intermediate_size": [128] * 6,
            },
        ),
    ),
    BuiltinModel(
        name="tiny-deepseek-v32",
        title="Tiny DeepSeek V3.2 (random weights)",
        behaviour="indexed sparse attention (DSA): K/V plus an indexer-key cache per layer",
        layer_kinds=("indexed",) * 2,
        tiny=TinySpec(
            "DeepseekV32Config",
            {
                "num_hidden_layers": 2, "first_k_dense_replace": 2, "num_key_value_heads": 4,
                "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                "v_head_dim": 16, "head_dim": 8, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 8,
                "n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
            },
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
    BuiltinModel(
        name="gemma3-270m",
        title="Gemma 3 270M base (Q4_K_M GGUF, real weights; Gemma Terms of Use)",
        behaviour="real hybrid: 15 sliding (512) + 3 global layers; continues text rather than chats",
        layer_kinds=(("sliding",) * 5 + ("full",)) * 3,
        window=512,
        fetch="gemma3-270m",
        aliases=("gemma-3-270m", "gemma3"),
        continues_text=True,
        chat_template=TRANSCRIPT_TEMPLATE,
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
