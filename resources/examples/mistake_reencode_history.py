"""Mistake: the whole history is re-encoded onto the reused cache by a manual forward loop.

The cache already holds the conversation; feeding the full rendered history again appends it a
second time, so the model attends to every earlier message twice and its replies drift.
kvinspect names it duplicate_context (turns 2+), found from the token ids themselves.

    kvinspect trace -- python resources/examples/mistake_reencode_history.py --model smollm2
"""

import argparse

import torch
from transformers import DynamicCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

SYSTEM = "You are a helpful assistant."
TURNS = ["I am building a customer-service bot.", "Make that system prompt shorter.", "Now in French."]


@torch.no_grad()
def run(model, tokenizer, max_new_tokens=12):
    messages = [{"role": "system", "content": SYSTEM}]
    cache = DynamicCache(config=model.config)  # one cache, reused: good
    for user_text in TURNS:
        messages.append({"role": "user", "content": user_text})
        input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"].to(model.device)
        # <- the mistake: the FULL history goes onto a cache that already holds most of it
        out = model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        new = []
        for _ in range(max_new_tokens):
            next_id = out.logits[:, -1:].argmax(-1)
            new.append(int(next_id))
            if int(next_id) == tokenizer.eos_token_id:
                break
            out = model(input_ids=next_id, past_key_values=cache, use_cache=True)
        answer = tokenizer.decode(new, skip_special_tokens=True)
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
