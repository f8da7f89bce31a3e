"""``--overwrite`` never loses the earlier output: ``run``, ``compare`` and ``trace``.

The earlier files are set aside in a hidden sibling folder (``commands/common.py`` ClaimedOut) and
come back, byte for byte, when the new command cannot start; they are deleted only once the new
output is on disk, and then no hidden folder is left behind.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import kvinspect.cli as cli
from tests.helpers import FUZZ_SEED

SEED = FUZZ_SEED


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch):
    monkeypatch.setattr(cli, "quiet_libraries", lambda: None)  # leave this process's environment alone


def _plant(out: Path, files: dict[str, str]) -> dict[str, str]:
    for name, body in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(body, encoding="utf-8")
    return files


def _tree(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text(encoding="utf-8") for p in sorted(out.rglob("*")) if p.is_file()}


def _hidden(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def _main(args, capsys) -> tuple[int, list[str]]:
    """Exit code and kvinspect's own stderr lines (not the loading progress), never a traceback."""
    rc = cli.main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, [ln for ln in err.splitlines() if ln.startswith("kvinspect:")]


@pytest.fixture
def script(tmp_path) -> Path:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"turns": ["hi"], "max_new_tokens": 2}), encoding="utf-8")
    return p


@pytest.fixture
def unloadable(tmp_path) -> Path:
    """A model folder that resolves (so --out is claimed first) and then fails to load."""
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": "four"}))
    return bad


# -- run ------------------------------------------------------------------------------------------------------------

RUN_FILES = {"trace.jsonl": "old trace\n", "summary.json": '{"old": true}', "script.json": '{"turns": ["old"]}'}


