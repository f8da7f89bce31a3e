"""Mistake: a template that drops the think block from history, with the cache reused WITHOUT a prefix check.

A Qwen3-style template (resources/templates/qwen3-think.jinja) opens and closes an empty think
block in the generation prompt but renders earlier assistant turns without it. The re-rendered
history no longer matches the tokens the cache holds; generate() slices the cached part off by
length and silently continues from the wrong context. kvinspect names it prefix_divergence
(turns 2+), with the position and both texts.

    kvinspect trace -- python resources/examples/mistake_think_template_no_prefix_check.py --model smollm2
"""

import argparse
from pathlib import Path

import torch
from transformers import DynamicCache

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "qwen3-think.jinja"
SYSTEM = "You are a helpful assistant."
TURNS = ["I am building a customer-service bot.", "Make that system prompt shorter.", "Now in French."]


def run(model, tokenizer, max_new_tokens=12, template=TEMPLATE):
    chat_template = Path(template).read_text(encoding="utf-8")
    messages = [{"role": "system", "content": SYSTEM}]
    cache = DynamicCache(config=model.config)
    for user_text in TURNS:
        messages.append({"role": "user", "content": user_text})
        input_ids = tokenizer.apply_chat_template(messages, chat_template=chat_template, add_generation_prompt=True,
                                                  return_tensors="pt", return_dict=True)["input_ids"].to(model.device)
        # <- the mistake: no check that input_ids still start with what the cache holds
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
    ap.add_argument("--chat-template", default=str(TEMPLATE))
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens, args.chat_template)
