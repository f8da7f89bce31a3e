"""Byte units and counts, said one way everywhere: tables, tooltips, reports, plot axes (binary units,
``KiB``…; ``1 turn``, ``2 turns``).

Qt-free: the window's axes and the report figures take their unit from :func:`byte_scale`, every
text from :func:`fmt_bytes`.
"""

from __future__ import annotations

#: Binary units, one per power of 1024.
BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def byte_scale(max_bytes: float) -> tuple[float, str]:
    """The largest unit ``max_bytes`` reaches one of: ``(divisor, unit)``; ``(1.0, "B")`` below a KiB.

    >>> byte_scale(3 * 1024 ** 2)
    (1048576.0, 'MiB')
    """
    v = abs(float(max_bytes or 0))
    for k in range(len(BYTE_UNITS) - 1, 0, -1):
        div = float(1024 ** k)
        if v >= div:
            return div, BYTE_UNITS[k]
    return 1.0, BYTE_UNITS[0]


def fmt_bytes(n: int | float | None) -> str:
    """``0 B``, ``512 B``, ``1.5 KiB``, ``93.2 MiB``: whole bytes, one decimal above; None and 0 are ``0 B``."""
    if not n:
        return "0 B"
    div, unit = byte_scale(n)
    return f"{float(n):.0f} B" if unit == "B" else f"{float(n) / div:.1f} {unit}"


def fmt_count(n: int, noun: str) -> str:
    """``1 turn``, ``2 turns``, ``1,024 steps``: the count with thousands separators, the noun in -s for any but one.

    >>> fmt_count(1, "turn"), fmt_count(1_024, "step")
    ('1 turn', '1,024 steps')
    """
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
