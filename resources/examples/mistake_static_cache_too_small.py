"""Mistake: a StaticCache sized for the first turn, reused for the whole conversation.

The cache is built once with ``max_cache_len`` = the first prompt plus ``max_new_tokens``, the
way a single-turn example sizes it, then reused every turn. A static cache never grows: turn 2's
prompt plus its reply needs more rows than exist, and transformers raises inside the forward
(``IndexError: index_copy_(): index N is out of bounds``; huggingface/transformers #37269, #39593).
kvinspect names it capacity_near after turn 1 (the counts show turn 2 cannot fit) and
capacity_exceeded on the failed turn 2; the program sees its own exception.

    kvinspect trace -- python resources/examples/mistake_static_cache_too_small.py --model smollm2
"""

import argparse

import torch
from transformers import StaticCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

SYSTEM = "You are a helpful assistant."
TURNS = ["I am building a customer-service bot.", "Make that system prompt shorter.", "Now in French."]


def run(model, tokenizer, max_new_tokens=12):
    messages = [{"role": "system", "content": SYSTEM}]
    cache = None
    try:
        for user_text in TURNS:
            messages.append({"role": "user", "content": user_text})
            input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                      return_dict=True)["input_ids"].to(model.device)
            if cache is None:
                # <- the mistake: sized for this prompt and one reply, then reused for every turn
                cache = StaticCache(config=model.config, max_cache_len=input_ids.shape[1] + max_new_tokens)
            result = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                    past_key_values=cache, use_cache=True, do_sample=False,
                                    max_new_tokens=max_new_tokens)
            answer = tokenizer.decode(result[0, input_ids.shape[1]:], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
            print(f"cache length: {cache.get_seq_length()}  | {answer!r}")
    except (IndexError, RuntimeError) as exc:  # what users hit: the cache has no row left
        print(f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
