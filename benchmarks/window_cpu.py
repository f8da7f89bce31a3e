"""The window's CPU while a scripted chat streams, and with the finished chat shown (idle), on Xvfb.

Starts the real window (``kvinspect gui --model M --script S --screenshot P``: the chat typed into
it as a user would, 2 turns × 200 new tokens of SmolLM2 by default) on a private Xvfb and samples
the CPU times of the window's process, its engine (the window's child) and the X server with psutil
every 0.2 s. A sample counts as *streaming* once the first turn has started (its ``turn_start`` line
is in the autosave trace), when the engine used at least half a core during it and the autosave
grew within the last second: the engine generates and its stream reaches the window (a paced engine
sends a batch a paint, up to half a second apart, so a sample without growth is streaming too; a
model's load is not, nor the window's work on the loaded model, which a script's first turn follows
at once). After the script's screenshot (the last turn done) the window is left alone for
``--idle`` seconds: the *idle* figure. Reported: mean cores (1.0 = one core busy) of each process in
both phases, the load average, and each turn's decode rate from the autosave.

Goals (window-CPU issue): window ≤ 0.02 cores streaming, ≤ 0.002 idle. Nothing is asserted::

    .venv/bin/python benchmarks/window_cpu.py                       # SmolLM2, 2 × 200 tokens
    .venv/bin/python benchmarks/window_cpu.py --runs 3
    .venv/bin/python benchmarks/window_cpu.py --model gemma3-270m --script resources/scripts/hybrid.json
    .venv/bin/python benchmarks/window_cpu.py --profile /tmp/window.prof   # cProfile of the window's GUI thread

``--parts`` runs the window once with the GUI thread's CPU counted in its parts (the clock's paint, the
plots' render and each lane, the plots' Qt paint, the transcript, the stream reads: ``_window_parts.py``)
over the streaming span and prints cores, calls a second and ms a call of each; cProfile inflates a
paint's many small calls, these counters do not. ``--events`` adds the split by the Qt event being
delivered (what Qt itself does between those parts); ``--items`` the split of the plots' Qt paint by the
graphics item painted. With ``--baseline`` the counted runs alternate between the two checkouts (this
one's counters on both). ``--dearer MS`` makes each render of the plots spin that much more CPU, as a
slower machine or a model of more layers would: what the window does when a frame a second costs more
than its budget (docs/redraw.md)::

    .venv/bin/python benchmarks/window_cpu.py --parts --dearer 12 --runs 2 --baseline /tmp/base

``--profile`` runs the window under ``python -m cProfile`` with ``--exit-when-done`` (the streaming
phase only: the profile is written when the window exits) and prints its top entries.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fetched import require_fetched  # noqa: E402
from _xvfb import xvfb  # noqa: E402

TURNS = ["Write a long story about a lighthouse keeper who finds a message in a bottle.",
         "Continue the story: what does the keeper do next? Tell it in detail."]
SAMPLE_S = 0.2
BUSY_ENGINE = 0.5  # cores: the engine generates
GREW_WITHIN_S = 1.0  # the autosave grew this recently: its stream reaches the window
STARTUP_AND_SHUTDOWN = ("<module>", "exec", "create", "<built-in method builtins.__import__>", "_shoot",
                        "<built-in method exit>", "<method 'waitForFinished' of 'PySide6.QtCore.QProcess' objects>")


def _env(base: dict, folder: Path) -> dict:
    env = dict(base)
    env.update(KVINSPECT_CONFIG_DIR=str(folder / "config"), KVINSPECT_DATA_DIR=str(folder / "data"),
               KVINSPECT_EPHEMERAL="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return env


def _cpu(p: psutil.Process | None) -> float:
    if p is None:
        return 0.0
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def _xserver(display: str) -> psutil.Process | None:
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if p.info.get("name") == "Xvfb" and display in cmd:
            return p
    return None


def _engine_of(window: psutil.Process) -> psutil.Process | None:
    """The window's engine: its child running ``kvinspect engine`` (not a short-lived helper it spawned)."""
    for p in window.children():
        try:
            if "engine" in p.cmdline():
                return p
        except psutil.Error:
            continue
    return None


def _turn_started(folder: Path) -> bool:
    return any(b'"turn_start"' in f.read_bytes() for f in (folder / "data" / "autosave").glob("*.jsonl")) if \
        (folder / "data" / "autosave").is_dir() else False


def _trace_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in (folder / "data" / "autosave").glob("*.jsonl")) if \
        (folder / "data" / "autosave").is_dir() else 0


