"""Correct: an image chat that re-renders the whole conversation and reuses ONE cache.

Every turn the processor renders the whole conversation with all its pictures (so the ids and
token_type_ids are the full sequence's), the cache is cropped to the common prefix with what it
holds, and generate() gets the full ids and token types with the pixels of only the pictures
after the cached prefix: the cached ones are already in the cache's rows. kvinspect expects no
warning here.

    kvinspect trace -- python resources/examples/correct_image_chat.py --model tiny-gemma3-vl
"""

import argparse
from pathlib import Path

from transformers import DynamicCache

# Only to get a model offline; yours: from_pretrained. read_image: PIL.Image.open(path) does the same.
from kvinspect.core.media.images import read_image
from kvinspect.core.model.loading import load_model

IMAGES = Path(__file__).resolve().parents[1] / "images"
TURNS = [("What is in this picture?", "gradient.png"), ("And in this one?", "checker.png")]


def image_starts(ids, image_token_id):
    """The position where each image's run of image tokens starts."""
    return [p for p, t in enumerate(ids) if t == image_token_id and (p == 0 or ids[p - 1] != image_token_id)]


def run(model, processor, max_new_tokens=12):
    messages, pictures = [], []
    cache = DynamicCache(config=model.config)
    cached_ids = []
    for text, picture in TURNS:
        pictures.append(read_image(IMAGES / picture))
        messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]})
        prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=prompt_text, images=pictures, return_tensors="pt")
        prompt = inputs["input_ids"][0].tolist()
        p = 0
        while p < min(len(cached_ids), len(prompt) - 1) and cached_ids[p] == prompt[p]:
            p += 1
        if p < cache.get_seq_length():
            try:
                cache.crop(p - cache.get_seq_length())
                cached_ids = cached_ids[:p]
            except (ValueError, RuntimeError):
                cache, cached_ids = DynamicCache(config=model.config), []
        # Pixels only for the pictures the cache does not hold yet.
        starts = image_starts(prompt, model.config.image_token_id)
        new = [i for i, s in enumerate(starts) if s >= len(cached_ids)]
        extra = {"pixel_values": inputs["pixel_values"][new[0]:]} if new else {}
        result = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                token_type_ids=inputs["token_type_ids"], past_key_values=cache,
                                do_sample=False, max_new_tokens=max_new_tokens, **extra)
        reply = result[0, len(prompt):]
        cached_ids = prompt + reply[:-1].tolist()
        answer = processor.tokenizer.decode(reply, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        print(f"cache length: {cache.get_seq_length()}  | {answer!r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gemma3-vl", help="a vision-language built-in (tiny-gemma3-vl)")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model)
    run(lm.model, lm.processor, args.max_new_tokens)
