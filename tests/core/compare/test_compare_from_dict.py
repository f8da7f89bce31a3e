"""compare.json can be rebuilt from its own documents: ``CompareResult.from_dict(build_report(r))`` builds the
same document again, which is how a comparison run in engine children is assembled in the parent."""

from __future__ import annotations

from kvinspect.core.compare.configs import parse_configs
from kvinspect.core.compare.plan import ConfigResult, RunMetrics
from kvinspect.core.compare.report import build_report
from kvinspect.core.compare.run import ComparePlan, CompareResult, run_compare
from kvinspect.core.session.script import ChatScript, GenerationSettings
from tests.conftest import load_cached


def _same(a: dict, b: dict) -> None:
    for key in set(a) | set(b):
        assert a.get(key) == b.get(key), key


def test_a_compare_document_rebuilds_the_same_document(tmp_path):
    script = ChatScript(turns=["hello there", "and again"], settings=GenerationSettings(max_new_tokens=4))
    plan = ComparePlan(configs=parse_configs("dynamic,static,recreate"), script=script, repeat=2,
                       turns_until_failure=3, prompt_lengths=[24], conversation=True, max_cache_len=64)
    result = run_compare(load_cached("tiny-llama"), plan, tmp_path)
    doc = build_report(result)
    back = CompareResult.from_dict(doc, tmp_path, plan)
    _same(build_report(back), doc)
    # Without the plan object, the document's own plan and script are enough.
    again = build_report(CompareResult.from_dict(doc, tmp_path))
    assert again["configs"] == doc["configs"] and again["stress"] == doc["stress"] and again["lengths"] == doc["lengths"]
    assert again["correctness"] == doc["correctness"]


def test_a_config_of_an_environment_keeps_its_name_and_a_died_run_fails():
    run = RunMetrics(config="static@old", kind="conversation", repeat=1, dir="runs/old/static-r1",
                     engine_exit={"message": "killed by signal 9 (SIGKILL)", "code": None, "signal": 9})
    assert run.status == "failed" and RunMetrics.from_dict(run.to_dict()) == run
    cr = ConfigResult(parse_configs("static")[0], env="old", runs=[run])
    d = {**cr.config.to_dict(), "name": cr.name, "config": "static", "env": "old", "status": "ran",
         "runs": [run.to_dict()]}
    back = ConfigResult.from_dict(d)
    assert back.name == "static@old" and back.config.name == "static" and back.runs == [run]
