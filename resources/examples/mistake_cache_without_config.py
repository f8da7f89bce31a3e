"""Mistake: DynamicCache() built WITHOUT the model config, on a sliding-window model.

Output is identical, but the cache no longer knows the window: sliding layers keep every token
instead of the last `window` ones. kvinspect names it unbounded_window on windowed models
(tiny-mistral, tiny-gemma3, Gemma, Mistral, …); on a full-attention model such as SmolLM2 the
config adds nothing and kvinspect rightly says nothing.

    kvinspect trace -- python resources/examples/mistake_cache_without_config.py --model tiny-gemma3
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
    cache = DynamicCache()  # <- the mistake: no config=model.config, so no window
    cached_ids = []
    for user_text in TURNS:
        messages.append({"role": "user", "content": user_text})
        input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"].to(model.device)
        prompt = input_ids[0].tolist()
        p = 0
        while p < min(len(cached_ids), len(prompt) - 1) and cached_ids[p] == prompt[p]:
            p += 1
        if p < cache.get_seq_length():
            cache.crop(p - cache.get_seq_length())
            cached_ids = cached_ids[:p]
        result = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                past_key_values=cache, use_cache=True, do_sample=False,
                                max_new_tokens=max_new_tokens)
        new = result[0, input_ids.shape[1]:]
        cached_ids = prompt + new[:-1].tolist()
        answer = tokenizer.decode(new, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        print(f"cache length: {cache.get_seq_length()}  | {answer!r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-gemma3, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
