"""Mistake: every picture of the conversation passed again with the reused cache.

The processor renders the whole conversation with all its pictures, and all of inputs goes to
generate() with the cache: the vision tower encodes the cached picture again, and the call fails
(``Image features and image tokens do not match``). kvinspect names it media_reencoded, and the
failed turn says why.

    kvinspect trace -- python resources/examples/mistake_images_passed_again.py --model tiny-gemma3-vl
"""

import argparse
from pathlib import Path

from transformers import DynamicCache

# Only to get a model offline; yours: from_pretrained. read_image: PIL.Image.open(path) does the same.
from kvinspect.core.media.images import read_image
from kvinspect.core.model.loading import load_model

IMAGES = Path(__file__).resolve().parents[1] / "images"
TURNS = [("What is in this picture?", "gradient.png"), ("And in this one?", "checker.png")]


def run(model, processor, max_new_tokens=12):
    messages, pictures = [], []
    cache = DynamicCache(config=model.config)
    try:
        for text, picture in TURNS:
            pictures.append(read_image(IMAGES / picture))
            messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]})
            prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            inputs = processor(text=prompt_text, images=pictures, return_tensors="pt")
            result = model.generate(**inputs, past_key_values=cache, do_sample=False, max_new_tokens=max_new_tokens)
            answer = processor.tokenizer.decode(result[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
            print(f"cache length: {cache.get_seq_length()}  | {answer!r}")
    except ValueError as exc:  # what users hit: the cached picture's features have no tokens left to go to
        print(f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gemma3-vl", help="a vision-language built-in (tiny-gemma3-vl)")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model)
    run(lm.model, lm.processor, args.max_new_tokens)
