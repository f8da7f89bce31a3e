"""Mistake: the first turn's input_ids passed again together with the cache generate() filled.

The loop keeps the cache but not the ids: every turn it hands generate() the same opening prompt
(huggingface/transformers #27546, #32019). The cache already holds those ids and the reply, so
generate() cuts the cached length off the front and continues from whatever is left: the new
message never reaches the model. kvinspect names it prefix_divergence with
data.cause = input_shorter_than_cache (turns 2+).

    kvinspect trace -- python resources/examples/mistake_same_input_again.py --model smollm2
"""

import argparse

import torch
from transformers import DynamicCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

SYSTEM = "You are a helpful assistant."
TURNS = ["I am building a customer-service bot.", "Make that system prompt shorter.", "Now in French."]


def run(model, tokenizer, max_new_tokens=12):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[0]}]
    input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                              return_dict=True)["input_ids"].to(model.device)
    cache = DynamicCache(config=model.config)
    try:
        for _user_text in TURNS:
            # <- the mistake: the same input_ids every turn, with the cache that already holds them
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
