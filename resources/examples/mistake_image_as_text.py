"""Mistake: image turns rendered with the tokenizer alone, never through the processor.

The chat template writes the image placeholder, the tokenizer makes it one token, and nothing
expands it into the image's span or makes pixels: the model answers without the picture, and
nothing fails. kvinspect names it media_fed_as_text.

    kvinspect trace -- python resources/examples/mistake_image_as_text.py --model tiny-gemma3-vl
"""

import argparse

from transformers import DynamicCache

# Only to get a model offline; yours: from_pretrained.
from kvinspect.core.model.loading import load_model

TURNS = ["What is in this picture?", "And in this one?"]


def run(model, processor, max_new_tokens=12):
    tokenizer = processor.tokenizer
    messages = []
    cache = DynamicCache(config=model.config)
    for text in TURNS:
        messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]})
        # The mistake: the tokenizer, where the processor (text and images) belongs.
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        result = model.generate(**inputs, past_key_values=cache, do_sample=False, max_new_tokens=max_new_tokens)
        answer = tokenizer.decode(result[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        print(f"cache length: {cache.get_seq_length()}  | {answer!r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gemma3-vl", help="a vision-language built-in (tiny-gemma3-vl)")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model)
    run(lm.model, lm.processor, args.max_new_tokens)
