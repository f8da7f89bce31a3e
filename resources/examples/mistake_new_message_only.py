"""Mistake: only the new message is templated and handed to generate() with the old cache.

The loop keeps one cache, as it should, but renders just the latest user message each turn
(QwenLM/Qwen3 #819). Those ids share at most the template's opening tokens with what the cache
holds; generate() cuts the cached length off the front, so most of the new message is dropped and
the reply continues from the wrong context. kvinspect names it prefix_divergence with
data.cause = not_a_continuation (turns 2+).

    kvinspect trace -- python resources/examples/mistake_new_message_only.py --model smollm2
"""

import argparse

import torch
from transformers import DynamicCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

SYSTEM = "You are a helpful assistant."
TURNS = ["I am building a customer-service bot.", "Make that system prompt shorter.", "Now in French."]


def run(model, tokenizer, max_new_tokens=12):
    cache = DynamicCache(config=model.config)
    try:
        for user_text in TURNS:
            # <- the mistake: the new message alone, not the conversation the cache holds
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_text}]
            input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                      return_dict=True)["input_ids"].to(model.device)
            result = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                    past_key_values=cache, use_cache=True, do_sample=False,
                                    max_new_tokens=max_new_tokens)
            answer = tokenizer.decode(result[0, input_ids.shape[1]:], skip_special_tokens=True)
            print(f"cache length: {cache.get_seq_length()}  | {answer!r}")
    except (IndexError, RuntimeError) as exc:  # what users hit when nothing is left to feed
        print(f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
