"""Text from a trace is data: a poisoned script, trace and bundle through ``run``, ``tokens`` and ``report``.

Every control class (tests/fuzz/hostile.py) in every text field. What the commands print is checked
byte by byte: no control, C1, escape sequence, bidi or invisible format character comes out raw,
and the hostile text is still visible, escaped (``\\x1b]0;PWNED-TITLE``). ``report.md`` is rendered
the way GitHub would (markdown-it-py, CommonMark with tables, strikethrough and raw HTML on): the
hostile text is inert text, with no tag, link, image or heading of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fuzz.hostile import POISON, POISON_JSON, VISIBLE_MARKS, poison_trace, unsafe_bytes

ROOT = Path(__file__).resolve().parents[2]
#: A hang guard, not a speed figure: each command needs a few seconds.
TIMEOUT_S = 600
OUR_SGR = re.compile(rb"\x1b\[[0-9;]*m")


def _cli(*args: str) -> tuple[int, bytes, bytes]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "KVINSPECT_EPHEMERAL": "1", "NO_COLOR": "",
           "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "kvinspect", *args], cwd=ROOT, env=env, capture_output=True,
                       timeout=TIMEOUT_S)
    return p.returncode, p.stdout, p.stderr


def _inert(data: bytes, what: str) -> str:
    bad = unsafe_bytes(data)
    assert not bad, f"{what}: {len(bad)} raw control/format characters, first {bad[:5]}"
    return data.decode("utf-8")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    script = d / "script.json"
    script.write_text(json.dumps({"turns": [POISON, "and again " + POISON], "system": "be kind " + POISON,
                                  "max_new_tokens": 6}), encoding="utf-8")
    run = _cli("run", "--model", "tiny-llama", "--device", "cpu", "--script", str(script), "--out", str(d / "run"))
    assert run[0] == 0, run[2][-2000:]
    trace = poison_trace(d / "run" / "trace.jsonl", d / "poisoned" / "trace.jsonl")
    return SimpleNamespace(dir=d, run=run, trace=trace)


def test_run_echoes_the_turns_and_replies_inert(hostile):
    rc, out, err = hostile.run
    text = _inert(out, "run's stdout")
    _inert(err, "run's stderr")
    assert "── turn 1 ── user: «" in text and "assistant: " in text
    for mark in ("\\x00", "\\x1b[2J", "\\x7f"):  # the echo is cut at 100 characters: these come first
        assert mark in text  # shown escaped, not dropped


@pytest.mark.parametrize("color", ["never", "always"])
def test_tokens_prints_hostile_pieces_inert_and_special_tokens_readable(hostile, color):
    rc, out, err = _cli("tokens", str(hostile.trace), "--color", color)
    assert rc == 0, err[-2000:]
    if color == "always":
        assert OUR_SGR.search(out)  # kvinspect's own colours are the only escapes
        out = OUR_SGR.sub(b"", out)
    text = _inert(out, f"tokens --color {color}")
    _inert(err, "tokens' stderr")
    assert "<|im_start|>" in text  # a special token reads as itself
    for mark in (*VISIBLE_MARKS, "\\udfff\\ud800"):
        assert mark in text


def _rendered(md_text: str):
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough")
    tokens = md.parse(md_text)

    def walk(ts):
        for t in ts:
            yield t
            if t.children:
                yield from walk(t.children)

    return md, tokens, list(walk(tokens))


#: kvinspect's own tags in report.md (collapsible sections, small print, line breaks in cells).
OWN_TAGS = re.compile(r"</?(details|summary|sub|br)( open)?>")


def test_report_of_a_poisoned_trace_prints_inert_and_renders_inert(hostile):
    out_dir = hostile.dir / "bundle"
    rc, out, err = _cli("report", str(hostile.trace), "--out", str(out_dir))
    assert rc == 0, err[-2000:]
    _inert(out, "report's stdout")
    _inert(err, "report's stderr")
    raw = (out_dir / "report.md").read_bytes()
    text = _inert(raw, "report.md")  # it is also read in terminals (cat, less) and editors
    assert "PWNED-TITLE" in text
    md, tokens, flat = _rendered(text)
    files = {p.name for p in out_dir.iterdir()}
    for t in flat:
        if t.type in ("html_inline", "html_block"):
            assert "<" not in OWN_TAGS.sub("", t.content), f"raw HTML from the trace: {t.content[:200]!r}"
        elif t.type == "link_open":
            href = t.attrs["href"]
            assert href.startswith("#") or href in files, f"a link from the trace: {href!r}"
        elif t.type == "image":
            assert t.attrs["src"] in files, f"an image from the trace: {t.attrs['src']!r}"
    headings = [(t.tag, flat[i + 1].content) for i, t in enumerate(flat) if t.type == "heading_open"]
    h2 = [c for tag, c in headings if tag == "h2"]
    assert [tag for tag, _ in headings].count("h1") == 1
    assert h2.count("Reproduce") == 1 and h2.index("Reproduce") == 0  # no forged section above the real one
    assert set(h2) <= {"Reproduce", "Environment", "Model", "Cache and session", "Generation config provenance",
                       "Turns", "Conversation", "Events", "Checklist", "Plots", "Layers at the end of each turn",
                       "Trace notes", "Files in this bundle"}, h2
    assert all(tag in ("h1", "h2", "h3") for tag, _ in headings)
    assert not any(c.strip() == "Heading" for _, c in headings)
    html = md.render(text)
    assert "<script" not in html and "<img src=\"x\"" not in html and 'href="http' not in html
    # The hostile Markdown is there, as text: what a reader sees is the sender's characters, inert.
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "[click me](http" in html
    # Every table row has its header's cells: a `|` in a field never adds a column (which would hide text).
    for i, t in enumerate(tokens):
        if t.type == "table_open":
            j, rows = i, []
            while tokens[j].type != "table_close":
                if tokens[j].type == "tr_open":
                    rows.append(0)
                elif tokens[j].type in ("th_open", "td_open"):
                    rows[-1] += 1
                j += 1
            assert len(set(rows)) == 1, rows
    # The summary and the rebuilt script keep the hostile text exactly (JSON escapes), and stay valid JSON.
    summary = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["model"] == "tiny-llama" + POISON_JSON
    script = json.loads((out_dir / "script.json").read_text(encoding="utf-8"))
    assert script["turns"][0].startswith("«") and "\udfff" in script["turns"][0]


def test_rerunning_a_poisoned_bundle_is_refused_in_one_inert_line(hostile):
    out_dir = hostile.dir / "bundle-rerun"
    rc, _, err = _cli("report", str(hostile.trace), "--out", str(out_dir), "--no-plots")
    assert rc == 0, err[-2000:]
    rc, out, err = _cli("run", "--model", "tiny-llama", "--device", "cpu", "--script", str(out_dir / "script.json"),
                        "--out", str(hostile.dir / "rerun"))
    assert rc == 2, err[-2000:]
    _inert(out, "run's stdout")
    lines = [ln for ln in _inert(err, "run's stderr").splitlines() if ln.startswith("kvinspect:")]
    assert len(lines) == 1 and "lone surrogate" in lines[0], err[-2000:]
    assert not (hostile.dir / "rerun").exists()
