"""Autosave paths, pruning, and crash safety: ``kill -9`` mid-turn keeps every completed turn.

The kill tests run a real headless session in a child process (``kvinspect run``, and a
ChatSession writing to :func:`autosave_path` as the GUI does) on a tiny model with a long
reply, wait until the first turn's closing line and some steps of the second turn are on
disk, then SIGKILL it: no handler, no flush, no ``end`` line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from kvinspect.core.paths import data_dir
from kvinspect.core.trace import autosave
from kvinspect.core.trace.autosave import autosave_dir, autosave_path, list_autosaves, prune_autosaves
from kvinspect.core.trace.tracefile import read_trace
from tests.helpers import kvinspect_argv

MAX_NEW = 600  # tiny models never stop early: each turn is exactly this long (a few seconds)


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVINSPECT_DATA_DIR", str(tmp_path / "data"))


def test_path_is_timestamped_under_the_data_dir():
    p = autosave_path("/models/SmolLM2-135M-Instruct.Q4_1.gguf", now=datetime(2026, 3, 4, 5, 6, 7))
    assert p.parent == data_dir() / "autosave" == autosave_dir() and p.parent.is_dir()
    assert p.name == "20260304-050607-SmolLM2-135M-Instruct.Q4_1.jsonl"
    assert not p.exists()
    p.write_text("{}\n")
    again = autosave_path("/models/SmolLM2-135M-Instruct.Q4_1.gguf", now=datetime(2026, 3, 4, 5, 6, 7))
    assert again.name == "20260304-050607-SmolLM2-135M-Instruct.Q4_1-2.jsonl"
    assert autosave_path("org/model name:v2").name.endswith("-model-name-v2.jsonl")


def test_prunes_to_the_newest_but_never_a_live_file():
    folder = autosave_dir()
    folder.mkdir(parents=True)
    old = time.time() - 3 * 86400
    for i in range(30):
        p = folder / f"2026010{i // 10}-0000{i % 10:02d}-m.jsonl"
        p.write_text("{}\n")
        os.utime(p, (old + i, old + i))
    live = folder / "20260101-999999-live.jsonl"
    live.write_text("{}\n")  # just written: may belong to a session running in another window
    new = autosave_path("m", keep=10)
    left = {a.path for a in list_autosaves()}
    assert live in left and len(left) == 9  # the live one + the 8 newest old ones: 10 with the new one
    assert max(old + i for i in range(30)) in {a.mtime for a in list_autosaves()}
    new.write_text("{}\n")
    assert len(list_autosaves()) == 10
    assert prune_autosaves(keep=3) and {live, new} <= {a.path for a in list_autosaves()}


def _old_autosaves(n: int, days: float = 2) -> list[Path]:
    """``n`` finished-looking autosaves, ``days`` old and older (each a second apart, newest last)."""
    folder = autosave_dir()
    folder.mkdir(parents=True, exist_ok=True)
    old = time.time() - days * 86400
    out = []
    for i in range(n):
        p = folder / f"20260201-{i:06d}-old.jsonl"
        p.write_text('{"type":"end"}\n')
        os.utime(p, (old + i, old + i))
        out.append(p)
    return out


_OWNER = textwrap.dedent("""
    import sys, time
    from kvinspect.core.trace.autosave import open_autosave
    f = open_autosave("idle-window")
    f.write(b'{"type":"header"}\\n'); f.flush()
    print(f.name, flush=True)
    sys.stdin.readline()  # the window stays open (and idle) until told
    f.write(b'{"type":"turn"}\\n'); f.close()
    print("wrote after the other window loaded", flush=True)
""")


def test_an_idle_window_keeps_its_autosave_while_another_window_prunes():
    """Two windows on one data folder: the idle one's autosave is older than 20+ others and untouched for
    days, yet the other window's load (which prunes) leaves it alone; once the idle window closes, it goes."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    idle = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=env, text=True)
    try:
        idle_path = Path(idle.stdout.readline().strip())
        assert idle_path.is_file(), idle_path
        long_ago = time.time() - 5 * 86400  # idle for days: older than every other file here
        os.utime(idle_path, (long_ago, long_ago))
        others = _old_autosaves(25)
        # The other window loads a model: the path the window takes (open_autosave), which prunes first.
        with autosave.open_autosave("busy-window", keep=autosave.KEEP) as mine:
            assert idle_path.exists(), "the idle window's live autosave was pruned"
            left = {a.path for a in list_autosaves()}
            assert Path(mine.name) in left and idle_path in left
            assert sum(p in left for p in others) == autosave.KEEP - 1  # the rest pruned as before
            # And a prune by anyone else (the menu, a third window) leaves both live files alone.
            prune_autosaves(keep=0)
            assert idle_path.exists() and Path(mine.name).exists()
        idle.stdin.write("\n")
        idle.stdin.flush()
        assert idle.stdout.readline().strip() == "wrote after the other window loaded"
        assert idle.wait(timeout=60) == 0
        assert idle_path.read_bytes() == b'{"type":"header"}\n{"type":"turn"}\n'  # nothing lost
        # Closed (the window ended) and left alone for days: an old file like any other, pruned in its turn.
        os.utime(idle_path, (long_ago, long_ago))
        assert idle_path in prune_autosaves(keep=0)
    finally:
        if idle.poll() is None:
            idle.kill()
        idle.wait()


