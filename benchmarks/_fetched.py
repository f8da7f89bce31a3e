"""A benchmark of a fetchable model stops at once when it is not fetched (the window would wait for it)."""

from __future__ import annotations

import sys


def require_fetched(model: str) -> None:
    """Exit with status 2 and the fetch command when ``model`` is a fetchable name not on disk yet."""
    from kvinspect.core.model.fetch import FETCHABLE, is_fetched

    if model in FETCHABLE and not is_fetched(model):
        print(f"{model} is not fetched: .venv/bin/kvinspect models fetch {model}", file=sys.stderr)
        raise SystemExit(2)
