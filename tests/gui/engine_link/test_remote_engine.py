"""The window with its engine on an ssh host: a real sshd on 127.0.0.1 (tests/sshd.py), this machine as the host.

The user's path: the model picker's "Run on: ssh host" with a host and a python, Load, a two-turn
chat. The trace is written on the window's side (its autosave), the memory figures are the remote
engine's, the window's process never imports torch, and a host whose python has no kvinspect gives
one line that says what to install, with the window still usable. The remote python is this test's
own interpreter (``sys.executable``): same machine, so it has kvinspect wherever the tests run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from kvinspect.core.trace.tracefile import read_trace
from kvinspect.engine.launch import SSH_COMMAND_ENV
from tests.gui.helpers import LOAD_TIMEOUT_MS, load, run_cli, send


@pytest.fixture
def over_ssh(sshd, monkeypatch):
    """The window's ssh command reaches the test sshd (``KVINSPECT_SSH_COMMAND``); returns the server."""
    monkeypatch.setenv(SSH_COMMAND_ENV, sshd.ssh_command)
    return sshd


def python_without_kvinspect() -> str:
    from tests.engine.test_ssh import python_without_kvinspect as find

    return find()


def _pick_remote(qtbot, win, host: str, python: str, spec: str = "tiny-llama"):
    """Choose "Run on: ssh host" in the picker, type host and python, pick ``spec`` on cpu, press Load."""
    from PySide6 import QtCore

    picker = win.open_picker()
    qtbot.waitExposed(picker)
    picker.run_ssh.click()
    assert picker.host.isEnabled() and picker.python.isEnabled()
    picker.host.setText(host)
    picker.python.setText(python)
    names = [picker.list.item(i).data(QtCore.Qt.ItemDataRole.UserRole) for i in range(picker.list.count())]
    picker.list.setCurrentRow(names.index(spec))
    picker.device.setCurrentText("cpu")
    with qtbot.waitSignal(picker.loadRequested) as asked:
        picker.load_button.click()
    req = asked.args[0]
    assert (req.host, req.python, req.spec) == (host, python, spec)
    return req


def _ancestor_names(pid: int) -> list[str]:
    names = []
    try:
        for p in psutil.Process(pid).parents():
            names.append(p.name())
    except psutil.Error:
        pass
    return names


def test_a_two_turn_chat_with_the_engine_over_ssh(qtbot, window, over_ssh):
    progress = []
    window.controller.progressed.connect(lambda task, stage, frac: progress.append((task, stage)))
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=LOAD_TIMEOUT_MS) as loaded:
        _pick_remote(qtbot, window, over_ssh.host, sys.executable)
    info = loaded.args[0]
    assert progress and {task for task, _ in progress} == {"load"}  # the remote load's stages reached the window
    c = window.controller
    # The window's child is ssh; the engine is a process of the ssh session, on "the host".
    ssh_pid = c.engine_pid
    assert "ssh" in psutil.Process(ssh_pid).name() and c.client.local is False
    assert info.engine_pid and info.engine_pid != ssh_pid and psutil.Process(info.engine_pid).ppid() != ssh_pid
    assert "sshd" in _ancestor_names(info.engine_pid)
    t1 = send(qtbot, window, "First question over ssh?", max_new_tokens=12)
    t2 = send(qtbot, window, "And a second one?", max_new_tokens=8)
    assert (t1.status, t2.status) == ("ok", "ok") and t2.reused_tokens > 0
    assert window.record.turns == [t1, t2]
    # The header and the memory figures are the remote engine's.
    notes = window.record.header["notes"]["engine"]
    assert notes["pid"] == info.engine_pid and "engine process" in notes["memory"]
    label = window.model_label.text()
    assert "tiny-llama" in label and "cpu" in label and "on <b>kvtest</b>" in label
    assert window.plots.memory.rss.name() == "model process RSS" and t1.peak_rss > 0
    assert t1.peak_rss == max(window.record.rss[t1.first_step:t1.end_step])
    # The trace is written here, by the window, into this machine's data folder.
    assert info.trace_path and Path(info.trace_path).is_relative_to(os.environ["KVINSPECT_DATA_DIR"])
    back = read_trace(info.trace_path)
    assert [t.status for t in back.turns] == ["ok", "ok"]
    assert [t.reply for t in back.turns] == [t1.reply, t2.reply]
    assert back.header["notes"]["engine"]["pid"] == info.engine_pid
    # Where it ran is remembered for the picker.
    s = window.settings
    assert (s.run_on, s.ssh_host, s.ssh_python) == ("ssh", "kvtest", sys.executable)
    window.close()
    assert [json.loads(x)["type"] for x in Path(info.trace_path).read_text().splitlines()][-1] == "end"


