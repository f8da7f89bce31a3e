"""Mistake: a Gemma 3 image prefill without token_type_ids.

The ids and pixels are passed by hand and the processor's token_type_ids are left out: the
image's tokens then attend causally instead of to each other. No error, a different reply.
kvinspect names it image_causal.

    kvinspect trace -- python resources/examples/mistake_image_without_token_types.py --model tiny-gemma3-vl
"""

import argparse
from pathlib import Path

from transformers import DynamicCache

# Only to get a model offline; yours: from_pretrained. read_image: PIL.Image.open(path) does the same.
from kvinspect.core.media.images import read_image
from kvinspect.core.model.loading import load_model

IMAGES = Path(__file__).resolve().parents[1] / "images"


def run(model, processor, max_new_tokens=12):
    cache = DynamicCache(config=model.config)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in it?"}]}]
    prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=prompt_text, images=[read_image(IMAGES / "dusk.png")], return_tensors="pt")
    # The mistake: inputs["token_type_ids"] is not passed on.
    result = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                            pixel_values=inputs["pixel_values"], past_key_values=cache, do_sample=False,
                            max_new_tokens=max_new_tokens)
    print(repr(processor.tokenizer.decode(result[0, inputs["input_ids"].shape[1]:])))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gemma3-vl", help="a vision-language built-in (tiny-gemma3-vl)")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model)
    run(lm.model, lm.processor, args.max_new_tokens)