def test_two_owners_in_one_process_never_share_or_prune_a_file():
    _old_autosaves(22)
    a = autosave.open_autosave("m", now=datetime(2026, 5, 5, 5, 5, 5))
    b = autosave.open_autosave("m", now=datetime(2026, 5, 5, 5, 5, 5))  # same second, same model
    try:
        assert a.name != b.name and autosave.is_owned(Path(a.name)) and autosave.is_owned(Path(b.name))
        for f in (a, b):
            os.utime(f.name, (time.time() - 86400,) * 2)
        prune_autosaves(keep=0)
        assert Path(a.name).exists() and Path(b.name).exists()
    finally:
        a.close()
        b.close()
    assert not autosave.is_owned(Path(a.name))
    assert set(prune_autosaves(keep=0)) >= {Path(a.name), Path(b.name)}


def _spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_mid_second_turn(proc: subprocess.Popen, trace: Path, timeout: float = 240.0) -> None:
    """SIGKILL once turn 1's closing line and a steps chunk of turn 2 are on disk."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {proc.stderr.read().decode()[-500:]}")
        if trace.exists():
            lines = [json.loads(ln) for ln in trace.read_bytes().split(b"\n")[:-1] if ln.strip()]
            starts = [ln for ln in lines if ln["type"] == "turn_start" and ln["index"] == 1]
            if starts and any(ln["type"] == "steps" and ln["first"] + ln["n"] > starts[0]["first_step"]
                              for ln in lines):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
                assert proc.returncode == -signal.SIGKILL
                return
        time.sleep(0.02)
    proc.kill()
    pytest.fail("turn 2 never started")


def _check_recovered(trace: Path) -> None:
    rec = read_trace(trace)
    first, second = rec.turns[0], rec.turns[1]
    assert len(rec.turns) == 2
    assert first.status == "ok" and first.new_tokens == MAX_NEW and first.layers and first.checklist
    assert first.end_step == second.first_step == MAX_NEW
    assert second.status == "interrupted" and second.layers == [] and second.reply == ""
    assert 0 < second.new_tokens == rec.n_steps - second.first_step < MAX_NEW  # flushed steps, kept
    assert (rec.seen[second.first_step:] > rec.seen[second.first_step - 1]).all()
    assert any("turn 2 was interrupted" in n and "never written" in n for n in rec.notes)
    assert any("no end line" in n for n in rec.notes)


def test_kill_9_of_kvinspect_run_keeps_completed_turns(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["first turn", "second turn", "third turn"], "max_new_tokens": MAX_NEW}))
    out = tmp_path / "out"
    proc = _spawn(kvinspect_argv("run", "--model", "tiny-llama", "--script", script, "--out", out, "-q"), tmp_path)
    _kill_mid_second_turn(proc, out / "trace.jsonl")
    _check_recovered(out / "trace.jsonl")
    assert not (out / "summary.json").exists()  # written only at the end: the trace is what survives


def test_kill_9_of_a_session_autosaving_like_the_gui(tmp_path):
    code = textwrap.dedent(f"""
        from kvinspect.core.trace.autosave import autosave_path
        from kvinspect.core.model.loading import load_model
        from kvinspect.core.session.script import GenerationSettings
        from kvinspect.core.session.chat import ChatSession
        from kvinspect.core.session.options import SessionOptions

        loaded = load_model("tiny-mistral", device="cpu")
        opts = SessionOptions(settings=GenerationSettings(max_new_tokens={MAX_NEW}))
        session = ChatSession(loaded, opts, trace_path=autosave_path(loaded.name))
        for text in ("first turn", "second turn", "third turn"):
            session.run_turn(text)
        session.close()
    """)
    proc = _spawn([sys.executable, "-c", code], tmp_path)
    deadline = time.monotonic() + 120
    while not list_autosaves() and time.monotonic() < deadline:
        time.sleep(0.05)
    saves = list_autosaves()
    assert len(saves) == 1 and "tiny-mistral" in saves[0].name
    _kill_mid_second_turn(proc, saves[0].path)
    _check_recovered(saves[0].path)
    assert list_autosaves()[0].closed is False  # the recover menu can tell it apart from a clean exit


def test_a_clean_session_is_marked_closed(tmp_path):
    from kvinspect.core.session.chat import ChatSession
    from tests.conftest import load_cached

    with ChatSession(load_cached("tiny-llama"), trace_path=autosave_path("tiny-llama")) as s:
        s.run_turn("hello")
    (save,) = list_autosaves()
    assert save.closed and read_trace(save.path).notes == []


def test_keep_default_is_sane():
    assert 5 <= autosave.KEEP <= 100
