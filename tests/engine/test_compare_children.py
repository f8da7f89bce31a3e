"""A comparison whose configurations each run in an engine child: a child killed mid-run fails that run
alone (with its signal), the other configuration finishes, and the next repeat gets a fresh engine."""

from __future__ import annotations

import os
import signal

from kvinspect.core.compare.configs import parse_configs
from kvinspect.core.compare.report import build_report, write_report
from kvinspect.core.compare.run import ComparePlan
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.engine.compare_children import ModelArgs, parse_env, parse_envs, run_compare_in_engines


def test_a_configuration_whose_engine_is_killed_fails_alone(tmp_path):
    # The engine runs a whole run on its own and its progress lines reach us some milliseconds late (its
    # writer gathers lines; 4-token turns of 10 ms came two at once): turns of 96 tokens, 0.15-0.25 s each
    # here, so the kill lands in turn 2, or in turn 3 on a loaded machine.
    script = ChatScript(turns=["hello there", "second turn", "third"], settings=GenerationSettings(max_new_tokens=96))
    plan = ComparePlan(configs=parse_configs("dynamic,recreate"), script=script, repeat=2)
    pids: dict[str, list[int]] = {}
    killed: list[int] = []

    def on_engine(name: str, pid: int | None) -> None:
        if pid not in pids.setdefault(name, []):
            pids[name].append(pid)

    def progress(done: int, total: int, message: str) -> None:
        # recreate's first run, after its first turn: kill its engine mid-run (the rest of the run never comes).
        if message.startswith("recreate r1 turn 1/") and not killed:
            killed.append(pids["recreate"][-1])
            os.kill(pids["recreate"][-1], signal.SIGKILL)

    result = run_compare_in_engines(ModelArgs("tiny-llama"), plan, tmp_path, progress=progress, on_engine=on_engine)
    assert killed
    dyn, rec = result.config("dynamic"), result.config("recreate")
    assert [r.status for r in dyn.runs] == ["ok", "ok"] and len(pids["dynamic"]) == 1
    first, second = rec.runs
    assert first.status == "failed" and first.engine_exit["signal"] == signal.SIGKILL
    assert "killed by signal 9 (SIGKILL)" in first.engine_exit["message"]
    # The turns that finished before the kill are kept from its trace; the one it died in is failed. On a
    # loaded machine the kill can land a turn later than asked: turn 2 or 3, never after the run.
    statuses = [t["status"] for t in first.turns]
    assert statuses in (["ok", "failed"], ["ok", "ok", "failed"]), statuses
    assert first.turns[-1]["failure_kind"] == "engine-died"
    assert all("failure_kind" not in t or not t["failure_kind"] for t in first.turns[:-1])
    assert second.status == "ok" and len(second.turns) == 3
    assert len(pids["recreate"]) == 2 and killed[0] == pids["recreate"][0]  # a fresh engine for repeat 2
    assert rec.status == "ran"
    # Repeats stay interleaved and rotated: r1 dynamic, recreate; r2 recreate, dynamic.
    order = sorted([*dyn.runs, *rec.runs], key=lambda r: r.started_at)
    assert [(r.config, r.repeat) for r in order] == [("dynamic", 1), ("recreate", 1), ("recreate", 2), ("dynamic", 2)]
    doc = build_report(result)
    (fail,) = doc["configs"][1]["summary"]["failures"]
    assert fail["kind"] == "engine-died" and fail["repeats"] == [1] and "SIGKILL" in fail["reason"]
    files = write_report(result, tmp_path, plots=False)
    assert "SIGKILL" in files.markdown.read_text()


def test_env_flags():
    import pytest

    from kvinspect.core.errors import KvInspectError

    assert parse_env("old=/opt/venv/bin/python").python == "/opt/venv/bin/python"
    e = parse_env("gpu=ssh:box:~/venv/bin/python")
    assert (e.host, e.python) == ("box", "~/venv/bin/python")
    for bad in ("old", "=python", "a b=python", "x=ssh:box", "x=ssh:-oProxyCommand=evil:python"):
        with pytest.raises(KvInspectError):
            parse_env(bad)
    with pytest.raises(KvInspectError, match="twice"):
        parse_envs(["a=python", "a=python3"])


def test_stress_and_sweep_in_engines_match_in_process(tmp_path):
    from kvinspect.core.compare.run import run_compare
    from tests.conftest import load_cached

    script = ChatScript(turns=["hello there", "second turn"], settings=GenerationSettings(max_new_tokens=20))
    plan = ComparePlan(configs=parse_configs("dynamic,static"), script=script, repeat=1, conversation=False,
                       turns_until_failure=6, prompt_lengths=[24, 48], max_cache_len=150)
    engines = build_report(run_compare_in_engines(ModelArgs("tiny-llama"), plan, tmp_path / "e"))
    here = build_report(run_compare(load_cached("tiny-llama"), plan, tmp_path / "p"))
    keys = ("name", "status", "failed_at_turn", "failure_kind", "tokens_at_failure", "cache_rows_needed",
            "turns_completed")
    assert [{k: c[k] for k in keys} for c in engines["stress"]["configs"]] == \
        [{k: c[k] for k in keys} for c in here["stress"]["configs"]]
    assert engines["stress"]["configs"][1]["status"] == "failed"  # static overflows its 150 rows
    assert engines["lengths"]["prompt_tokens"] == here["lengths"]["prompt_tokens"] == {"24": 24, "48": 48}
    for c in engines["lengths"]["configs"]:
        assert [p["prompt_tokens"] for p in c["points"]] == [24, 48]
        for r in c["runs"]:
            assert (tmp_path / "e" / r["dir"] / "trace.jsonl").is_file()
    assert engines["diff"] == []  # no conversation: nothing to set side by side
