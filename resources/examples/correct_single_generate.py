"""Correct: one generate() with a DynamicCache built from the model config (the article's first snippet).

kvinspect expects no warning here (on sliding-window models it notes, as info, that storage stops
at the window). Run it as is, or under kvinspect:

    python resources/examples/correct_single_generate.py --model smollm2
    kvinspect trace -- python resources/examples/correct_single_generate.py --model tiny-mistral
"""

import argparse

from transformers import DynamicCache

# Only to get a model offline: kvinspect's loader takes a built-in name (tiny-mistral, smollm2),
# a model folder or a .gguf file. Your own code would call AutoModelForCausalLM.from_pretrained.
from kvinspect.core.model.loading import load_model

PROMPT = "Explain in three sentences what a KV cache does."


def run(model, tokenizer, max_new_tokens=16):
    # A dynamic cache grows with every token; built from the config, it knows the model's windows.
    past_key_values = DynamicCache(config=model.config)
    enc = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True).to(model.device)
    outputs = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                             past_key_values=past_key_values, use_cache=True, do_sample=False,
                             max_new_tokens=max_new_tokens)
    new_tokens = outputs[0, enc["input_ids"].shape[1]:]
    print(tokenizer.decode(new_tokens, skip_special_tokens=True))
    print("cache length:", past_key_values.get_seq_length())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    run(lm.model, lm.tokenizer, args.max_new_tokens)