def run_once(script: Path, folder: Path, base_env: dict, args, root: Path = ROOT) -> dict:
    env = _env(base_env, folder)
    env["PYTHONPATH"] = str(root)
    shot = folder / "done.png"
    cmd = [sys.executable, "-m", "kvinspect", "gui", "--model", args.model, "--device", args.device,
           "--script", str(script), "--screenshot", str(shot)]
    win = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wp = psutil.Process(win.pid)
    xp = _xserver(env["DISPLAY"])
    phases: dict[str, list[tuple[float, float, float]]] = {"streaming": [], "idle": []}
    engine = None
    last = None
    idle_until = None
    grew_at = -float("inf")  # when the autosave last grew
    started = False  # the first turn has started (read from the autosave until it has)
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            if win.poll() is not None:
                raise SystemExit(f"the window exited ({win.returncode}): {win.stderr.read().decode()[-1500:]}")
            if engine is None or not engine.is_running():
                engine = _engine_of(wp)
            now = time.monotonic()
            cur = (now, _cpu(wp), _cpu(engine), _cpu(xp), _trace_size(folder))
            if last is not None and cur[4] > last[4]:
                grew_at = now
            if last is not None and engine is not None and last[2] > 0:
                dt = cur[0] - last[0]
                row = tuple((cur[i] - last[i]) / dt for i in (1, 2, 3))
                if idle_until is not None:
                    phases["idle"].append(row)
                elif started and row[1] >= BUSY_ENGINE and cur[0] - grew_at <= GREW_WITHIN_S:
                    phases["streaming"].append(row)
            # (from the next sample on: the one the turn started in holds the end of the model's load)
            started = started or (grew_at == now and _turn_started(folder))
            last = cur
            if idle_until is None and shot.exists():
                time.sleep(1.0)  # the screenshot's own full repaint is not idle
                idle_until = time.monotonic() + args.idle
                last = None
                continue
            if idle_until is not None and time.monotonic() >= idle_until:
                break
            time.sleep(SAMPLE_S)
        else:
            raise SystemExit("timed out")
    finally:
        win.terminate()
        try:
            win.wait(20)
        except subprocess.TimeoutExpired:
            win.kill()
    from kvinspect.core.trace.tracefile import read_trace

    traces = sorted((folder / "data" / "autosave").glob("*.jsonl"))
    rec = read_trace(traces[-1])
    out = {"tok_s": [t.to_dict().get("tokens_per_s") for t in rec.turns],
           "tokens": [t.new_tokens for t in rec.turns], "load": os.getloadavg()[0]}
    for name, rows in phases.items():
        cols = list(zip(*rows, strict=True)) if rows else [(), (), ()]
        out[name] = {k: (statistics.fmean(c) if c else float("nan")) for k, c in zip(("window", "engine", "xvfb"), cols,
                                                                                     strict=True)}
        out[name]["samples"] = len(rows)
    return out


def _done_when_finished(script: Path, args) -> list[str]:
    """The window's arguments for a run that exits after the script's last turn (--profile, --parts)."""
    return ["gui", "--model", args.model, "--device", args.device, "--script", str(script), "--exit-when-done"]


def profile(script: Path, folder: Path, base_env: dict, args) -> None:
    env = _env(base_env, folder)
    # CPU time, not wall time: on a machine whose cores the engine keeps busy, a paint's wall time is
    # mostly waiting to be scheduled. (process_time: the window's Qt threads are counted to the call
    # that was running on the GUI thread meanwhile.)
    runner = ("import cProfile, runpy, sys, time\n"
              "out = sys.argv[1]\n"
              "sys.argv = ['kvinspect'] + sys.argv[2:]\n"
              "pr = cProfile.Profile(time.process_time)\n"
              "code = 0\n"
              "try:\n"
              "    pr.runcall(runpy.run_module, 'kvinspect', run_name='__main__', alter_sys=True)\n"
              "except SystemExit as e:\n"
              "    code = e.code\n"
              "pr.dump_stats(out)\n"
              "sys.exit(code)\n")
    cmd = [sys.executable, "-c", runner, args.profile, *_done_when_finished(script, args)]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise SystemExit(f"the profiled window failed ({p.returncode}): {p.stderr[-1500:]}")
    print_profile(args.profile, args.top)


def parts(script: Path, folder: Path, base_env: dict, args, root: Path = ROOT) -> None:
    env = _env(base_env, folder)
    env["PYTHONPATH"] = str(root)  # (a baseline's window, counted by this checkout's _window_parts.py)
    if args.events:
        env["KVINSPECT_PARTS_EVENTS"] = "1"
    if args.items:
        env["KVINSPECT_PARTS_ITEMS"] = "1"
    if args.dearer:
        env["KVINSPECT_PARTS_DEARER_MS"] = str(args.dearer)
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "_window_parts.py"), *_done_when_finished(script, args)]
    p = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=args.timeout)
    lines = p.stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("parts:")), None)
    if p.returncode != 0 or start is None:
        raise SystemExit(f"the counted window failed ({p.returncode}): {p.stderr[-1500:]}")
    print("\n".join(lines[start:]))


