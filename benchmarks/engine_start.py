"""Engine start → model ready, against a process that loads the same model in itself.

What the model's own process costs the window on a load. Each round starts, in fresh processes
and in alternating order:

* **engine**: ``python -m kvinspect engine`` (what the window starts), then, on its pipe, the
  handshake and a ``load`` request, as the window sends them; the clock runs from ``Popen`` to the
  ``loaded`` reply (split at the engine's ``hello``: interpreter + engine start, then the load);
* **in-process**: ``python -c "load_model(spec)"`` (what the window did before the split, and
  what ``kvinspect run`` does); the clock runs from ``Popen`` to the line it prints once loaded.

``--pick-s S`` adds an engine arm whose load request comes S seconds after the handshake, as when a
user picks a model in the window: the engine imports torch and transformers meanwhile, so its
*request → loaded* figure is what that user waits for.

Both load on CPU with ``HF_HUB_OFFLINE=1``. Reported per model: the medians, the engine's overhead
(median of the per-round differences) and the ratio. ``--ssh HOST`` adds a third arm through
``ssh HOST python3 -m kvinspect engine`` (``--ssh-python``, ``KVINSPECT_SSH_COMMAND`` apply).
Timings are the machine's, not assertions::

    .venv/bin/python benchmarks/engine_start.py                       # tiny-llama and smollm2, 5 rounds
    .venv/bin/python benchmarks/engine_start.py --models tiny-llama --rounds 9
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IN_PROCESS = ("import sys, time\n"
              "from kvinspect.core.model.loading import load_model\n"
              "loaded = load_model(sys.argv[1], device='cpu')\n"
              "print('ready', loaded.load_seconds, flush=True)\n")


def engine_once(spec: str, env: dict, command: list[str], pick_s: float = 0.0) -> dict:
    from kvinspect import __version__
    from kvinspect.engine.protocol import client_hello

    t0 = time.perf_counter()
    p = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=env, cwd=ROOT)

    def send(obj):
        p.stdin.write((json.dumps(obj) + "\n").encode())
        p.stdin.flush()

    t_hello = None
    try:
        for raw in p.stdout:  # heartbeats every second: a read never waits long
            try:
                obj = json.loads(raw)
            except ValueError:
                continue  # a login banner over ssh
            kind = obj.get("type")
            if kind == "hello" and t_hello is None:
                t_hello = time.perf_counter()
                send(client_hello(__version__, local=command[0] != "ssh"))
                if pick_s:  # the user picks a model meanwhile; the clock for "load" starts at the request
                    time.sleep(pick_s)
                    t_hello = time.perf_counter()
                send({"type": "load", "id": 1, "spec": spec, "device": "cpu", "dtype": "auto"})
            elif obj.get("id") == 1 and kind in ("loaded", "error"):
                t_ready = time.perf_counter()
                if kind == "error":
                    raise SystemExit(f"the engine could not load {spec}: {obj.get('message')}")
                return {"ready": t_ready - t0, "start": t_hello - t0, "load": t_ready - t_hello,
                        "load_s": obj["info"]["load_seconds"]}
        raise SystemExit(f"the engine ended before it loaded {spec} (exit {p.wait()})")
    finally:
        try:
            send({"type": "shutdown", "id": 2})
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def in_process_once(spec: str, env: dict) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", IN_PROCESS, spec], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env, cwd=ROOT, text=True)
    for line in p.stdout:
        if line.startswith("ready"):
            t = time.perf_counter() - t0
            p.wait(60)
            return {"ready": t, "load_s": float(line.split()[1])}
    raise SystemExit(f"the in-process load of {spec} failed (exit {p.wait()})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny-llama,smollm2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ssh", default=None, metavar="HOST", help="also start the engine on HOST over ssh")
    ap.add_argument("--ssh-python", default=None, metavar="PYTHON")
    ap.add_argument("--pick-s", type=float, default=0.0, metavar="S",
                    help="add an arm whose load request comes S seconds after the handshake (a user picking a model)")
    args = ap.parse_args(argv)
    from kvinspect.engine.launch import engine_command

    env = dict(os.environ)
    tmp = tempfile.mkdtemp(prefix="kvinspect-engine-start-")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", KVINSPECT_DATA_DIR=tmp,
               KVINSPECT_CONFIG_DIR=tmp, KVINSPECT_EPHEMERAL="1")
    arms = {"engine": lambda spec: engine_once(spec, env, engine_command()),
            "in-process": lambda spec: in_process_once(spec, env)}
    if args.pick_s:
        arms[f"engine, load after {args.pick_s:g} s"] = lambda spec: engine_once(spec, env, engine_command(), args.pick_s)
    if args.ssh:
        ssh_cmd = engine_command(args.ssh, args.ssh_python)
        arms["engine over ssh"] = lambda spec: engine_once(spec, env, ssh_cmd)
    print(f"engine_start: Popen → model ready on CPU, {args.rounds} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    for spec in [m.strip() for m in args.models.split(",") if m.strip()]:
        if spec == "smollm2":
            from kvinspect.core.model.fetch import is_fetched

            if not is_fetched("smollm2"):
                print("  smollm2: not fetched (kvinspect models fetch smollm2), skipped")
                continue
        names = list(arms)
        arms["in-process"](spec)  # warm the OS file cache; not counted
        res: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for n in order:
                res[n].append(arms[n](spec))
        base = res["in-process"]
        b = statistics.median(x["ready"] for x in base)
        print(f"  {spec}:")
        print(f"    in-process load       median {b:6.2f} s  [{min(x['ready'] for x in base):.2f}–"
              f"{max(x['ready'] for x in base):.2f}]  (load_model itself {statistics.median(x['load_s'] for x in base):.2f} s)")
        for n in names:
            if n == "in-process":
                continue
            xs = res[n]
            m = statistics.median(x["ready"] for x in xs)
            over = statistics.median(x["ready"] - y["ready"] for x, y in zip(xs, base, strict=True))
            print(f"    {n:<21} median {m:6.2f} s  [{min(x['ready'] for x in xs):.2f}–{max(x['ready'] for x in xs):.2f}]"
                  f"  = start → hello {statistics.median(x['start'] for x in xs):.2f} s + request → loaded "
                  f"{statistics.median(x['load'] for x in xs):.2f} s (load_model {statistics.median(x['load_s'] for x in xs):.2f} s)")
            print(f"    {'':<21} overhead {over * 1000:+.0f} ms per load (median of rounds), {m / b:.2f}× the in-process load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
