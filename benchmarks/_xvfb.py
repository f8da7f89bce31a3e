"""A private X server for the window benchmarks: the real xcb platform, as users have it (not offscreen).

``with xvfb() as env:`` starts ``Xvfb :N -screen 0 1280x1024x24 -nolisten tcp`` on a free display
number (unless ``--display`` / ``$DISPLAY`` already names one) and yields an environment for child
processes with ``DISPLAY`` set and ``QT_QPA_PLATFORM`` removed. No window manager, like CI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path


@contextlib.contextmanager
def xvfb(display: str | None = None):
    env = dict(os.environ)
    env.pop("QT_QPA_PLATFORM", None)
    if display:
        env["DISPLAY"] = display
        yield env
        return
    exe = shutil.which("Xvfb")
    if exe is None:
        raise SystemExit("Xvfb is not installed (apt-get install xvfb xauth libxcb-icccm4 libxcb-keysyms1), "
                         "or pass --display :N of a running X server")
    n = next(i for i in range(90, 200) if not Path(f"/tmp/.X11-unix/X{i}").exists() and not Path(f"/tmp/.X{i}-lock").exists())
    proc = subprocess.Popen([exe, f":{n}", "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"Xvfb :{n} did not start (exit {proc.poll()})")
            time.sleep(0.05)
        env["DISPLAY"] = f":{n}"
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
