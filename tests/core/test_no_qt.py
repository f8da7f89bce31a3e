"""The core and the CLI's headless paths never import Qt or pyqtgraph (a subprocess: pytest-qt imports Qt here).

``lint-imports`` checks the same statically (pyproject.toml, docs/gates.md); this imports the modules for real.
"""

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import kvinspect.commands
import kvinspect.core

HEADLESS_COMMANDS = [m.name for m in pkgutil.iter_modules(kvinspect.commands.__path__) if m.name != "gui"]


def _raise(name: str):
    raise ImportError(f"cannot import {name} to walk it")


def core_modules() -> list[str]:
    """Every module of kvinspect.core, subpackages included (walk_packages recurses; iter_modules does not)."""
    found = pkgutil.walk_packages(kvinspect.core.__path__, prefix="kvinspect.core.", onerror=_raise)
    return ["kvinspect.core"] + sorted(m.name for m in found)


def test_every_core_module_is_walked():
    # A folder without __init__.py (or a walk that stops one level down) would check fewer modules silently.
    root = Path(kvinspect.core.__file__).parent
    files = [p.relative_to(root).with_suffix("") for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    on_disk = {".".join(("kvinspect", "core", *(f.parts[:-1] if f.name == "__init__" else f.parts))) for f in files}
    mods = core_modules()
    assert not on_disk - set(mods), sorted(on_disk - set(mods))
    assert len(mods) >= len(files)
    assert "kvinspect.core.trace.tracefile" in mods and "kvinspect.core.observe._trace_boot.sitecustomize" in mods


def test_core_and_headless_cli_import_no_qt():
    mods = ["kvinspect", "kvinspect.cli"] + core_modules() + [f"kvinspect.commands.{m}" for m in HEADLESS_COMMANDS]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "from kvinspect.cli import build_parser; build_parser()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6'))\n"
        "assert not bad, bad\n"
        "assert 'kvinspect.gui' not in sys.modules\n"
    )
    # The boot sitecustomize runs on import: without these it only takes itself off sys.path.
    env = {k: v for k, v in os.environ.items() if k not in ("KVINSPECT_TRACE_DIR", "KVINSPECT_TRACE_PKG")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
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
