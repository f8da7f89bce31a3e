"""``kvinspect diff`` and the diff section: where two traces of one conversation part.

Built from real runs of a tiny model: a trace against itself has no difference; a ``refeed``
trace against a ``reuse`` one parts at the second turn's first step (the whole conversation fed
again), with the ``duplicate_context`` events only on the refeed side. Text from a trace is data:
an escape sequence in a reply reaches neither the terminal nor the Markdown as markup.
"""

from __future__ import annotations

import json

import pytest

from kvinspect.core.compare.trace_diff import diff_markdown, diff_records, diff_text
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.trace.tracefile import read_trace
from tests.conftest import load_cached
from tests.helpers import cli_main

TURNS = ["hello there how are you", "second turn text", "third one"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    base = tmp_path_factory.mktemp("diff")
    lm = load_cached("tiny-llama")
    script = ChatScript(turns=TURNS, settings=GenerationSettings(max_new_tokens=6))
    out = {}
    for policy in ("reuse", "refeed"):
        run_script(lm, script, base / policy, SessionOptions(policy=policy))
        out[policy] = base / policy
    return out


def test_a_trace_against_itself_has_no_difference(traces, capsys):
    rc, out, err = cli_main(["diff", traces["reuse"], traces["reuse"] / "trace.jsonl"], capsys)
    assert rc == 0 and err == ""
    assert "no difference" in out
    rec = read_trace(traces["reuse"])
    d = diff_records(rec, rec)
    assert d["same"] and all(p["same"] for p in d["layers"]) and d["tokens"]["same"] is True
    assert "No difference" in diff_markdown(d)


def test_refeed_against_reuse_names_the_step_and_the_event(traces, capsys):
    a, b = read_trace(traces["refeed"]), read_trace(traces["reuse"])
    d = diff_records(a, b, ("refeed", "reuse"))
    assert not d["same"]
    (full,) = d["layers"]
    second = a.turns[1]
    # Refeed feeds the whole conversation again on turn 2: its first forward already sees more tokens.
    assert (full["turn"], full["step"], full["field"]) == (1, 0, "seen")
    assert full["step_a"] == second.first_step
    assert full["a"] == int(a.seen[second.first_step, 0]) > full["b"] == int(b.seen[b.turns[1].first_step, 0])
    kinds = {e["kind"] for e in d["events"]["only_a"]}
    assert kinds == {"duplicate_context"} and not d["events"]["only_b"]
    assert {c["key"] for c in d["checklist"]} == {"length"}
    assert all((c["a"], c["b"]) == ("fail", "pass") for c in d["checklist"])
    rc, out, _ = cli_main(["diff", "--names", "refeed,reuse", traces["refeed"], traces["reuse"]], capsys)
    assert rc == 0
    assert f"first differ at turn 2, step 0 (global step {second.first_step})" in out
    assert "only in refeed: turn 2" in out and "duplicate_context" in out
    md = diff_markdown(d)
    assert "| full | 4 | turn 2, step 0" in md and "`duplicate_context`" in md
    rc, out, _ = cli_main(["diff", "--json", traces["refeed"], traces["reuse"]], capsys)
    assert json.loads(out)["layers"][0]["turn"] == 1


def test_first_differing_token_has_context_on_both_sides():
    from kvinspect.core.trace.record import TraceRecord, TurnRecord

    def rec(tail: list[int]) -> TraceRecord:
        r = TraceRecord(1, {"layers": [{"index": 0, "config_attention": "full"}]})
        ids = list(range(40, 60)) + tail
        r.add_turn(TurnRecord(index=0, status="ok", ids={"generated": ids, "pieces": {str(i): chr(i) for i in ids}}))
        return r

    d = diff_records(rec([1, 2, 3]), rec([1, 9, 3]))
    t = d["tokens"]
    assert (t["turn"], t["position"]) == (0, 21)
    assert t["before"] == "".join(chr(i) for i in range(45, 60)) + chr(1)  # the 16 tokens before
    assert t["a"] == "\x02\x03" and t["b"] == "\t\x03"
    text = diff_text(d)
    assert "\x02" not in text and "\t" not in text.split("B: ")[-1]


def test_trace_text_is_data_in_the_diff():
    from kvinspect.core.detect.events import Event
    from kvinspect.core.trace.record import TraceRecord, TurnRecord

    a = TraceRecord(1, {"layers": [{"index": 0, "config_attention": "full"}]})
    b = TraceRecord(1, {"layers": [{"index": 0, "config_attention": "full"}]})
    for r in (a, b):
        r.add_turn(TurnRecord(index=0, status="ok", cache_class="DynamicCache"))
    a.add_event(Event("turn_failed", "error", 0, 0, "boom \x1b[31mred\x1b[0m <img src=x> | `x`"))
    d = diff_records(a, b, ("\x1b]0;title\x07", "**b**"))
    text, md = diff_text(d), diff_markdown(d)
    assert "\x1b" not in text and "\x07" not in text
    assert "\x1b" not in md and "<img" not in md and "**b**" not in md


def test_bad_input_is_one_line_and_other_models_are_named(traces, tmp_path, capsys):
    from kvinspect.core.trace.record import TraceRecord

    junk = tmp_path / "junk.jsonl"
    junk.write_text("not a trace\n")
    for args in ([traces["reuse"], tmp_path / "missing"], [junk, traces["reuse"]],
                 ["--names", "same,same", traces["reuse"], traces["reuse"]]):
        rc, out, err = cli_main(["diff", *args], capsys)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("kvinspect: error: ")
    small = TraceRecord(2, {"model": {"spec": "other"}, "layers": [{"index": 0, "config_attention": "full"}] * 2})
    d = diff_records(read_trace(traces["reuse"]), small)
    assert not d["same"] and "different models" in d["notes"][0] and "note: " in diff_text(d)
