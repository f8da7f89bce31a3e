"""How deep a JSON text nests, measured without parsing it: a guard that runs before ``json.loads``.

Python's JSON decoder recurses once per level, so a line of 100,000 ``[`` raises RecursionError
(or worse, in a thread with a small stack). Every reader of JSON from outside kvinspect's own
writers (the engine's requests, settings.json) checks the depth first and refuses what is too deep,
in its own words.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Nothing kvinspect reads nests deeper than a few levels; this leaves room and stays far from recursion limits.
MAX_DEPTH = 64

_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


class TooDeep(ValueError):
    """The JSON nests deeper than allowed."""


def json_depth(raw: bytes | str) -> int:
    """How deep ``raw``'s arrays and objects nest (strings skipped; the text need not be valid JSON)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b"", data)):
        if m.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises :class:`TooDeep` (a ValueError) instead of recursing past ``max_depth``."""
    if json_depth(text) > max_depth:
        raise TooDeep(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except RecursionError:  # unreachable after the check; kept so no caller ever sees one
        raise TooDeep(f"nested deeper than {max_depth} levels") from None
