"""Run under ``kvinspect trace`` and plainly by test_compiled.py: every built-in's forward compiled with fullgraph=True.

Two ways a forward gets compiled: transformers' own (``generate()`` with a static cache and a
``CompileConfig``) and the user's (``torch.compile(model, fullgraph=True)`` called by hand). It prints one
JSON line per built-in: the ids each path produced, or the error it raised, and the graph breaks Dynamo
counted; the test compares the plain run's lines with the traced run's.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from transformers import CompileConfig

from kvinspect.core.model.loading import load_model


def run(spec: str) -> dict:
    lm = load_model(spec, device="cpu")
    model, tok = lm.model, lm.tokenizer
    ids = tok("The cache holds", return_tensors="pt")["input_ids"]
    out: dict = {"spec": spec}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = CompileConfig(fullgraph=True, dynamic=False)
        cfg._compile_all_devices = True  # transformers compiles on CUDA only unless told (its own tests do this)
        try:
            gen = model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static",
                                 compile_config=cfg)
            out["generate"] = gen[0].tolist()
        except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
            out["generate"] = f"{type(exc).__name__}"
        try:
            compiled = torch.compile(model, fullgraph=True)
            with torch.no_grad():
                logits = compiled(input_ids=ids, use_cache=False).logits
            out["forward"] = logits[0, -1].argmax().item()
        except Exception as exc:  # noqa: BLE001
            out["forward"] = f"{type(exc).__name__}"
    out["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    out["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:120]}" for w in caught})
    return out


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        print(json.dumps(run(spec)), flush=True)