@pytest.mark.parametrize("failure", ["bad model spec", "unloadable model", "missing template", "huge turn"])
def test_a_run_that_cannot_start_keeps_the_earlier_run(tmp_path, capsys, script, unloadable, failure):
    out = tmp_path / "out"
    old = _plant(out, RUN_FILES)
    extra = {"bad model spec": ["--model", str(tmp_path / "nope")],
             "unloadable model": ["--model", str(unloadable)],
             "missing template": ["--model", "tiny-llama", "--chat-template", str(tmp_path / "nope.jinja")],
             "huge turn": ["--model", "tiny-llama"]}[failure]
    if failure == "huge turn":  # tokenised, then refused before generate(): tiny-llama has 4,096 positions
        script.write_text(json.dumps({"turns": ["a" * 200_000], "max_new_tokens": 2}), encoding="utf-8")
    rc, err = _main(["run", *extra, "--script", str(script), "--out", str(out), "-q", "--overwrite"], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith("kvinspect: error: "), err
    if failure == "huge turn":
        assert "context limit: turn 1's prompt is 200,0" in err[0] and "4,096 positions" in err[0], err
    assert _tree(out) == old
    assert _hidden(tmp_path) == []


def test_a_refused_first_turn_leaves_no_partial_run(tmp_path, capsys, script):
    script.write_text(json.dumps({"turns": ["a" * 200_000], "max_new_tokens": 2}), encoding="utf-8")
    new = tmp_path / "new"
    rc, err = _main(["run", "--model", "tiny-llama", "--script", str(script), "--out", str(new), "-q"], capsys)
    assert rc == 2 and len(err) == 1 and "context limit" in err[0], err
    assert not new.exists()  # no script.json, no header-only trace: the folder made for it is gone
    mine = tmp_path / "mine"
    _plant(mine, {"notes.txt": "mine"})
    rc, err = _main(["run", "--model", "tiny-llama", "--script", str(script), "--out", str(mine), "-q"], capsys)
    assert rc == 2 and _tree(mine) == {"notes.txt": "mine"}


def test_a_successful_run_replaces_the_earlier_one_and_leaves_nothing_aside(tmp_path, capsys, script):
    out = tmp_path / "out"
    _plant(out, {**RUN_FILES, "notes.txt": "mine"})
    rc, err = _main(["run", "--model", "tiny-llama", "--script", str(script), "--out", str(out), "-q",
                     "--overwrite"], capsys)
    assert rc == 0, err
    from kvinspect.core.trace.tracefile import read_trace

    assert [t.user for t in read_trace(out / "trace.jsonl").turns] == ["hi"]
    assert json.loads((out / "summary.json").read_text()).get("old") is None
    assert json.loads((out / "script.json").read_text())["turns"] == ["hi"]
    assert (out / "notes.txt").read_text() == "mine"  # not the run's: never touched
    assert _hidden(tmp_path) == []


# -- compare --------------------------------------------------------------------------------------------------------

COMPARE_FILES = {"compare.json": '{"old": true}', "compare.md": "# old\n", "runs/dynamic-r1/trace.jsonl": "old\n",
                 "plots/ttft.png": "old png"}


@pytest.mark.parametrize("failure", ["bad model spec", "unloadable model", "bad configs"])
def test_a_compare_that_cannot_start_keeps_the_earlier_comparison(tmp_path, capsys, script, unloadable, failure):
    out = tmp_path / "cmp"
    old = _plant(out, COMPARE_FILES)
    extra = {"bad model spec": ["--model", str(tmp_path / "nope")],
             "unloadable model": ["--model", str(unloadable)],
             "bad configs": ["--model", "tiny-llama", "--configs", "dynamic,bogus"]}[failure]
    rc, err = _main(["compare", *extra, "--script", str(script), "--out", str(out), "--repeat", "1", "--no-plots",
                     "-q", "--overwrite"], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith("kvinspect: error: "), err
    assert _tree(out) == old
    assert _hidden(tmp_path) == []


def test_a_successful_compare_replaces_the_earlier_one_and_leaves_nothing_aside(tmp_path, capsys, script):
    out = tmp_path / "cmp"
    _plant(out, COMPARE_FILES)
    rc, err = _main(["compare", "--model", "tiny-llama", "--script", str(script), "--out", str(out),
                     "--configs", "dynamic", "--repeat", "1", "--no-plots", "-q", "--overwrite"], capsys)
    assert rc == 0, err
    assert json.loads((out / "compare.json").read_text()).get("old") is None
    assert (out / "runs" / "dynamic-r1" / "trace.jsonl").read_text() != "old\n"
    assert not (out / "plots").exists()  # the earlier plots went with the earlier comparison
    assert _hidden(tmp_path) == []


# -- trace ----------------------------------------------------------------------------------------------------------

TRACE_FILES = {"trace.jsonl": "earlier\n", "summary.json": '{"old": true}', "trace-llama.jsonl": "earlier llama\n"}


def test_a_trace_that_cannot_start_keeps_the_earlier_traces(tmp_path, capsys, monkeypatch):
    out = tmp_path / "tr"
    old = _plant(out, TRACE_FILES)
    not_exec = tmp_path / "prog.sh"
    not_exec.write_text("#!/bin/sh\n")
    for cmd, code in [([str(tmp_path / "no-such-program")], 127), ([str(not_exec)], 126),
                      ([sys.executable, "-c", "raise SystemExit(3)"], 3)]:  # runs, but never reaches a model
        rc, err = _main(["trace", "--out", str(out), "-q", "--overwrite", "--", *cmd], capsys)
        assert rc == code, (cmd, err)
        assert _tree(out) == old, cmd
        assert _hidden(tmp_path) == [], cmd

    def denied(*a, **k):  # found and executable, refused by the kernel once --out was claimed
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("subprocess.Popen", denied)
    rc, err = _main(["trace", "--out", str(out), "-q", "--overwrite", "--", sys.executable, "-c", "pass"], capsys)
    assert rc == 126 and err[-1].startswith("kvinspect: error: ") and "permission denied" in err[-1], err
    assert _tree(out) == old and _hidden(tmp_path) == []


def test_a_trace_that_observed_a_model_replaces_the_earlier_ones(tmp_path, capsys, monkeypatch):
    import kvinspect.commands.trace as trace_cmd

    out = tmp_path / "tr"
    _plant(out, TRACE_FILES)

    def program(cmd, env):  # as if it had run a model: its trace is there (the earlier ones are set aside)
        assert not (out / "trace.jsonl").exists()
        shutil.copyfile(SEED, out / "trace.jsonl")
        return 0

    monkeypatch.setattr(trace_cmd, "_run", program)
    rc, err = _main(["trace", "--out", str(out), "-q", "--overwrite", "--", sys.executable, "-c", "pass"], capsys)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "summary.json", "trace.jsonl"]
    assert (out / "trace.jsonl").read_bytes() == SEED.read_bytes()
    assert json.loads((out / "summary.json").read_text()).get("old") is None
    assert _hidden(tmp_path) == []
