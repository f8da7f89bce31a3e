"""Mistake: the cache is created INSIDE the chat loop, so every turn re-prefills the whole history.

Replies are correct, memory looks normal; the cost is time: each turn encodes the full
conversation again instead of only the new message. kvinspect names it cache_recreated (turns 2+).

    kvinspect trace -- python resources/examples/mistake_cache_in_loop.py --model smollm2
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
    for user_text in TURNS:
        cache = DynamicCache(config=model.config)  # <- the mistake: a new, empty cache every turn
        messages.append({"role": "user", "content": user_text})
        input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"].to(model.device)
        result = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                past_key_values=cache, use_cache=True, do_sample=False,
                                max_new_tokens=max_new_tokens)
        answer = tokenizer.decode(result[0, input_ids.shape[1]:], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        print(f"cache length: {cache.get_seq_length()}  | {answer!r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
