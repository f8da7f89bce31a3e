"""One comparison, two environments: this venv (transformers 5.x) and the compat venv (4.56), each
configuration in its own engine child. Run by ``make test-compare-env`` (skipped unless
``KVINSPECT_COMPAT_PYTHON`` names the compat interpreter).

What must come out is what really differs between the versions, not a fixed text: the report names
both versions; on tiny-gemma3 a StaticCache holds its sliding layers in ``StaticSlidingWindowLayer`` on
5.x and ``SlidingWindowLayer`` on 4.56, where the second turn fails on the static cache (a hybrid
StaticCache cannot be reused across generate calls there), so the traces part at turn 2; SmolLM2 (full
attention only) caches the same on both.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.helpers import ROOT, cli_env, run_cli

COMPAT = os.environ.get("KVINSPECT_COMPAT_PYTHON")
pytestmark = pytest.mark.skipif(not COMPAT, reason="KVINSPECT_COMPAT_PYTHON is not set (make test-compare-env)")


def _compare(tmp_path, model: str, configs: str, max_new: int, turns: int):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["What is the capital of France?", "And of Italy?",
                                            "Which of the two is larger?"][:turns],
                                  "max_new_tokens": max_new, "do_sample": False}))
    out = tmp_path / "cmp"
    # Both engines run this checkout's kvinspect (the compat venv may hold another copy).
    env = cli_env(None, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = run_cli(["compare", "--model", model, "--script", script, "--configs", configs, "--repeat", "1",
                    "--out", out, "--no-plots", "-q", "--env", f"new={sys.executable}", "--env", f"old={COMPAT}"],
                   env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "compare.json").read_text())
    return out, doc, proc.stdout


def _versions(doc) -> dict[str, str]:
    return {e["name"]: e["transformers"] for e in doc["environments"]}


def test_tiny_gemma3_static_parts_at_turn_two(tmp_path):
    out, doc, stdout = _compare(tmp_path, "tiny-gemma3", "dynamic,static", 16, 2)
    ver = _versions(doc)
    assert ver["new"].split(".")[0] == "5" and ver["old"].startswith("4.56")
    assert f"transformers {ver['old']}" in stdout and f"transformers {ver['new']}" in stdout
    diffs = {d["config"]: d for d in doc["diff"]}
    static = diffs["static"]
    assert static["same"] is False
    sliding = next(p for p in static["layers"] if p["kind"] == "sliding")
    assert (sliding["turn"], sliding["step"]) == (1, 0)
    cls = static["classes"]
    assert cls["a"]["layers"]["sliding"] == ["StaticSlidingWindowLayer"]
    assert cls["b"]["layers"]["sliding"] == ["SlidingWindowLayer"]
    assert [(t["turn"], t["a"], t["b"]) for t in static["turns"]] == [(1, "ok", "failed")]
    assert any(e["kind"] == "turn_failed" for e in static["events"]["only_b"])
    # Both traces are in the bundle, one folder per environment.
    for side in ("new", "old"):
        assert (out / "runs" / side / "static-r1" / "trace.jsonl").is_file()
    md = (out / "compare.md").read_text()
    assert "## Where they part" in md and "| environment |" in md and ver["old"] in md and ver["new"] in md


def test_smollm2_caches_the_same_on_both_versions(tmp_path, smollm2_fetched):
    _, doc, stdout = _compare(tmp_path, "smollm2", "dynamic", 8, 2)
    ver = _versions(doc)
    assert ver["new"] != ver["old"]
    (d,) = doc["diff"]
    assert all(p["same"] for p in d["layers"]), d["layers"]
    assert d["classes_same"] and not d["events"]["only_a"] and not d["events"]["only_b"] and not d["turns"]
    assert "where they part, dynamic:" in stdout
