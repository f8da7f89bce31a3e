"""Mistake: a cache is passed together with use_cache=False (a "baseline" switch left half-flipped).

generate() then re-feeds the whole sequence at every step, and the cache passed in still takes
each of those inputs: it swallows the prompt again at every step. kvinspect names it
cache_fed_without_use_cache (every call).

    kvinspect trace -- python resources/examples/mistake_use_cache_false_with_cache.py --model smollm2
"""

import argparse

from transformers import DynamicCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

PROMPTS = ["Explain in three sentences what a KV cache does.", "What is a sliding window?"]


def run(model, tokenizer, max_new_tokens=8):
    for prompt in PROMPTS:  # independent prompts, a fresh cache for each: fine so far
        past_key_values = DynamicCache(config=model.config)
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True).to(model.device)
        outputs = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                 past_key_values=past_key_values,
                                 use_cache=False,  # <- the mistake: no cache wanted, yet one is passed
                                 do_sample=False, max_new_tokens=max_new_tokens)
        print(tokenizer.decode(outputs[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
        print("cache length:", past_key_values.get_seq_length(), "for", outputs.shape[1] - 1, "tokens")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
