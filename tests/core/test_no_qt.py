"""The core and the CLI's headless paths never import Qt or pyqtgraph (a subprocess: pytest-qt imports Qt here)."""

import pkgutil
import subprocess
import sys

import kvinspect.commands
import kvinspect.core

HEADLESS_COMMANDS = [m.name for m in pkgutil.iter_modules(kvinspect.commands.__path__) if m.name != "gui"]
CORE = [m.name for m in pkgutil.iter_modules(kvinspect.core.__path__)]


def test_core_and_headless_cli_import_no_qt():
    mods = ["kvinspect", "kvinspect.cli"] + [f"kvinspect.core.{m}" for m in CORE] + [
        f"kvinspect.commands.{m}" for m in HEADLESS_COMMANDS
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "from kvinspect.cli import build_parser; build_parser()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6'))\n"
        "assert not bad, bad\n"
        "assert 'kvinspect.gui' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_headless_commands_run_without_qt(tmp_path):
    code = (
        "import sys\n"
        "from kvinspect.cli import main\n"
        "rc = main(['models'])\n"
        "assert rc == 0\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph'))\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
