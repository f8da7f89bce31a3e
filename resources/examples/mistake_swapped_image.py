"""Mistake: the first turn's picture swapped for another, and the cache of the old one reused.

The program lets the user replace the picture of an earlier turn, then asks a follow-up. The
re-rendered conversation has exactly the ids the cache holds (a picture is not in the ids, only
its placeholder span), so the token prefix check says everything up to the new question is
cached; the new picture's pixels go with the call, while the cache's rows are still the old
picture's. The true divergence is at the image's first token, where the ids agree. kvinspect
names it prefix_divergence with cause media_changed, at that position. (Gemma 3 then refuses
the call: the picture has no image tokens in the part fed.)

    kvinspect trace -- python resources/examples/mistake_swapped_image.py --model tiny-gemma3-vl
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
    cached_ids = []
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]
    pictures = [read_image(IMAGES / "gradient.png")]
    try:
        for follow_up in (None, "Is it brighter now?"):
            if follow_up is not None:
                pictures[0] = read_image(IMAGES / "checker.png")  # the user swapped the first picture
                messages.append({"role": "user", "content": follow_up})
            prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            inputs = processor(text=prompt_text, images=pictures, return_tensors="pt")
            prompt = inputs["input_ids"][0].tolist()
            p = 0  # the token prefix check: the ids agree all the way to the new question
            while p < min(len(cached_ids), len(prompt) - 1) and cached_ids[p] == prompt[p]:
                p += 1
            if p < cache.get_seq_length():
                cache.crop(p - cache.get_seq_length())
                cached_ids = cached_ids[:p]
            result = model.generate(**inputs, past_key_values=cache, do_sample=False, max_new_tokens=max_new_tokens)
            reply = result[0, len(prompt):]
            cached_ids = prompt + reply[:-1].tolist()
            answer = processor.tokenizer.decode(reply, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
            print(f"cache length: {cache.get_seq_length()}  | {answer!r}")
    except ValueError as exc:
        print(f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gemma3-vl", help="a vision-language built-in (tiny-gemma3-vl)")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model)
    run(lm.model, lm.processor, args.max_new_tokens)
