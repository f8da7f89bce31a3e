"""The real ``kvinspect engine``, with a model that prints: every forward pass print()s, writes to fd 1
directly and warns. The protocol on stdout must stay clean; all of that belongs on stderr."""

import os
import sys
import warnings

import kvinspect.core.model.loading as loading

_load = loading.load_model


def load_model(*args, **kwargs):
    loaded = _load(*args, **kwargs)

    def hook(module, inputs, output):
        print("NOISE: print() in a forward hook")
        os.write(1, b"NOISE: a raw write to fd 1\n")
        warnings.warn("NOISE: a warning in a forward hook", stacklevel=1)

    loaded.model.register_forward_hook(hook)
    print("NOISE: print() after loading")
    return loaded


loading.load_model = load_model

from kvinspect.cli import main  # noqa: E402

sys.exit(main(["engine"]))
