"""kvinspect: a live inspector for the KV cache of Hugging Face transformers models."""

from __future__ import annotations

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("kvinspect")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+src"

__all__ = ["__version__", "observe"]


def observe(model, tokenizer=None, trace=None, **kwargs):
    """Observe the KV cache of ``model`` while your own code runs; see :func:`kvinspect.core.observe.observe`.

    ``with kvinspect.observe(model, tokenizer, trace="out/run") as rec: ...`` records every forward
    pass in the block; ``rec.problems`` names the cache mistakes found. Imported on first call so
    that ``import kvinspect`` stays light.
    """
    from .core.observe import observe as _observe

    return _observe(model, tokenizer, trace, **kwargs)
