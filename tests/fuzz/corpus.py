"""The seeded corpus of hostile input over every command: prints tracebacks, hangs, lost outputs.

    .venv/bin/python -m tests.fuzz.corpus [--only report,view,...] [--seed 18] [--fields 200]

Each case runs ``kvinspect`` in a child under a memory cap and a timeout (tests/fuzz/harness.py)
and must exit 0 or 2 with one ``kvinspect:`` line, no traceback, no hang; the output cases also
check that an earlier run survives a run that cannot start. Figures, not a test: the test
suite's share of the same moves is tests/fuzz/test_fuzz_cli.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import stat
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.fuzz.harness import MEM_LIMIT_TORCH, ROOT, Outcome, run_cli
from tests.fuzz.mutations import config_cases, script_cases, trace_cases

GOOD_SCRIPT = {"turns": ["hello there", "and again"], "max_new_tokens": 4}


def good_run(work: Path) -> Path:
    out = work / "good"
    if not (out / "trace.jsonl").exists():
        (work / "good.json").write_text(json.dumps(GOOD_SCRIPT))
        res = run_cli(["run", "--model", "tiny-llama", "--script", str(work / "good.json"), "--out", str(out), "-q"],
                      timeout=300, mem=MEM_LIMIT_TORCH)
        assert res.rc == 0, res.err
    return out


class Tally:
    def __init__(self):
        self.counts: Counter = Counter()
        self.failures: list[tuple[str, str, Outcome]] = []

    def add(self, command: str, name: str, res: Outcome, allowed=(0, 2), lost: bool = False) -> None:
        why = res.check(allowed)
        if lost:
            why.append("lost output")
        self.counts["cases"] += 1
        self.counts[f"cases:{command}"] += 1
        for w in why:
            key = w.split()[0] if w[0].isdigit() else w
            self.counts[key if key in ("hang", "traceback", "lost output") else "wrong exit/lines"] += 1
        if why:
            self.failures.append((command, name, res))
            tail = (res.err.strip().splitlines() or [""])[-1][:160]
            print(f"FAIL {command} [{name}]: {', '.join(why)} :: {tail}", flush=True)


def trace_commands(work: Path, tally: Tally, rng: random.Random, n_fields: int, only: set[str]) -> None:
    trace = (good_run(work) / "trace.jsonl").read_bytes()
    cases = trace_cases(trace, rng, n_fields)
    for k, (name, data) in enumerate(cases):
        case = work / f"t{k}"
        case.mkdir()
        (case / "trace.jsonl").write_bytes(data)
        if "report" in only:
            plots = k % 10 == 0  # plots cost a Qt child: every tenth case draws them
            res = run_cli(["report", str(case), "--out", str(case / "rep"), *([] if plots else ["--no-plots"])],
                          timeout=120)
            tally.add("report", name, res)
        if "view" in only and k % 4 == 0:
            res = run_cli(["view", str(case / "trace.jsonl")], timeout=120, env={"KVINSPECT_QUIT_AFTER": "300"})
            tally.add("view", name, res)
        if "follow" in only and k % 4 == 1:
            res = run_cli(["view", "--follow", str(case / "trace.jsonl")], timeout=120,
                          env={"KVINSPECT_QUIT_AFTER": "1500"})
            tally.add("follow", name, res)
        shutil.rmtree(case, ignore_errors=True)
    if "report" in only or "view" in only:
        fifo = work / "fifo.jsonl"
        os.mkfifo(fifo)
        tally.add("report", "fifo trace", run_cli(["report", str(fifo), "--out", str(work / "rf")], timeout=60))
        tally.add("view", "fifo trace", run_cli(["view", str(fifo)], timeout=60, env={"KVINSPECT_QUIT_AFTER": "300"}))
        tally.add("report", "/dev/zero", run_cli(["report", "/dev/zero", "--out", str(work / "rz")], timeout=60))
        tally.add("report", "folder", run_cli(["report", str(work), "--out", str(work / "rd")], timeout=60))


def script_commands(work: Path, tally: Tally, rng: random.Random, only: set[str]) -> None:
    for k, (name, data) in enumerate(script_cases(rng)):
        p = work / f"s{k}.json"
        p.write_bytes(data)
        out = work / f"so{k}"
        if "run" in only:
            res = run_cli(["run", "--model", "tiny-llama", "--script", str(p), "--out", str(out), "-q"],
                          timeout=300, mem=MEM_LIMIT_TORCH)
            tally.add("run", name, res, lost=(out / "script.json").exists() and (out / "script.json").stat().st_size == 0)
        if "gui" in only and k % 5 == 0:
            res = run_cli(["gui", "--model", "tiny-llama", "--script", str(p), "--exit-when-done"], timeout=300,
                          mem=MEM_LIMIT_TORCH)
            tally.add("gui", name, res)
        if "compare" in only and k % 5 == 1:
            res = run_cli(["compare", "--model", "tiny-llama", "--script", str(p), "--out", str(work / f"co{k}")],
                          timeout=300, mem=MEM_LIMIT_TORCH)
            tally.add("compare", name, res)
    if "run" not in only:
        return
    fifo = work / "tmpl.fifo"
    os.mkfifo(fifo)
    sp = work / "ok.json"
    sp.write_text(json.dumps({"turns": ["hi"], "max_new_tokens": 2}))
    flag_cases = [
        ("fifo chat template", ["--chat-template", str(fifo)]),
        ("out empty", ["--out", ""]),
        ("system surrogate", ["--system", "\udc80"]),
        ("deep generation-config", ["--generation-config", "x=" + "[" * 30_000 + "]" * 30_000]),
        ("generation-config no value", ["--generation-config", "max_new_tokens"]),
        ("generation-config bad type", ["--generation-config", "max_new_tokens=\"many\""]),
        ("max-cache-len 0", ["--max-cache-len", "0"]),
        ("bad cache", ["--cache", "bogus"]),
        ("bad policy", ["--policy", "bogus"]),
        ("bad device", ["--device", "tpu:7"]),
        ("bad dtype", ["--dtype", "int3"]),
        ("max-new-tokens -1", ["--max-new-tokens", "-1"]),
        ("seed huge", ["--seed", str(2**70)]),
        ("missing model", ["--model", str(work / "nope")]),
    ]
    for name, extra in flag_cases:
        args = ["run", "--model", "tiny-llama", "--script", str(sp), "--out", str(work / f"f{len(name)}"), "-q"]
        for i in range(0, len(extra), 2):
            if extra[i] in args:
                args[args.index(extra[i]) + 1] = extra[i + 1]
            else:
                args += extra[i:i + 2]
        before = set(os.listdir(ROOT))
        res = run_cli(args, timeout=300, mem=MEM_LIMIT_TORCH)
        lost = name == "out empty" and set(os.listdir(ROOT)) != before
        tally.add("run", name, res, lost=lost)
    # --overwrite must keep the earlier run when the new one cannot start
    good = good_run(work)
    for name, extra in [("overwrite bad model", ["--model", str(work / "nope")]),
                        ("overwrite bad template", ["--chat-template", str(work / "nope.jinja")])]:
        dst = work / f"ow{len(name)}"
        shutil.copytree(good, dst)
        args = ["run", "--model", "tiny-llama", "--script", str(sp), "--out", str(dst), "-q", "--overwrite"]
        if extra[0] in args:
            args[args.index(extra[0]) + 1] = extra[1]
        else:
            args += extra
        res = run_cli(args, timeout=300, mem=MEM_LIMIT_TORCH)
        tally.add("run", name, res, lost=not (dst / "trace.jsonl").exists())


def model_commands(work: Path, tally: Tally, only: set[str]) -> None:
    if "models" not in only:
        return
    sp = work / "ok.json"
    sp.write_text(json.dumps({"turns": ["hi"], "max_new_tokens": 2}))
    for k, (name, config, files) in enumerate(config_cases()):
        folder = work / f"m{k}"
        folder.mkdir()
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 512}
        if config is not None:
            cfg.update(config)
            (folder / "config.json").write_text(json.dumps(cfg))
        for fname, data in files.items():
            (folder / fname).write_bytes(data)
        res = run_cli(["run", "--model", str(folder), "--script", str(sp), "--out", str(work / f"mo{k}"), "-q"],
                      timeout=300, mem=MEM_LIMIT_TORCH)
        tally.add("run-model", name, res)


def misc_commands(work: Path, tally: Tally, only: set[str]) -> None:
    if "misc" not in only:
        return
    f = work / "a-file"
    f.write_text("x")
    sp = work / "ok.json"
    sp.write_text(json.dumps({"turns": ["hi"], "max_new_tokens": 2}))
    tally.add("gui", "screenshot under a file",
              run_cli(["gui", "--model", "tiny-llama", "--script", str(sp), "--screenshot", str(f / "shot.png"),
                       "--exit-when-done"], timeout=300, mem=MEM_LIMIT_TORCH))
    tally.add("compare", "compile-mode bogus",
              run_cli(["compare", "--model", "tiny-llama", "--script", str(sp), "--out", str(work / "cmp"),
                       "--compile-mode", "bogus"], timeout=300, mem=MEM_LIMIT_TORCH))
    busy = work / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    res = run_cli(["compare", "--model", "tiny-llama", "--script", str(sp), "--out", str(busy)], timeout=300,
                  mem=MEM_LIMIT_TORCH)
    tally.add("compare", "non-empty out", res, lost=(busy / "mine.txt").read_text() != "keep")
    prog = work / "ok.py"
    prog.write_text("print('hi')\n")
    res = run_cli(["trace", "--out", str(work / "tr"), "--", sys.executable, str(prog)], timeout=120)
    tally.add("trace", "program exits 0", res, allowed=(0,))
    prog.write_text("raise SystemExit(3)\n")
    res = run_cli(["trace", "--out", str(work / "tr3"), "--", sys.executable, str(prog)], timeout=120)
    tally.add("trace", "program exits 3", res, allowed=(3,))
    for name, args in [("trace nothing", ["trace"]), ("trace missing program", ["trace", "--", "no-such-prog-x"]),
                       ("models bogus", ["models", "fetch", "bogus"]), ("unknown command", ["frobnicate"]),
                       ("view missing", ["view", str(work / "nope.jsonl")]),
                       ("follow missing folder", ["view", "--follow", str(work / "no" / "such" / "t.jsonl")])]:
        allowed = (0, 2, 127) if name == "trace missing program" else (0, 2)
        tally.add(name.split()[0], name, run_cli(args, timeout=60, env={"KVINSPECT_QUIT_AFTER": "300"}),
                  allowed=allowed)
    unreadable = work / "locked.jsonl"
    unreadable.write_text("{}")
    unreadable.chmod(0)
    tally.add("report", "unreadable", run_cli(["report", str(unreadable), "--out", str(work / "ru")], timeout=60))
    unreadable.chmod(stat.S_IRUSR | stat.S_IWUSR)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="report,view,follow,run,gui,compare,models,misc")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--fields", type=int, default=200, help="random field swaps in the trace cases")
    ap.add_argument("--work", default=None)
    a = ap.parse_args(argv)
    only = set(a.only.split(","))
    rng = random.Random(a.seed)
    work = Path(a.work or tempfile.mkdtemp(prefix="kvfuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    tally = Tally()
    t0 = time.monotonic()
    trace_commands(work, tally, rng, a.fields, only)
    script_commands(work, tally, rng, only)
    model_commands(work, tally, only)
    misc_commands(work, tally, only)
    c = tally.counts
    print(f"\ncorpus seed {a.seed}: {c['cases']} cases ("
          + ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(c.items()) if k.startswith("cases:"))
          + f") in {time.monotonic() - t0:.0f} s")
    print(f"tracebacks {c['traceback']}, hangs {c['hang']}, lost outputs {c['lost output']}, "
          f"wrong exit codes or stderr lines {c['wrong exit/lines']}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
