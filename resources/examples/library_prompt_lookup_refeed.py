"""Correct code, transformers' defect: prompt-lookup decoding on a reused cache feeds the cached prefix again.

The loop is the right one (full history, one cache, the full ids given to generate()). Plain
greedy generate() slices the cached part off; on transformers 5.x (seen on 5.24) assisted and
prompt-lookup decoding do not on their first forward, so from turn 2 the cache holds the
conversation's start twice. kvinspect reports that `duplicate_context` with `data.origin:
"library"`, the transformers version and the workaround (a new cache for each such call); the
printed cache length against the conversation shows it without kvinspect too. On 4.56 the same
loop is right and kvinspect says nothing.

    kvinspect trace -- python resources/examples/library_prompt_lookup_refeed.py --model tiny-mistral
"""

import argparse

import torch
from transformers import DynamicCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

TURNS = ["Say something about caches.", "And a little more, please."]


def run(model, tokenizer, max_new_tokens=8):
    messages = []
    cache = DynamicCache(config=model.config)  # once, outside the loop
    for user_text in TURNS:
        messages.append({"role": "user", "content": user_text})
        input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"].to(model.device)
        result = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                past_key_values=cache, do_sample=False, max_new_tokens=max_new_tokens,
                                prompt_lookup_num_tokens=3)
        new = result[0, input_ids.shape[1]:]
        answer = tokenizer.decode(new, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        conversation = result.shape[1] - 1  # generate() never feeds its last token back
        print(f"cache length {cache.get_seq_length()}, conversation {conversation} | {answer!r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
