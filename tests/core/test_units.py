"""Counts and byte sizes as every text in the app says them."""

from __future__ import annotations

from kvinspect.core.units import fmt_bytes, fmt_count


def test_a_count_of_one_is_singular_and_every_other_plural():
    assert [fmt_count(n, "turn") for n in (0, 1, 2)] == ["0 turns", "1 turn", "2 turns"]
    assert fmt_count(1_234_567, "step") == "1,234,567 steps"


def test_bytes_in_binary_units():
    assert [fmt_bytes(x) for x in (None, 0, 512)] == ["0 B", "0 B", "512 B"]
    assert fmt_bytes(1536) == "1.5 KiB"
