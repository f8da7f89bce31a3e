"""The window's relay of an engine's stderr and an ssh banner: hostile bytes never reach the terminal raw.

An engine (or a remote host's sshd banner, which ssh writes to its stderr) can print anything. The
window logs those lines (the launching terminal, the log file) and quotes the last one in its exit
message and dialog: every control, escape sequence and bidi character arrives visibly escaped.
An ssh host that begins with ``-`` is refused with a dialog before anything is started.
"""

from __future__ import annotations

import logging
import sys

from kvinspect.gui.engine_link.engine_process import EngineClient
from tests.fuzz.hostile import POISON, unsafe

#: A hang guard for a child that prints and exits at once.
WAIT_MS = 60_000

_PRINTS_AND_EXITS = """
import sys
text = open(sys.argv[1], encoding="utf-8").read()  # argv cannot hold a NUL
for line in text.split("\\n"):
    sys.stderr.write(line + "\\n")
sys.stderr.write("the last line " + text.replace("\\n", " ") + "\\n")
sys.stderr.flush()
sys.exit(int(sys.argv[2]))
"""


def _run(qtbot, command: list[str]):
    client = EngineClient(command, hello_timeout_s=60)
    with qtbot.waitSignal(client.exited, timeout=WAIT_MS) as done:
        client.start()
    return client, done.args[0]


def _check(records, ex) -> None:
    relayed = [r.getMessage() for r in records if r.name.startswith("kvinspect")]
    assert relayed, "nothing was relayed"
    for msg in [*relayed, ex.message, *ex.stderr_tail]:
        assert not unsafe(msg), (msg[:200], unsafe(msg)[:5])
    assert any("\\x1b]0;PWNED-TITLE" in m and "\\u202e" in m for m in relayed)  # shown escaped, not dropped
    assert "\\x1b" in ex.message  # the exit message quotes the last line (cut at 300 characters)


def _poison_file(tmp_path):
    p = tmp_path / "poison.txt"
    p.write_text(POISON, encoding="utf-8")
    return str(p)


def test_an_engine_s_hostile_stderr_is_relayed_escaped(qtbot, caplog, tmp_path):
    with caplog.at_level(logging.INFO):
        client, ex = _run(qtbot, [sys.executable, "-c", _PRINTS_AND_EXITS, _poison_file(tmp_path), "1"])
    assert ex.code == 1 and not ex.greeted
    _check(caplog.records, ex)


def test_an_ssh_banner_is_relayed_escaped(qtbot, caplog, tmp_path):
    """A command shaped like the window's ssh engine command: the 'ssh' prints a hostile banner and fails (255)."""
    fake_ssh = [sys.executable, "-c", _PRINTS_AND_EXITS, _poison_file(tmp_path), "255"]
    command = [*fake_ssh, "-T", "-o", "BatchMode=yes", "--", "kvtest", "python3", "-m", "kvinspect", "engine"]
    with caplog.at_level(logging.INFO):
        client, ex = _run(qtbot, command)
    assert ex.message.startswith("the engine did not start: could not reach kvtest over ssh: the last line")
    _check(caplog.records, ex)


def test_an_ssh_host_beginning_with_a_dash_is_refused_with_a_dialog(qtbot, window):
    assert window.load("tiny-llama", host="-oProxyCommand=touch /tmp/kvinspect-pwned") is False
    boxes = [b for b in window.errors.boxes if b.isVisible()]
    assert [b.windowTitle() for b in boxes] == ["Cannot use that ssh host"]
    assert "begins with '-'" in boxes[0].text()
    assert window.controller.client is None or window.controller.client.local  # no ssh was started
    assert window.settings.ssh_host != "-oProxyCommand=touch /tmp/kvinspect-pwned"
