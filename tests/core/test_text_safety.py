"""The one place untrusted text is made inert: per medium (terminal, Markdown), each class of character."""

from __future__ import annotations

import pytest

from kvinspect.core.text_safety import Markdown, json_dumps_utf8, md_code, md_text, terminal_text
from kvinspect.core.tokens.text import display_piece
from tests.fuzz.hostile import POISON, unsafe


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[2J", "\\x1b[2J"), ("\x1b]0;title\x07", "\\x1b]0;title\\x07"), ("a\x00b", "a\\x00b"),
    ("\x7f", "\\x7f"), ("\x9b31m", "\\x9b31m"), ("\u202eevil", "\\u202eevil"), ("\u2066x\u2069", "\\u2066x\\u2069"),
    ("\u200f", "\\u200f"), ("\ud800", "\\ud800"), ("\U000e0041", "\\U000e0041"), ("\u2028", "\\u2028"),
    ("\r", "\\x0d"), ("plain, ümlaut, 漢字, emoji 👩‍💻", "plain, ümlaut, 漢字, emoji 👩‍💻"),
])
def test_terminal_text_shows_each_control_class_escaped(raw, shown):
    assert terminal_text(raw) == shown


def test_terminal_text_keeps_only_what_it_is_asked_to():
    assert terminal_text("a\nb\tc") == "a\\x0ab\\x09c"
    assert terminal_text("a\nb\tc\x1b", keep="\n\t") == "a\nb\tc\\x1b"
    assert not unsafe(terminal_text(POISON)) and not unsafe(terminal_text(POISON, keep="\n\t"))


def test_display_piece_escapes_controls_and_keeps_special_tokens_readable():
    assert display_piece("<|im_start|>", 1) == "<|im_start|>"
    assert display_piece(" a\n", 2) == "·a↵"
    assert display_piece("\x1b]52;c;eA==\x07", 3) == "\\x1b]52;c;eA==\\x07"
    assert display_piece("\u202e", 4) == "\\u202e"


@pytest.mark.parametrize(("raw", "md"), [
    ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
    ("[a](http://x)", "\\[a\\](http\\://x)"), ("![i](y)", "\\!\\[i\\](y)"), ("# h", "\\# h"),
    ("a\n## Reproduce", "a<br>\\#\\# Reproduce"), ("```", "\\`\\`\\`"), ("a|b", "a&#124;b"),
    ("**b** _e_ snake_case", "\\*\\*b\\*\\* \\_e\\_ snake_case"), ("- item", "\\- item"), ("1. one", "1\\. one"),
    ("0.1.0", "0.1.0"), ("www.x.org", "www\\.x.org"), ("@someone", "\\@someone"), ("&amp;", "&amp;amp;"),
    ("\x1b[31m", "\\\\x1b\\[31m"),
])
def test_md_text_is_inert(raw, md):
    assert md_text(raw) == md and isinstance(md_text(raw), Markdown)


def test_md_code_survives_backticks_and_newlines():
    assert md_code("a`b") == "``a`b``"
    assert md_code("`x`") == "`` `x` ``"
    assert md_code("a\nb\x1b") == "`a↵b\\x1b`"


def test_json_for_files_keeps_a_lone_surrogate_as_its_escape():
    import json

    text = json_dumps_utf8({"t": "a\ud800b", "u": "ü"})
    text.encode("utf-8")
    assert json.loads(text) == {"t": "a\ud800b", "u": "ü"}
