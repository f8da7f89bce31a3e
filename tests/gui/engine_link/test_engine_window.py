"""The window drives a real engine child: the model's process, never the window's (docs/engine-protocol.md).

A chat runs in the engine and the window's own process never imports torch; ``kill -9`` of the
engine mid-turn leaves the window up with every finished turn, on screen and in its autosave, the
interrupted turn failed with the signal, and Restart engine continues. Engines that refuse the
handshake, ignore Stop, cannot cancel a load or hang are stand-ins (tests/engine/fake_engine.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kvinspect.core.detect.events import TURN_FAILED
from kvinspect.core.trace.tracefile import read_trace
from tests.gui.helpers import LOAD_TIMEOUT_MS, ROOT, TURN_TIMEOUT_MS, cli_env, load, send

FAKE = ROOT / "tests" / "engine" / "fake_engine.py"


@pytest.fixture
def make_window(qtbot):
    """A window whose engine is started by ``engine_cmd`` (None: the real one)."""
    from kvinspect.core.settings import Settings
    from kvinspect.gui.app import create

    made = []

    def make(engine_cmd=None):
        settings = Settings()
        settings.window.width, settings.window.height = 1280, 800
        _, win = create(settings=settings, persist=False, engine_cmd=engine_cmd)
        qtbot.addWidget(win)
        qtbot.waitExposed(win)
        win.errors.interactive = False  # messages are printed and recorded, never a dialog
        made.append(win)
        return win

    yield make
    for win in made:
        win.errors.close_all()


def _fake(mode: str) -> list[str]:
    return [sys.executable, str(FAKE), mode]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _trace_kinds(path) -> list[str]:
    return [json.loads(line)["type"] for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.mark.plain_engine
def test_the_model_runs_in_an_engine_child(qtbot, window):
    info = load(qtbot, window, "tiny-llama")
    c = window.controller
    pid = c.engine_pid
    assert pid and pid != os.getpid() and info.engine_pid == pid
    assert psutil.Process(pid).ppid() == os.getpid()
    t1 = send(qtbot, window, "First question?", max_new_tokens=16)
    t2 = send(qtbot, window, "Second question?", max_new_tokens=8)
    assert (t1.status, t2.status) == ("ok", "ok") and t2.reused_tokens > 0
    assert window.record.turns == [t1, t2] and window.record is info.record
    # The memory figures are the engine's: the stream says which process sampled them.
    assert window.record.header["notes"]["engine"]["pid"] == pid
    assert window.plots.memory.rss.name() == "model process RSS" and t1.peak_rss > 0
    # This window wrote the autosave from the stream: both turns, every line the engine sent, flushed.
    assert info.trace_path and Path(info.trace_path).parent.name == "autosave"
    kinds = _trace_kinds(info.trace_path)
    assert kinds[0] == "header" and kinds.count("turn") == 2 and "token" not in kinds
    back = read_trace(info.trace_path)
    assert [t.reply for t in back.turns] == [t1.reply, t2.reply] and back.n_steps == window.record.n_steps
    window.close()
    assert _trace_kinds(info.trace_path)[-1] == "end"  # the engine closed its session on shutdown
    assert _gone(pid)


def test_kill_9_mid_turn_keeps_the_finished_turns_and_restart_continues(qtbot, window):
    info = load(qtbot, window, "tiny-llama")
    t1 = send(qtbot, window, "A finished turn.", max_new_tokens=12)
    pid = window.controller.engine_pid
    chat = window.chat
    chat.max_new.setValue(20_000)
    chat.input.setPlainText("A turn that never ends.")
    with qtbot.waitSignal(window.controller.engineDied, timeout=TURN_TIMEOUT_MS) as died:
        chat.send()
        qtbot.waitUntil(lambda: window.record.n_steps > t1.end_step + 20, timeout=60_000)
        os.kill(pid, signal.SIGKILL)
    why = died.args[0]
    assert "signal 9" in why and "SIGKILL" in why

    # The window is up; the finished turn is on screen; the interrupted one failed, with the signal.
    assert window.isVisible() and window.record is info.record
    rec = window.record
    assert [t.status for t in rec.turns] == ["ok", "failed"] and rec.turns[0] is t1
    failed = rec.turns[1]
    assert "SIGKILL" in failed.error and failed.new_tokens > 20 and failed.end_step == rec.n_steps
    assert [e.kind for e in rec.events_for_turn(1)] == [TURN_FAILED]
    text = window.chat.plain_text()
    assert t1.reply in text and "SIGKILL" in text
    assert window.restart_button.isVisible() and not chat.send_button.isEnabled()
    assert any("SIGKILL" in m for m in window.errors.messages)
    assert window.send(chat.request("refused?")) is False

    # The autosave has the finished turn whole, and the interrupted one failed the same way.
    back = read_trace(info.trace_path)
    assert [t.status for t in back.turns] == ["ok", "failed"]
    assert back.turns[0].reply == t1.reply and "SIGKILL" in back.turns[1].error
    assert back.header["notes"]["engine_exit"]["signal"] == 9

    # Restart engine: a new process, the same model, a new chat; the old transcript stays.
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=LOAD_TIMEOUT_MS) as loaded:
        assert window.restart_engine()
    again = loaded.args[0]
    assert again.name == "tiny-llama" and window.controller.engine_pid not in (None, pid)
    assert again.trace_path != info.trace_path and not window.restart_button.isVisible()
    t = send(qtbot, window, "Still here?", max_new_tokens=6)
    assert t.status == "ok" and t.index == 0 and t.reused_tokens == 0
    assert t1.reply in window.chat.plain_text() and "engine restarted" in window.chat.plain_text()


@pytest.fixture
def run_gui(tmp_path):
    """``kvinspect gui ARGS`` in a child process (its own data folders); killed with its engine if left running."""
    started = []

    def run(args, env=None):
        e = cli_env(tmp_path, **(env or {}))
        p = subprocess.Popen([sys.executable, "-m", "kvinspect", "gui", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT)
        started.append(p)
        return p

    yield run
    for p in started:
        if p.poll() is None:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait()


def test_the_window_process_never_imports_torch(tmp_path, run_gui):
    script = tmp_path / "two.json"
    script.write_text(json.dumps({"turns": ["Hello!", "And again?"], "max_new_tokens": 12}))
    report = tmp_path / "modules.json"
    p = run_gui(["--model", "tiny-llama", "--script", str(script), "--exit-when-done"],
                env={"KVINSPECT_MODULES_REPORT": str(report)})
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-2000:]
    facts = json.loads(report.read_text())
    assert facts["pid"] == p.pid
    assert facts["torch"] is False and facts["transformers"] is False, facts["modules"]
    assert "PySide6" in facts["modules"] and "numpy" in facts["modules"]
    # It really chatted (in its engine): both turns are in the autosave it wrote.
    traces = list((tmp_path / "data" / "autosave").glob("*.jsonl"))
    assert len(traces) == 1 and _trace_kinds(traces[0]).count("turn") == 2


@pytest.mark.plain_engine
def test_scripted_run_exits_1_with_a_screenshot_when_the_engine_dies(tmp_path, run_gui):
    script = tmp_path / "long.json"
    script.write_text(json.dumps({"turns": ["A turn that never ends.", "Never sent."], "max_new_tokens": 20000}))
    png = tmp_path / "window.png"
    p = run_gui(["--model", "tiny-llama", "--script", str(script), "--screenshot", str(png), "--exit-when-done"])
    autosave = tmp_path / "data" / "autosave"
    engine = None
    deadline = time.monotonic() + 240
    while engine is None and time.monotonic() < deadline and p.poll() is None:
        traces = list(autosave.glob("*.jsonl")) if autosave.is_dir() else []
        kinds = _trace_kinds(traces[0]) if traces else []
        if "turn_start" in kinds and kinds[kinds.index("turn_start"):].count("steps") >= 2:
            children = psutil.Process(p.pid).children()
            engine = next(c for c in children if "engine" in c.cmdline())
        time.sleep(0.2)
    assert engine is not None, "the turn never started"
    engine.kill()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err[-2000:]
    assert "kvinspect: the model's process ended: killed by signal 9 (SIGKILL)" in err
    assert png.is_file() and f"screenshot {png}" in out
    back = read_trace(next(autosave.glob("*.jsonl")))
    assert [t.status for t in back.turns] == ["failed"] and "SIGKILL" in back.turns[0].error


def test_a_mismatched_engine_is_refused_with_both_versions(qtbot, make_window):
    from kvinspect.engine.protocol import PROTOCOL_VERSION

    win = make_window(_fake("protocol999"))
    with qtbot.waitSignal(win.controller.failed, timeout=LOAD_TIMEOUT_MS) as blocker:
        assert win.load("tiny-llama")
    task, message = blocker.args
    assert task == "load" and "protocol 999" in message and "9.9.9" in message
    assert f"protocol {PROTOCOL_VERSION}" in message and "\n" not in message
    assert win.controller.dead and win.isVisible() and win.commands["load"].isEnabled()


def test_a_second_stop_kills_an_engine_that_ignores_stop(qtbot, make_window):
    win = make_window(_fake("stubborn"))
    load(qtbot, win, "fake")
    pid = win.controller.engine_pid
    win.chat.input.setPlainText("never stops")
    with qtbot.waitSignal(win.controller.turnStarted, timeout=TURN_TIMEOUT_MS):
        win.chat.send()
    with qtbot.waitSignal(win.controller.turnFinished, timeout=TURN_TIMEOUT_MS) as blocker:
        win.stop()  # ignored by this engine
        qtbot.wait(200)
        assert win.controller.busy == "turn"
        win.stop()  # the second one kills it
    turn = blocker.args[0]
    assert turn.status == "failed" and "second Stop" in turn.error and turn.reply == "partial reply"
    assert win.controller.dead and _gone(pid)
    assert win.isVisible() and "partial reply" in win.chat.plain_text()


def test_cancel_kills_a_load_that_cannot_be_cancelled(qtbot, make_window, monkeypatch):
    import kvinspect.gui.engine_link.session_controller as session_controller

    monkeypatch.setattr(session_controller, "CANCEL_GRACE_S", 0.5)
    win = make_window(_fake("deaf"))
    with qtbot.waitSignal(win.controller.cancelled, timeout=LOAD_TIMEOUT_MS) as blocker:
        assert win.load("tiny-llama")
        qtbot.waitUntil(lambda: win.controller.engine_pid is not None)
        first = win.controller.engine_pid
        win.cancel_load()
    assert blocker.args == ["load"]
    # The hard cancel: that engine is gone, an empty one took its place; no error, nothing marked dead.
    assert win.controller.engine_pid not in (None, first) and win.controller.dead is None
    assert _gone(first)
    assert win.errors.messages == [] and not win.cancel_button.isVisible() and win.commands["load"].isEnabled()


def test_a_silent_engine_is_told_from_a_busy_one(qtbot, make_window, monkeypatch):
    import kvinspect.gui.engine_link.engine_process as ec

    monkeypatch.setattr(ec, "HUNG_AFTER_S", 1.5)
    busy = make_window(_fake("deaf"))  # heartbeats while it (never) loads: busy, not hung
    hung = make_window(_fake("silent"))
    states = {busy: [], hung: []}
    for w in states:
        w.controller.engineState.connect(states[w].append)
        assert w.load("tiny-llama")
    qtbot.waitUntil(lambda: "unresponsive" in states[hung], timeout=30_000)
    assert "unresponsive" not in states[busy] and "ready" in states[busy]
    assert hung.restart_button.isVisible() and not busy.restart_button.isVisible()
