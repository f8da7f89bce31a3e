"""Run every example in one process, with one model load, one after the other.

Handy to compare the mistakes side by side in one trace (each turn is labelled with the example
file and line that made it), and what the tests do on SmolLM2:

    kvinspect trace --out out/examples -- python resources/examples/run_all.py --model smollm2
"""

import argparse
import importlib.util
from pathlib import Path

# Only to get a model offline (built-in name, model folder or .gguf); yours: from_pretrained.
from kvinspect.core.model.loading import load_model

HERE = Path(__file__).resolve().parent
EXAMPLES = (
    "correct_single_generate", "correct_multi_turn", "mistake_cache_in_loop", "mistake_reencode_history",
    "mistake_use_cache_false_with_cache", "mistake_cache_without_config",
    "mistake_think_template_no_prefix_check", "mistake_static_cache_too_small", "mistake_same_input_again",
    "mistake_new_message_only", "baseline_use_cache_false", "library_prompt_lookup_refeed",
)


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="built-in name (tiny-mistral, smollm2), model folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override every example's default")
    ap.add_argument("--only", action="append", choices=EXAMPLES, help="run only these (repeatable)")
    args = ap.parse_args()
    lm = load_model(args.model, device=args.device)
    kw = {} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens}
    for name in args.only or EXAMPLES:
        print(f"== {name}", flush=True)
        load_example(name).run(lm.model, lm.tokenizer, **kw)
