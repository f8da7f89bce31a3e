"""Correct: a chat loop that re-renders the whole history every turn and reuses ONE cache.

The article's second snippet, finished the way its last paragraph asks: keep the ids the cache
holds, crop the cache to the longest common prefix with the new prompt (the template may render
history differently), then give generate() the full ids with the cache; it feeds only the part
after the cached prefix. kvinspect expects no warning here.

    kvinspect trace -- python resources/examples/correct_multi_turn.py --model smollm2
"""

import argparse

import torch
from transformers import DynamicCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

SYSTEM = "You are a helpful assistant."
TURNS = ["I am building a customer-service bot.", "Make that system prompt shorter.", "Now in French."]


def run(model, tokenizer, max_new_tokens=12):
    messages = [{"role": "system", "content": SYSTEM}]
    cache = DynamicCache(config=model.config)  # once, outside the loop
    cached_ids = []  # the token ids the cache holds
    for user_text in TURNS:
        messages.append({"role": "user", "content": user_text})
        input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"].to(model.device)
        prompt = input_ids[0].tolist()
        # Prefix check: keep only what the new prompt really starts with (at least one token to feed).
        p = 0
        while p < min(len(cached_ids), len(prompt) - 1) and cached_ids[p] == prompt[p]:
            p += 1
        if p < cache.get_seq_length():
            try:
                cache.crop(p - cache.get_seq_length())  # the negative form works on every version
                cached_ids = cached_ids[:p]
            except (ValueError, RuntimeError):  # sliding layers past their window cannot be cropped
                cache, cached_ids = DynamicCache(config=model.config), []
        before = cache.get_seq_length()
        result = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                past_key_values=cache, use_cache=True, do_sample=False,
                                max_new_tokens=max_new_tokens)
        new = result[0, input_ids.shape[1]:]
        cached_ids = prompt + new[:-1].tolist()  # generate() never feeds its last token back
        answer = tokenizer.decode(new, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        print(f"cache length: {before} -> {cache.get_seq_length()}  | {answer!r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