def test_a_host_without_kvinspect_is_one_line_and_the_window_stays_usable(qtbot, window, over_ssh):
    python = python_without_kvinspect()
    with qtbot.waitSignal(window.controller.engineDied, timeout=LOAD_TIMEOUT_MS) as died:
        _pick_remote(qtbot, window, over_ssh.host, python)
    want = (f"kvtest has no kvinspect for {python}: install it there (pip install kvinspect) or give the python "
            f"of an environment that has it")
    assert died.args[0] == f"the engine did not start: {want}"
    # One dialog (non-modal), one line; the load's own failure is not reported a second time.
    boxes = [b for b in window.errors.boxes if b.isVisible()]
    assert [b.windowTitle() for b in boxes] == ["The model's process did not start"]
    assert boxes[0].text() == f"the engine did not start: {want}"
    assert window.errors.messages == [boxes[0].text()]
    window.errors.close_all()
    # Still usable: the picker reopens on the host as typed, and a load on this machine works.
    picker = window.open_picker()
    assert picker.run_ssh.isChecked() and picker.host.text() == "kvtest" and picker.python.text() == python
    assert window.commands["load"].isEnabled()
    info = load(qtbot, window, "tiny-llama")
    assert info.name == "tiny-llama" and window.controller.client.local is True
    assert send(qtbot, window, "Local again?", max_new_tokens=4).status == "ok"


def test_the_window_process_stays_torch_free_with_a_remote_engine(tmp_path, over_ssh):
    """``kvinspect gui --ssh HOST``: a scripted two-turn chat in a fresh window process, which never imports torch."""
    script = tmp_path / "two.json"
    script.write_text(json.dumps({"turns": ["Hello over ssh!", "And again?"], "max_new_tokens": 10}))
    report = tmp_path / "modules.json"
    p = run_cli(["gui", "--model", "tiny-llama", "--device", "cpu", "--ssh", over_ssh.host, "--ssh-python",
                 sys.executable, "--script", str(script), "--exit-when-done"], tmp_path, timeout=300,
                KVINSPECT_MODULES_REPORT=str(report))
    assert p.returncode == 0, p.stderr[-2000:]
    facts = json.loads(report.read_text())
    assert facts["torch"] is False and facts["transformers"] is False, facts["modules"]
    traces = list((tmp_path / "data" / "autosave").glob("*.jsonl"))
    assert len(traces) == 1
    back = read_trace(traces[0])
    assert [t.status for t in back.turns] == ["ok", "ok"]
    assert back.header["notes"]["engine"]["pid"] != facts["pid"]  # the memory figures are the engine's


def test_fetch_over_ssh_reports_progress_in_the_picker(qtbot, window, over_ssh, smollm2_fetched):
    """Fetch with "Run on: ssh host" runs in the host's engine (here it verifies the copy it has)."""
    picker = window.open_picker()
    qtbot.waitExposed(picker)
    picker.run_ssh.click()
    picker.host.setText(over_ssh.host)
    picker.python.setText(sys.executable)
    assert picker.fetch_button.isVisible() and "there" in picker.fetch_button.text()
    assert picker.fetch_label.text().startswith("SmolLM2 on kvtest")
    stages = []
    window.controller.progressed.connect(lambda task, stage, frac: stages.append((task, stage, frac)))
    with qtbot.waitSignal(window.controller.fetched, timeout=LOAD_TIMEOUT_MS) as done:
        picker.fetch_button.click()
    assert done.args[0].endswith(".gguf")
    assert ("fetch", "verifying", 1.0) in stages and window.controller.client.local is False
    assert "ssh" in psutil.Process(window.controller.engine_pid).name()


def test_the_picker_s_run_on_row(qtbot, window):
    """No sshd needed: the row's state, the request it makes, the warning, what the settings give it."""
    picker = window.open_picker()
    qtbot.waitExposed(picker)
    assert picker.run_local.isChecked() and not picker.host.isEnabled() and not picker.python.isEnabled()
    req = picker.request()
    assert req.host is None and req.python is None and picker.file_button.isEnabled()
    picker.trust.setChecked(True)
    assert "on this machine" in picker.trust_warning.text()
    picker.run_ssh.click()
    assert picker.request() is None  # ssh without a host: Load waits for one
    picker.host.setText("me@gpu-box")
    assert "on me@gpu-box" in picker.trust_warning.text() and picker.trust_warning.isVisible()
    assert not picker.file_button.isEnabled() and "there" in picker.fetch_button.text()
    req = picker.request()
    assert (req.host, req.python) == ("me@gpu-box", None)  # empty python: python3 on the host
    picker.python.setText(" ~/venv/bin/python ")
    assert picker.request().python == "~/venv/bin/python"
    picker.run_local.click()
    assert picker.request().host is None and "on this machine" in picker.trust_warning.text()
    # The remembered choice comes back with the picker.
    window.settings.run_on, window.settings.ssh_host, window.settings.ssh_python = "ssh", "gpu2", "/opt/py"
    picker = window.open_picker()
    assert picker.run_ssh.isChecked() and picker.host.text() == "gpu2" and picker.python.text() == "/opt/py"
