"""Baseline: the chat loop with use_cache=False and no cache at all (the slow comparison run).

Every step re-reads the whole sequence. Fine as a measured baseline, wrong on a production path;
kvinspect names it cache_disabled (every turn) so it is never left in by accident.

    kvinspect trace -- python resources/examples/baseline_use_cache_false.py --model smollm2
"""

import argparse

import torch

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

SYSTEM = "You are a helpful assistant."
TURNS = ["I am building a customer-service bot.", "Make that system prompt shorter."]


def run(model, tokenizer, max_new_tokens=8):
    messages = [{"role": "system", "content": SYSTEM}]
    for user_text in TURNS:
        messages.append({"role": "user", "content": user_text})
        input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"].to(model.device)
        result = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                use_cache=False,  # the baseline switch: no KV cache at all
                                do_sample=False, max_new_tokens=max_new_tokens)
        answer = tokenizer.decode(result[0, input_ids.shape[1]:], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        print(repr(answer))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
