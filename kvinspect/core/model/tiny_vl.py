"""Tiny random-weight vision-language models, built offline like the text built-ins.

Each comes with a working processor assembled from local parts: the character-level tokenizer
plus the model's image special tokens, a Pillow-backend image processor (``*ImageProcessorPil``:
it needs neither torchvision nor, for arrays, Pillow itself) and a chat template that renders
image parts. Nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvinspect.core.model import tiny

#: ChatML whose content may be a list of parts; an image part renders as the model's image placeholder.
VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ IMAGE }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
QWEN2_TOKENS = {"vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>",
                "image_token": "<|image_pad|>", "video_token": "<|video_pad|>"}
_TOKENS = {"gemma3": GEMMA3_TOKENS, "qwen2": QWEN2_TOKENS}
#: What a chat template writes for one image part; the processor expands it.
_PLACEHOLDER = {"gemma3": "<start_of_image>", "qwen2": "<|vision_start|><|image_pad|><|vision_end|>"}


@dataclass(frozen=True)
class VisionSpec:
    """The vision half of a tiny multimodal built-in: its family and the vision config's overrides."""

    family: str  # "gemma3" | "qwen2"
    vision: dict[str, Any] = field(default_factory=dict)
    tokens_per_image: int = 16
    image_size: int = 28


def build_tokenizer(spec: VisionSpec):
    """The character-level tokenizer plus the family's image tokens (named attributes, as processors expect)."""
    tok = tiny.build_tokenizer()
    names = _TOKENS[spec.family]
    tok.add_special_tokens({"additional_special_tokens": list(names.values())})
    for attr, text in names.items():
        setattr(tok, attr, text)
        setattr(tok, attr + "_id", tok.convert_tokens_to_ids(text))
    tok.chat_template = VL_TEMPLATE.replace("{{ IMAGE }}", _PLACEHOLDER[spec.family])
    return tok


def build_processor(spec: VisionSpec, tok):
    if spec.family == "qwen2":
        return _qwen2_processor(spec, tok)
    from transformers import Gemma3Processor

    try:  # 5.x: the Pillow backend (no torchvision)
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil as ImageProcessor
    except ImportError:
        # 4.x builds the model, but an image turn continued on a cache fails inside transformers' image mask
        # (seen on 4.56.2: token_type_ids of the new part indexed by absolute position, an IndexError), and
        # refeeding everything is not the loop this built-in is here to show.
        import transformers

        from kvinspect.core.errors import ModelSpecError

        raise ModelSpecError(f"tiny-gemma3-vl needs transformers 5.x (this is {transformers.__version__}: a Gemma 3 "
                             "image turn continued on a cache fails inside its image mask)") from None

    ip = ImageProcessor(size={"height": spec.image_size, "width": spec.image_size})
    return Gemma3Processor(image_processor=ip, tokenizer=tok, chat_template=tok.chat_template,
                           image_seq_length=spec.tokens_per_image)


def _qwen2_processor(spec: VisionSpec, tok):
    from transformers import Qwen2VLProcessor

    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil as ImageProcessor,
        )
    except ImportError:
        from kvinspect.core.errors import ModelSpecError

        raise ModelSpecError("tiny-qwen2-vl needs transformers 5.x (its Pillow-backend image processor)") from None

    class ImageOnlyProcessor(Qwen2VLProcessor):
        """No video processor (it needs torchvision): the base class refuses None for it."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    # A 112² image is 16 tokens, a 56² one 4: the span's size follows the picture's.
    ip = ImageProcessor(min_pixels=56 * 56, max_pixels=spec.image_size * spec.image_size)
    return ImageOnlyProcessor(image_processor=ip, tokenizer=tok, video_processor=None, chat_template=tok.chat_template)


def build_model(text: tiny.TinySpec, spec: VisionSpec, tok):
    """The seeded model; the image projection re-initialised (``_init_weights`` zero-fills it, and every image
    would then give the same features, so a changed picture would change nothing)."""
    import torch
    import transformers

    major = int(transformers.__version__.split(".")[0])
    if text.min_transformers is not None and major < text.min_transformers:
        from kvinspect.core.errors import ModelSpecError

        raise ModelSpecError(f"this built-in needs transformers {text.min_transformers}.x or newer; installed: "
                             f"transformers {transformers.__version__}")
    if spec.family == "qwen2":
        return _qwen2_model(text, spec, tok)
    text_cfg = getattr(transformers, text.config_class)(**{**tiny.common_config(), "vocab_size": len(tok),
                                                          **text.overrides})
    vision_cfg = transformers.SiglipVisionConfig(**{"image_size": spec.image_size, **spec.vision})
    cfg = transformers.Gemma3Config(
        text_config=text_cfg, vision_config=vision_cfg, mm_tokens_per_image=spec.tokens_per_image,
        boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id, image_token_index=tok.image_token_id,
        initializer_range=text_cfg.initializer_range)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tiny.SEED)
        model = transformers.Gemma3ForConditionalGeneration(cfg)
        proj = model.model.multi_modal_projector.mm_input_projection_weight
        with torch.no_grad():
            proj.normal_(0.0, text_cfg.initializer_range)
    model.eval()
    tiny.set_generation_config(model, extra_suppressed=[tok.convert_tokens_to_ids(t) for t in GEMMA3_TOKENS.values()])
    return model


def _qwen2_model(text: tiny.TinySpec, spec: VisionSpec, tok):
    import torch
    import transformers

    text_cfg = {**tiny.common_config(), "vocab_size": len(tok), **text.overrides}
    cfg = transformers.Qwen2VLConfig(
        text_config=text_cfg, vision_config=dict(spec.vision), image_token_id=tok.image_token_id,
        video_token_id=tok.video_token_id, vision_start_token_id=tok.vision_start_token_id,
        vision_end_token_id=tok.vision_end_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tiny.SEED)
        model = transformers.Qwen2VLForConditionalGeneration(cfg)
    model.eval()
    tiny.set_generation_config(model, extra_suppressed=[tok.convert_tokens_to_ids(t) for t in QWEN2_TOKENS.values()])
    return model
