"""What resources/examples/expected.json says each example must produce, on this transformers."""

from __future__ import annotations

import json

import transformers

from tests.helpers import RESOURCES

EXAMPLES_DIR = RESOURCES / "examples"

#: Checked on transformers 5.x only. On 4.x (4.56.2, measured) generate() raises IndexError before its
#: first forward when the cache already holds every id it is given, so no hook runs and no turn is
#: recorded (docs/observe.md); and its static sliding layers fail the second prefill with a shape
#: mismatch, a failed turn rather than a capacity event.
FIVE_ONLY = {"mistake_same_input_again.py", "mistake_new_message_only.py", "mistake_static_cache_too_small.py",
             # 4.56 slices the cached prefix off an assisted / prompt-lookup call (by cache_position): no defect there
             "library_prompt_lookup_refeed.py"}


def load_expected(images: bool = False) -> dict:
    """The text examples, or (``images``) the vision-language ones: ``run(model, processor)`` on tiny-gemma3-vl."""
    data = json.loads((EXAMPLES_DIR / "expected.json").read_text())
    old = int(transformers.__version__.split(".")[0]) < 5
    return {k: v for k, v in data.items() if k.endswith(".py") and not (old and k in FIVE_ONLY)
            and bool(v.get("images")) == images}
