"""kvinspect: a live inspector for the KV cache of Hugging Face transformers models."""

from __future__ import annotations

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("kvinspect")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+src"

__all__ = ["__version__"]
