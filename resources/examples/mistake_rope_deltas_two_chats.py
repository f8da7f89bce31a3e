"""Mistake: two image conversations on one Qwen2-VL model, and the first continued after the second.

Each conversation has its own cache and reuses it correctly. But Qwen2-VL's M-RoPE keeps the
``rope_deltas`` of the last prefill on the model, not in the cache: after the second
conversation's prefill, a text-only follow-up in the first continues its cache with the second's
deltas. Every new position is off, and nothing fails. kvinspect names it rope_deltas_stale.

    kvinspect trace -- python resources/examples/mistake_rope_deltas_two_chats.py --model tiny-qwen2-vl
"""

import argparse
from pathlib import Path

from transformers import DynamicCache

# Only to get a model offline; yours: from_pretrained. read_image: PIL.Image.open(path) does the same.
from kvinspect.core.media.images import read_image
from kvinspect.core.model.loading import load_model

IMAGES = Path(__file__).resolve().parents[1] / "images"


class Chat:
    """One conversation: its messages, pictures, cache and the ids the cache holds."""

    def __init__(self, model):
        self.messages, self.pictures, self.cache, self.ids = [], [], DynamicCache(config=model.config), []

    def say(self, model, processor, text, picture=None, max_new_tokens=12):
        content = [{"type": "text", "text": text}]
        if picture is not None:
            self.pictures.append(read_image(IMAGES / picture))
            content.insert(0, {"type": "image"})
        self.messages.append({"role": "user", "content": content})
        prompt_text = processor.apply_chat_template(self.messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=prompt_text, images=self.pictures or None, return_tensors="pt")
        extra = {}
        if picture is not None:  # the new picture's features; every picture's grid (for the positions)
            n_old = int(inputs["image_grid_thw"][:-1].prod(-1).sum())
            extra["mm_encoder_outputs"] = {"image": model.get_image_features(
                pixel_values=inputs["pixel_values"][n_old:], image_grid_thw=inputs["image_grid_thw"][-1:],
                return_dict=True)}
        result = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                mm_token_type_ids=inputs["mm_token_type_ids"],
                                image_grid_thw=inputs.get("image_grid_thw"), past_key_values=self.cache,
                                do_sample=False, max_new_tokens=max_new_tokens, **extra)
        reply = result[0, inputs["input_ids"].shape[1]:]
        self.ids = inputs["input_ids"][0].tolist() + reply[:-1].tolist()
        answer = processor.tokenizer.decode(reply, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": answer})
        return answer


def run(model, processor, max_new_tokens=12):
    first, second = Chat(model), Chat(model)
    print(first.say(model, processor, "What is in this picture?", "tiles.png", max_new_tokens))
    print(second.say(model, processor, "Describe it.", "gradient.png", max_new_tokens))
    # The mistake: back to the first conversation; the model still holds the second one's rope_deltas.
    print(first.say(model, processor, "And its colours?", None, max_new_tokens))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen2-vl", help="a Qwen2-VL style built-in (tiny-qwen2-vl)")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model)
    run(lm.model, lm.processor, args.max_new_tokens)
