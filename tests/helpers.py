"""What tests of every group share: the repository's paths, starting the ``kvinspect`` command, waiting.

Plain functions, no fixtures (those live in the conftest files), and nothing that imports Qt: the core's
tests also run without PySide6 installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESOURCES = ROOT / "resources"
#: A real tiny-gemma3 trace, the fuzzers' seed: damaged copies of it are read back.
FUZZ_SEED = ROOT / "tests" / "fuzz" / "data" / "tiny-gemma3.jsonl"


def vl_unavailable() -> str:
    """Why tiny-gemma3-vl cannot be built here ("" when it can): kvinspect refuses it on transformers 4.x
    (``core/model/tiny_vl.py``)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return f"tiny-gemma3-vl is refused on transformers {transformers.__version__}"
    return ""


def kvinspect_argv(*args: str) -> list[str]:
    """``python -m kvinspect ARGS`` with this interpreter."""
    return [sys.executable, "-m", "kvinspect", *map(str, args)]


def cli_env(tmp_path: Path | None = None, **extra: str) -> dict:
    """The environment of a ``python -m kvinspect`` child: this one's (the tests' own folders, no hub), or
    with ``tmp_path`` its own config and data folders there; ``extra`` on top."""
    env = dict(os.environ)
    if tmp_path is not None:
        env.update(KVINSPECT_CONFIG_DIR=str(tmp_path / "config"), KVINSPECT_DATA_DIR=str(tmp_path / "data"),
                   QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def run_cli(args, tmp_path: Path | None = None, *, cwd: Path | str | None = ROOT, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m kvinspect ARGS`` to its end, output captured as text; in ``env`` (a whole environment),
    else :func:`cli_env` of ``tmp_path``."""
    return subprocess.run(kvinspect_argv(*args), capture_output=True, text=True,
                          env=env if env is not None else cli_env(tmp_path), timeout=timeout, cwd=cwd)


def start_cli(args, tmp_path: Path | None = None, *, cwd: Path | str | None = ROOT, env: dict | None = None,
              **popen) -> subprocess.Popen:
    """``python -m kvinspect ARGS`` started, environment as for :func:`run_cli`; ``popen``: Popen's own arguments."""
    return subprocess.Popen(kvinspect_argv(*args), cwd=cwd, env=env if env is not None else cli_env(tmp_path),
                            **popen)


def cli_main(args, capsys) -> tuple[int, str, str]:
    """``kvinspect ARGS`` in this process: ``(exit code, stdout, stderr)``."""
    from kvinspect.cli import main

    rc = main(list(map(str, args)))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def wait_for(pred, timeout: float = 20.0, every: float = 0.05) -> bool:
    """Poll ``pred`` until it holds or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return bool(pred())


def loaded_model(request, name: str):
    """A built-in loaded once per session; SmolLM2 through its fixture (a skip where it is not fetched)."""
    from tests.conftest import load_cached

    return request.getfixturevalue("smollm2") if name == "smollm2" else load_cached(name)
