"""Time from launching ``kvinspect`` to its window on screen (goal: ≤ 1.5 s).

Each run starts a fresh ``python -m kvinspect`` (bare, as the desktop launcher does) with
``KVINSPECT_QUIT_AFTER=0``: the app prints ``kvinspect: window shown`` from the event loop
once the window has been shown, then quits. The clock runs from ``Popen`` to that line, so it
includes the interpreter, every import, the QApplication, the window and the model picker.
torch and transformers must not be among the imports (only the engine, the model's own
process, imports them); the script checks that too, with ``-X importtime``.

The baseline, in the same process and interleaved run by run, is ``python -c "import torch,
transformers"``: what the window would cost on top if it imported them at startup.
Usage: ``QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/startup.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def launch_once(env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kvinspect"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)
    shown = None
    for line in proc.stdout:
        if "window shown" in line:
            shown = time.perf_counter() - t0
            break
    proc.wait(timeout=60)
    if shown is None:
        raise SystemExit(f"the window never said it was shown (exit {proc.returncode}): {proc.stderr.read()[-400:]}")
    return shown


def heavy_imports_once(env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, transformers"], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def imported_modules(env: dict) -> set[str]:
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvinspect"], env=env, capture_output=True, text=True,
                       timeout=120)
    names = set()
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    env = dict(os.environ)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    env["KVINSPECT_QUIT_AFTER"] = "0"
    env["KVINSPECT_CONFIG_DIR"] = tempfile.mkdtemp(prefix="kvinspect-startup-")  # a first run: no settings
    env.setdefault("KVINSPECT_DATA_DIR", tempfile.mkdtemp(prefix="kvinspect-startup-data-"))

    launch_once(env)  # warm the OS file cache; not counted
    window, heavy = [], []
    for _ in range(args.runs):  # interleaved, so machine load hits both alike
        window.append(launch_once(env))
        heavy.append(heavy_imports_once(env))
    mods = imported_modules(env)
    w, h = statistics.median(window), statistics.median(heavy)
    print(f"startup: launch → window shown, {args.runs} runs, load average {os.getloadavg()[0]:.1f}")
    print(f"  kvinspect window          median {w:.2f} s   min {min(window):.2f}   max {max(window):.2f}")
    print(f"  import torch+transformers median {h:.2f} s   min {min(heavy):.2f}   max {max(heavy):.2f}"
          f"   (window = {w / h:.2f}× this baseline)")
    leaked = sorted(mods & {"torch", "transformers", "accelerate", "gguf"})
    print(f"  heavy modules imported at startup: {', '.join(leaked) if leaked else 'none'}")
    print(f"  goal ≤ 1.5 s: {'met' if w <= 1.5 and not leaked else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
