"""``kvinspect gui --model … --script … --screenshot … --exit-when-done`` as a user (and CI) runs it.

The screenshot of a two-turn chat with the hybrid tiny-gemma3 is also copied to
``artifacts/ci-window-<platform>.png`` (git-ignored) so every CI run leaves one to look at.
"""

from __future__ import annotations

import json
import shutil

import pytest
from PySide6 import QtGui

from tests.gui.helpers import ROOT, run_cli
from tests.helpers import vl_unavailable


def _run(args, tmp_path, timeout=300):
    return run_cli(["gui", *args], tmp_path, timeout=timeout)


def test_scripted_two_turn_hybrid_chat_screenshot(tmp_path, qapp):
    script = tmp_path / "two.json"
    script.write_text(json.dumps({"turns": ["Hello! What does a KV cache store?",
                                            "Why does a sliding-window layer stop growing?"],
                                  "max_new_tokens": 48}))
    png = tmp_path / "window.png"
    r = _run(["--model", "tiny-gemma3", "--script", str(script), "--screenshot", str(png), "--exit-when-done"],
             tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "Traceback" not in r.stderr
    img = QtGui.QImage(str(png))
    assert not img.isNull() and img.width() >= 1000 and img.height() >= 700
    colors = {img.pixel(x, y) for x in range(0, img.width(), 31) for y in range(0, img.height(), 23)}
    assert len(colors) > 40
    # The run left its trace behind, with both turns.
    traces = list((tmp_path / "data" / "autosave").glob("*.jsonl"))
    assert len(traces) == 1
    kinds = [json.loads(line)["type"] for line in traces[0].read_text().splitlines()]
    assert kinds.count("turn") == 2 and "event" in kinds  # window_reached on turn 2
    out = ROOT / "artifacts"
    out.mkdir(exist_ok=True)
    shutil.copy(png, out / f"ci-window-{qapp.platformName()}.png")


@pytest.mark.skipif(bool(vl_unavailable()), reason=vl_unavailable() or "-")
def test_scripted_image_chat_sends_each_turns_pictures(tmp_path, qapp):
    png = tmp_path / "window.png"
    r = _run(["--model", "tiny-gemma3-vl", "--script", str(ROOT / "resources" / "scripts" / "images.json"),
              "--screenshot", str(png), "--exit-when-done"], tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert not QtGui.QImage(str(png)).isNull()
    (trace,) = (tmp_path / "data" / "autosave").glob("*.jsonl")
    turns = [json.loads(line) for line in trace.read_text().splitlines() if json.loads(line)["type"] == "turn"]
    # Both pictures went through the window's Attach path to the engine: one encoded image per turn.
    assert [t["vision_calls"] for t in turns] == [1, 1]
    assert [[m["image"] for m in t["media"]] for t in turns] == [[0], [0, 1]]
    assert turns[1]["media"][0]["held"] == [0, 0, 0, 16] and turns[1]["media"][1]["held"] == [16, 16, 16, 16]


def test_scripted_bad_model_exits_2_with_one_line(tmp_path):
    r = _run(["--model", str(tmp_path / "nope"), "--screenshot", str(tmp_path / "x.png"), "--exit-when-done"],
             tmp_path, timeout=120)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("kvinspect:")]
    assert lines == [f"kvinspect: error: no such file or directory: {tmp_path / 'nope'}"]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "x.png").exists()


def test_scripted_bad_script_exits_2_before_any_window(tmp_path):
    r = _run(["--model", "tiny-llama", "--script", str(tmp_path / "missing.json"), "--exit-when-done"],
             tmp_path, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"kvinspect: error: script not found: {tmp_path / 'missing.json'}"
