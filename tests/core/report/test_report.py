"""Report bundles: the round trip (run → report → the report's own command → same cache lengths),
redaction everywhere in the bundle, and the Markdown snippets the GUI copies to the clipboard.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import re
import shlex
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

import kvinspect
from kvinspect.child_render import render_in_child
from kvinspect.cli import main as cli_main
from kvinspect.core.detect.events import PREFIX_DIVERGENCE, WINDOW_REACHED
from kvinspect.core.report.bundle import (
    event_markdown,
    layer_table_markdown,
    turn_layers_markdown,
    turns_markdown,
    write_report,
)
from kvinspect.core.report.md_snippets import md_cell, md_fence, turn_phrase
from kvinspect.core.report.reproduce import reproduce
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript, GenerationSettings, load_script
from kvinspect.core.trace.redact import redact_command
from kvinspect.core.trace.tracefile import read_trace
from tests.conftest import load_cached
from tests.helpers import ROOT, run_cli

QWEN3 = ROOT / "resources" / "templates" / "qwen3-think.jinja"
HAS_QT = importlib.util.find_spec("PySide6") is not None and importlib.util.find_spec("pyqtgraph") is not None
BUNDLE = {"report.md", "summary.json", "trace.jsonl", "script.json"}
PLOTS = {"cache.png", "memory.png", "cache.svg", "memory.svg"}


def _kvinspect(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    r = run_cli(args, cwd=cwd, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def _command_in(report: Path) -> list[str]:
    """The reproduce command exactly as report.md shows it."""
    blocks = re.findall(r"```bash\n(.+?)\n```", report.read_text(encoding="utf-8"))
    assert len(blocks) == 1, blocks
    return shlex.split(blocks[0])


def _rerun_from_report(bundle: Path) -> Path:
    cmd = _command_in(bundle / "report.md")
    assert cmd[:2] == ["kvinspect", "run"]
    _kvinspect(*cmd[1:], "-q", cwd=bundle)
    return bundle / "rerun" / "trace.jsonl"


def _assert_same_lengths(original: Path, rerun: Path) -> None:
    a, b = read_trace(original), read_trace(rerun)
    assert a.n_steps == b.n_steps > 0
    assert np.array_equal(a.seen, b.seen) and np.array_equal(a.stored, b.stored)
    assert len(a.turns) == len(b.turns) == 3
    for ta, tb in zip(a.turns, b.turns):
        key = ("index", "kind", "seen", "stored", "capacity", "window", "bytes")
        assert [[lay[k] for k in key] for lay in ta.layers] == [[lay[k] for k in key] for lay in tb.layers]
        assert (ta.prompt_tokens, ta.reused_tokens, ta.new_tokens) == (tb.prompt_tokens, tb.reused_tokens,
                                                                       tb.new_tokens)
    assert [(e.kind, e.turn, e.step) for e in a.events] == [(e.kind, e.turn, e.step) for e in b.events]


def _assert_bundle_files(bundle: Path, result_notes: list[str] | None = None) -> None:
    names = {p.name for p in bundle.iterdir()}
    assert BUNDLE <= names
    if HAS_QT:
        assert PLOTS <= names
        for png in ("cache.png", "memory.png"):
            assert (bundle / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        md = (bundle / "report.md").read_text()
        assert "![" in md and "(cache.png)" in md and "(memory.svg)" in md
    else:  # the compat venv has no Qt: plots are skipped with a note, the rest is complete
        assert not PLOTS & names
        assert "plots skipped" in (bundle / "report.md").read_text()


def test_round_trip_windowed_model_through_the_cli(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["Hello! What does a KV cache store?", "Why does a window stop it?",
                                            "And memory?"], "max_new_tokens": 40}))
    _kvinspect("run", "--model", "tiny-gemma3", "--script", str(script), "--out", "run", "-q", cwd=tmp_path)
    out = _kvinspect("report", "run", "--out", "bundle", cwd=tmp_path).stdout
    bundle = tmp_path / "bundle"
    assert "reproduce, from bundle: kvinspect run --model tiny-gemma3" in out
    _assert_bundle_files(bundle)
    md = (bundle / "report.md").read_text()
    assert _command_in(bundle / "report.md") == ["kvinspect", "run", "--model", "tiny-gemma3", "--script",
                                                 "script.json", "--out", "rerun"]
    assert "`window_reached`" not in md.split("## Events")[0]  # info events are not problems
    assert "No problem events" in md and "window_reached" in md
    assert "| 0–4 | sliding | DynamicSlidingWindowLayer |" in md  # layers collapsed into ranges
    assert load_script(bundle / "script.json").turns == load_script(script).turns
    assert (bundle / "trace.jsonl").read_bytes() == (tmp_path / "run" / "trace.jsonl").read_bytes()
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["redacted"] is False and len(summary["turns"]) == 3
    _assert_same_lengths(tmp_path / "run" / "trace.jsonl", _rerun_from_report(bundle))


@pytest.mark.e2e
def test_round_trip_smollm2_with_a_diverging_template(smollm2, tmp_path):
    """A GUI-like session (no recorded command): the report rebuilds it and bundles the template."""
    opts = SessionOptions(chat_template=QWEN3.read_text(encoding="utf-8"), chat_template_name=str(QWEN3),
                          system="You are a concise geography assistant.")
    script = ChatScript(["What is the capital of France?", "And of Italy?", "Which of the two is larger?"],
                        settings=GenerationSettings(max_new_tokens=16))
    run = run_script(smollm2, script, tmp_path / "run", opts, command=None)
    assert {e.kind for e in run.record.events} == {PREFIX_DIVERGENCE}
    res = write_report(run.trace, tmp_path / "bundle", renderer=render_in_child)
    bundle = res.out_dir
    _assert_bundle_files(bundle)
    assert (bundle / "qwen3-think.jinja").read_text(encoding="utf-8") == QWEN3.read_text(encoding="utf-8")
    cmd = _command_in(bundle / "report.md")
    assert cmd == ["kvinspect", "run", "--model", "smollm2", "--script", "script.json", "--out", "rerun",
                   "--device", "cpu", "--dtype", "float32", "--chat-template", "qwen3-think.jinja"]
    md = (bundle / "report.md").read_text()
    assert "not started by `kvinspect run`" in md and "kvinspect models fetch smollm2" in md
    assert "⚠️ **2 problem events:** `prefix_divergence` (turns 2 and 3)." in md
    assert "diverged at" in md and "*What to do:*" in md
    assert load_script(bundle / "script.json").system == "You are a concise geography assistant."
    _assert_same_lengths(run.trace, _rerun_from_report(bundle))


def test_redaction_reaches_every_file(tmp_path):
    system = "Secret system prompt about project Nightingale."
    turns = ["my private question number one", "a second private message", "third secret thing"]
    opts = SessionOptions(chat_template=QWEN3.read_text(encoding="utf-8"), chat_template_name=str(QWEN3),
                          system=system)
    run = run_script(load_cached("tiny-llama"), ChatScript(turns, settings=GenerationSettings(max_new_tokens=30)),
                     tmp_path / "run", opts, command=["kvinspect", "run", "--system", system, "--out", "x"])
    divergence = [e for e in run.record.events if e.kind == PREFIX_DIVERGENCE]
    assert divergence and "(cached '" in divergence[0].message  # the excerpt quotes the conversation
    secrets = turns + [t.reply for t in run.record.turns] + [system, re.search(
        r"vs prompt ('.*?')\)", divergence[0].message).group(1)]
    assert all(len(s) > 8 for s in secrets)

    write_report(run.trace, tmp_path / "bundle", plots_enabled=False)  # first unredacted…
    assert (tmp_path / "bundle" / "script.json").exists()
    res = write_report(run.trace, tmp_path / "bundle", redact=True, plots_enabled=False)  # …then over it
    bundle = res.out_dir
    assert not (bundle / "script.json").exists()  # nothing stale survives
    for f in bundle.iterdir():
        text = f.read_text(encoding="utf-8")
        for s in secrets:
            assert s not in text, (f.name, s)
    md = (bundle / "report.md").read_text()
    assert "`script.json` cannot be included" in md and "<your turn 1>" in md
    assert f"<{run.record.turns[0].prompt_tokens} prompt tokens>" in md
    assert "(excerpt redacted)" in md
    copy = read_trace(bundle / "trace.jsonl")
    assert [t.user for t in copy.turns] == [f"<{t.prompt_tokens} prompt tokens>" for t in run.record.turns]
    assert [t.reply for t in copy.turns] == [f"<{t.new_tokens} tokens>" for t in run.record.turns]
    assert copy.header["command"] == ["kvinspect", "run", "--system", "<redacted>", "--out", "x"]
    assert np.array_equal(copy.stored, run.record.stored)  # the evidence itself is intact
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["redacted"] is True and summary["turns"][1]["events"][0]["message"].count("<redacted>") == 0
    assert "(excerpt redacted)" in summary["turns"][1]["events"][0]["message"]
    assert run.record.turns[0].user == turns[0]  # the caller's record is untouched


def test_redact_command_forms():
    assert redact_command(["kvinspect", "run", "--system=hi there", "--model", "m"]) == [
        "kvinspect", "run", "--system=<redacted>", "--model", "m"]
    assert redact_command(None) is None


@pytest.fixture(scope="module")
def gemma3_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma3")
    script = ChatScript(["hello there, cache", "tell me more about windows", "and memory?"],
                        settings=GenerationSettings(max_new_tokens=40))
    return run_script(load_cached("tiny-gemma3"), script, out, command=None).record


def test_turns_markdown(gemma3_record):
    md = turns_markdown(gemma3_record).splitlines()
    assert len(md) == 2 + 3 and md[0].startswith("| Turn | Status | Policy | Cache | Prompt |")
    t = gemma3_record.turns[1]
    assert md[3].startswith(f"| 2 | ok | reuse | #{t.cache_id} DynamicCache | {t.prompt_tokens} | "
                            f"{t.reused_tokens} | {t.prefill_tokens} | {t.new_tokens} |")


def test_layer_table_at_a_replay_step(gemma3_record):
    rec = gemma3_record
    step = rec.turns[2].first_step + 5
    md = layer_table_markdown(rec, step)
    assert md.startswith(f"**Layers at step {step}** (turn 3, cache #")
    s = rec.stored[step]
    assert f"| 0–4 | sliding | 96 | {rec.seen[step, 0]} | {s[0]} | cpu |" in md
    assert f"| 5 | full | – | {rec.seen[step, 5]} | {s[5]} | cpu |" in md
    assert s[0] == 95 and s[5] == rec.seen[step, 5]  # dynamic sliding keeps window − 1
    assert "No step" in layer_table_markdown(rec, rec.n_steps)


def test_event_markdown_has_numbers_and_versions(gemma3_record):
    ev = next(e for e in gemma3_record.events if e.kind == WINDOW_REACHED)
    md = event_markdown(ev, gemma3_record)
    assert md.startswith(f"**window_reached** (info, turn {ev.turn + 1}, step {ev.step}, layers 0–4): ")
    assert "*What to do:*" in md and "`window=96`" in md
    assert "transformers " in md and "tiny-gemma3 on cpu" in md


def test_turn_layers_markdown_collapses(gemma3_record):
    rows = turn_layers_markdown(gemma3_record.turns[2]).splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| 0–4", "| 5"]


def test_markdown_primitives_survive_hostile_text():
    assert md_cell("a|b\nc") == "a&#124;b<br>c" and md_cell(None) == "–"
    fenced = md_fence("look: ```python\nx```` y")
    assert fenced.startswith("`````text\n") and fenced.endswith("\n`````")


def test_reproduce_retargets_a_recorded_command(gemma3_record):
    rec = gemma3_record
    rec.header["command"] = ["/usr/bin/kvinspect", "run", "--model", "tiny-gemma3", "--script", "/abs/s.json",
                             "--out=/abs/out", "--chat-template", "/abs/qwen3-think.jinja", "--policy", "recreate"]
    rec.header["session"]["chat_template_text"] = "{{ messages }}"
    rec.header["session"]["chat_template"] = "/abs/qwen3-think.jinja"
    try:
        rep = reproduce(rec)
    finally:
        rec.header["command"] = None
        rec.header["session"]["chat_template_text"] = None
        rec.header["session"]["chat_template"] = None
    assert rep.from_header and rep.template_name == "qwen3-think.jinja"
    assert rep.command == ["kvinspect", "run", "--model", "tiny-gemma3", "--script", "script.json", "--out",
                           "rerun", "--chat-template", "qwen3-think.jinja", "--policy", "recreate"]


def test_reproduce_names_what_a_command_cannot_carry(gemma3_record):
    rec = gemma3_record
    saved = rec.turns[1].policy, rec.turns[2].status
    rec.turns[1].policy, rec.turns[2].status = "recreate", "stopped"
    try:
        caveats = " ".join(reproduce(rec).caveats)
    finally:
        rec.turns[1].policy, rec.turns[2].status = saved
    assert "different policies (`recreate`, `reuse`)" in caveats and "turn 3 was stopped by hand" in caveats


def test_out_folder_mistakes_exit_2(gemma3_record, tmp_path, capsys):
    run = tmp_path / "run"
    script = ChatScript(["hi"], settings=GenerationSettings(max_new_tokens=4))
    run_script(load_cached("tiny-llama"), script, run)
    other = tmp_path / "other_run"
    run_script(load_cached("tiny-llama"), script, other)
    (tmp_path / "afile").write_text("x")
    for out, why in ((run, "trace's own folder"), (other, "not empty"), (tmp_path / "afile", "is a file")):
        assert cli_main(["report", str(run), "--out", str(out), "--no-plots"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kvinspect: error: ") and why in err and err.count("\n") == 1
    assert (other / "trace.jsonl").exists() and (other / "script.json").exists()  # untouched


def test_the_renderer_is_the_callers(gemma3_record, tmp_path):
    """write_report draws nothing itself: without a renderer the bundle says so; with one, it is called."""
    res = write_report(gemma3_record, tmp_path / "plain")
    names = {p.name for p in (tmp_path / "plain").iterdir()}
    assert {"report.md", "summary.json", "trace.jsonl"} <= names and not PLOTS & names
    assert any(n.startswith("plots skipped: no renderer") for n in res.notes)
    assert "plots skipped: no renderer" in (tmp_path / "plain" / "report.md").read_text(encoding="utf-8")

    from kvinspect.core.report.renderer import PlotResult

    calls = []

    def fake(kind, input_path, out_dir, formats):
        calls.append((kind, Path(input_path).name, formats))
        png = Path(out_dir) / "cache.png"
        png.write_bytes(b"\x89PNG\r\n\x1a\n")
        return PlotResult(files=[png], notes=["memory: nothing to draw"])

    res = write_report(gemma3_record, tmp_path / "drawn", formats=("png",), renderer=fake)
    assert calls == [("trace+tokens", "trace.jsonl", ("png",))]
    md = (tmp_path / "drawn" / "report.md").read_text(encoding="utf-8")
    assert "(cache.png)" in md and "memory: nothing to draw" in md and res.notes == ["memory: nothing to draw"]
    calls.clear()
    write_report(gemma3_record, tmp_path / "off", plots_enabled=False, renderer=fake)
    assert calls == [] and "--no-plots" in (tmp_path / "off" / "report.md").read_text(encoding="utf-8")


# -- what the review of `kvinspect report` found: failed turns, observed programs, wording, plot axes ---------------

#: Python's None/NaN and "(s)" plurals in prose ("event(s)", "Turn(s)"); column headers such as "TTFT (s)" are fine.
_LEAKS = re.compile(r"\bNone\b|\bnan\b|\w\(s\)")


def _report_md(source, out: Path, **kw) -> str:
    write_report(source, out, plots_enabled=False, **kw)
    return (out / "report.md").read_text(encoding="utf-8")


def test_a_failed_turn_reads_as_sentences_without_python_none(tmp_path):
    """A static cache that overflows in turn 2 (the review's case)."""
    script = ChatScript(["Tell me about the sea, please.", "More about waves?"],
                        settings=GenerationSettings(max_new_tokens=16))
    run = run_script(load_cached("tiny-llama"), script, tmp_path / "run",
                     SessionOptions(cache_impl="static", max_cache_len=100))
    rec = read_trace(run.trace)
    assert [t.status for t in rec.turns] == ["ok", "failed"]
    # A turn that ended with no cache object is written with the class "None" (observed programs, and
    # `kvinspect run` traces of a turn that failed before its first forward): the state the review saw.
    t2 = rec.turns[1]
    t2.cache_id, t2.cache_class, t2.layers, t2.kv_bytes, t2.kv_held_bytes = 0, "None", [], 0, 0
    md = _report_md(rec, tmp_path / "bundle")
    assert not _LEAKS.findall(md), _LEAKS.findall(md)
    # capacity_near / capacity_exceeded: the counts showed turn 2 could not fit.
    assert ("⚠️ **3 problem events:** `capacity_near` (turn 1); `capacity_exceeded` (turn 2); `turn_failed` (turn 2)."
            "\n\n- Turn 2 did not complete normally (failed): see [Turns](#turns).") in md
    assert "| 2 | failed | reuse | none | 103 |" in md  # as the terminal table says it
    assert "| Cache class | `StaticCache` (turn 1); no cache object (turn 2) |" in md
    assert "Turn 2: no cache object</summary>" in md


def test_problems_and_informational_events_are_separate_sentences(tmp_path):
    script = ChatScript(["Tell me about the sea, please.", "More about waves?"],
                        settings=GenerationSettings(max_new_tokens=16))
    run = run_script(load_cached("tiny-mistral"), script, tmp_path / "run",
                     SessionOptions(policy="cache-and-use-cache-false"))
    md = _report_md(run.trace, tmp_path / "bundle")
    verdict = md.split("\n\nRecorded ")[0].split("\n\n", 1)[1]
    assert verdict == ("⚠️ **2 problem events:** `cache_fed_without_use_cache` (turn 1); `turn_failed` (turn 2).\n\n"
                       "- 1 informational event (expected behaviour, such as a window reached).\n"
                       "- Turn 2 did not complete normally (failed): see [Turns](#turns).")
    assert not re.findall(r"\bNone\b|\bnan\b", md)


def test_turn_phrase():
    assert turn_phrase([2]) == "turn 2" and turn_phrase([3, 2], capital=True) == "Turns 2 and 3"
    assert turn_phrase([1, 2, 3]) == "turns 1–3" and turn_phrase([1, 3, 5]) == "turns 1, 3 and 5"
    assert turn_phrase([1, 2, 3, 5]) == "turns 1–3 and 5"


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(Path(name).stem, ROOT / "resources" / "examples" / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def observed_record():
    """correct_multi_turn.py under kvinspect.observe(): turns are generate() calls labelled by call site."""
    lm = load_cached("tiny-gemma3")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore", FutureWarning)  # the example spells past_key_values= as the article does
        with kvinspect.observe(lm.model, lm.tokenizer) as obs:
            _load_example("correct_multi_turn.py").run(lm.model, lm.tokenizer)
    rec = obs.record
    assert len(rec.turns) == 3 and rec.turns[0].user.startswith("generate() at correct_multi_turn.py:")
    return rec


def _as_traced(record, argv: list[str]):
    """The record as `kvinspect trace -- PROGRAM` writes it (the header is all that differs)."""
    rec = copy.copy(record)
    rec.header = copy.deepcopy(record.header)
    rec.header["command"] = ["kvinspect", "trace", "--", *argv]
    rec.header["observed"].update(mode="trace", argv=argv, cwd="/home/me/proj")
    return rec


def test_a_traced_program_gets_no_script_and_a_trace_command(observed_record, tmp_path):
    argv = ["python", "correct_multi_turn.py", "--model", "tiny-gemma3"]
    res = write_report(_as_traced(observed_record, argv), tmp_path / "bundle", plots_enabled=False)
    md = res.report.read_text(encoding="utf-8")
    assert not (tmp_path / "bundle" / "script.json").exists()  # call-site labels are no chat script
    assert res.reproduction.script is None and "script.json" not in {f.name for f in res.files}
    assert _command_in(res.report) == ["kvinspect", "trace", "--out", "rerun", "--", *argv]
    assert "From the folder the program ran in (`/home/me/proj` when it was recorded)" in md
    assert "It runs the program again, unchanged, under `kvinspect trace`" in md
    assert "replays" not in md and "There is no `script.json`" in md
    assert "| Load time | – |" in md and "**Turn 1, call**" in md
    assert not _LEAKS.findall(md), _LEAKS.findall(md)


def test_an_observe_api_trace_says_the_program_reruns_it(observed_record, tmp_path):
    md = _report_md(observed_record, tmp_path / "bundle")
    assert not (tmp_path / "bundle" / "script.json").exists()
    assert "written by `kvinspect.observe()` inside the program" in md
    assert _command_in(tmp_path / "bundle" / "report.md") == observed_record.header["observed"]["argv"]
    assert "replays" not in md and "not started by `kvinspect run`" not in md
    assert not _LEAKS.findall(md), _LEAKS.findall(md)


@pytest.mark.skipif(not HAS_QT, reason="needs PySide6 and pyqtgraph")
def test_plot_step_axes_have_whole_ticks_from_zero(tmp_path):
    """The kind strip sits left of step 0: the step axis must not label -1 there, nor half steps."""
    import pyqtgraph as pg
    from PySide6 import QtWidgets

    from kvinspect.gui.report_images.trace_figures import cache_figure, memory_figure

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    script = ChatScript(["Hi there", "And?"], settings=GenerationSettings(max_new_tokens=3))
    rec = run_script(load_cached("tiny-gemma2"), script, tmp_path / "run").record
    assert rec.n_steps <= 8  # short: pyqtgraph's default spacing would go below one step
    for build in (cache_figure, memory_figure):
        win = build(rec)
        win.resize(1000, 650)
        win.show()
        app.processEvents()
        plots = [it for it in win.ci.items if type(it) is pg.PlotItem]  # not the colour bar
        assert len(plots) == 2
        for p in plots:
            lo, hi = p.viewRange()[0]
            ax = p.getAxis("bottom")
            ticks = [v for _, vs in ax.tickValues(lo, hi, ax.width()) for v in vs]
            assert ticks and all(v >= 0 and float(v).is_integer() for v in ticks), (build.__name__, lo, ticks)
        win.close()