def print_profile(path: str, top: int) -> None:
    import pstats

    st = pstats.Stats(path)
    # Under the CPU clock (--profile's), the event loop's own time is Qt's work between Python calls
    # (painting plain widgets, X traffic, timers); under a wall clock it would be mostly waiting.
    loop = sum(v[2] for k, v in st.stats.items() if k[2] == "<built-in method exec>")
    busy = st.total_tt
    print(f"profile {path}: {busy:.2f} s of the window process' CPU under cProfile; {loop:.2f} s "
          f"({100 * loop / busy:.0f} %) in the event loop itself (Qt between Python calls); top entries by "
          "cumulative time:")
    rows = sorted(((v[3], k) for k, v in st.stats.items()), reverse=True)
    shown = 0
    for ct, (file, line, fn) in rows:
        if ct > busy * 1.0001 or "importlib" in file or fn in STARTUP_AND_SHUTDOWN or "shutdown" in fn or \
                (Path(file).name == "script_driver.py" and fn == "<lambda>"):
            continue  # the whole run (main, the event loop), the window's start (imports) and its shutdown
        print(f"  {ct:7.2f} s  {100 * ct / busy:5.1f} %  {Path(file).name}:{line}({fn})")
        shown += 1
        if shown >= top:
            break


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=200, help="max_new_tokens per turn (default 200)")
    ap.add_argument("--script", default=None, help="a chat script instead of the two built-in turns")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds sampled with the finished chat shown")
    ap.add_argument("--display", default=None, help="use this X display instead of starting Xvfb")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--profile", default=None, help="write a cProfile of the window here and print its top")
    ap.add_argument("--parts", action="store_true", help="count the GUI thread's CPU in the window's parts")
    ap.add_argument("--events", action="store_true", help="with --parts: also split the GUI thread's CPU by the Qt "
                    "event delivered")
    ap.add_argument("--items", action="store_true", help="with --parts: also count each graphics item's paint in "
                    "the plots' Qt paint")
    ap.add_argument("--dearer", type=float, default=0.0, help="with --parts: each render of the plots costs this many "
                    "ms more of the GUI thread's CPU (a slower machine, or more layers, emulated)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--baseline", default=None, help="another checkout (e.g. `git archive` of the commit before) "
                    "whose window runs interleaved with this one's, run by run")
    args = ap.parse_args(argv)
    require_fetched(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="kvinspect-window-cpu-"))
    if args.script:
        script = Path(args.script).resolve()
    else:
        script = tmp / "script.json"
        script.write_text(json.dumps({"turns": TURNS, "max_new_tokens": args.tokens, "do_sample": False, "seed": 0}))
    with xvfb(args.display) as env:
        if args.profile:
            profile(script, tmp / "profile", env, args)
            return 0
        arms = [("this", ROOT)] + ([("baseline", Path(args.baseline).resolve())] if args.baseline else [])
        if args.parts or args.events or args.items:
            for i in range(args.runs):
                for name, root in (arms if i % 2 == 0 else arms[::-1]):
                    if len(arms) > 1 or args.runs > 1:
                        print(f"run {i + 1} ({name}):")
                    parts(script, tmp / f"parts-{i}-{name}", env, args, root)
            return 0
        print(f"window_cpu: {args.model} on {args.device}, script {script.name}, window on {env['DISPLAY']} (xcb), "
              f"{os.cpu_count()} cores, sampled every {SAMPLE_S} s")
        for i in range(args.runs):
            for name, root in (arms if i % 2 == 0 else arms[::-1]):
                r = run_once(script, tmp / f"run-{i}-{name}", env, args, root)
                s, d = r["streaming"], r["idle"]
                print(f"  run {i + 1} ({name}): streaming ({s['samples']} samples) window {s['window']:.4f} cores, engine "
                      f"{s['engine']:.2f}, Xvfb {s['xvfb']:.4f} | idle ({d['samples']} samples) window {d['window']:.4f}, "
                      f"engine {d['engine']:.4f}, Xvfb {d['xvfb']:.4f} | decode "
                      f"{', '.join(f'{x:.1f}' for x in r['tok_s'] if x)} tok/s, tokens {r['tokens']} | "
                      f"load average {r['load']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
