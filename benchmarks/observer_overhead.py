"""Decode speed with and without kvinspect's observer attached: same process, interleaved runs.

What it measures: greedy decode tokens/s of ``model.generate`` (a ~42-token chat prompt, a fixed
number of new tokens) with no hook, and with the exact observer a session attaches (a forward
hook reading per-layer lengths through :class:`CacheProbe`, sampling memory, appending each
step to a :class:`TraceRecord`). Runs alternate between the two arms (and swap their order every
round) so drift in machine load hits both; the figure is the median of each arm and their ratio.
It also reports the hook's own cost: the time spent inside it during the runs (a share of the
generate() time), and the median of 2000 calls timed one by one on the model's real cache, which
a busy machine barely moves (compare it with the decode step).

Goal: overhead <= 1 % on CPU. Run::

    .venv/bin/python benchmarks/observer_overhead.py                  # SmolLM2 on CPU (and CUDA if present)
    .venv/bin/python benchmarks/observer_overhead.py --model tiny-llama --runs 15

Nothing here is asserted: it prints figures for a human (and the closing note of the issue).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: 43 tokens with SmolLM2's chat template (its default system prompt included), like the reference measurement.
PROMPT = "Explain briefly why a key-value cache makes text generation faster."


class _FirstTokenClock:
    """A minimal streamer: records when the first new token arrives (generate() first sends the prompt)."""

    def __init__(self):
        self.calls = 0
        self.first = None
        self.first_cpu = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()
            self.first_cpu = time.process_time()

    def end(self):
        pass


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def one_run(loaded, ids, new_tokens: int, device: str, observer=None) -> dict:
    """One greedy generate; returns decode tokens/s and the hook's own time."""
    import torch

    clock = _FirstTokenClock()
    if observer is not None:
        observer.calls, observer.time_in_hook = 0, 0.0
        observer.attach()
    try:
        _sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                        min_new_tokens=new_tokens, do_sample=False, temperature=None, top_p=None,
                                        top_k=None, streamer=clock, pad_token_id=loaded.tokenizer.pad_token_id)
        _sync(device)
        t1 = time.perf_counter()
        c1 = time.process_time()
    finally:
        if observer is not None:
            observer.detach()
    n = out.shape[1] - ids.shape[1]
    decode_s = t1 - clock.first
    # CPU seconds of this process per decoded token: on a shared machine wall time also counts the
    # time other processes held the cores, CPU time mostly does not (torch's threads included).
    res = {"new": n, "tok_s": (n - 1) / decode_s, "total_s": t1 - t0, "ttft_s": clock.first - t0,
           "cpu_tok_s": (n - 1) / max(c1 - clock.first_cpu, 1e-9)}
    if observer is not None:
        res["hook_calls"] = observer.calls
        res["hook_us"] = 1e6 * observer.time_in_hook / max(observer.calls, 1)
        res["hook_share"] = observer.time_in_hook / (t1 - t0)
    return res


def make_observer(loaded, device: str):
    """The observer exactly as ChatSession wires it: probe + memory sampler + the turn pipeline's step."""
    from kvinspect.core.cache.memory import MemorySampler
    from kvinspect.core.cache.observer import StepObserver
    from kvinspect.core.cache.probe import CacheProbe
    from kvinspect.core.session.pipeline import TurnPipeline
    from kvinspect.core.trace.record import TraceRecord, TurnRecord

    probe = CacheProbe(loaded.model.config)
    record = TraceRecord(probe.n_layers)
    memory = MemorySampler(device, rss_every_s=0.25)
    pipeline = TurnPipeline(record, probe, memory)
    pipeline.begin(TurnRecord(index=0))
    return StepObserver(loaded.model, probe, pipeline.step, memory), record


def bench_device(spec: str, device: str, runs: int, new_tokens: int) -> dict:
    import torch

    from kvinspect.core.model.loading import load_model

    t = time.perf_counter()
    loaded = load_model(spec, device=device)
    load_s = time.perf_counter() - t
    tok = loaded.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=loaded.input_device)
    observer, record = make_observer(loaded, loaded.device)
    one_run(loaded, ids, 8, loaded.device)  # warm-up: allocator, kernels, first-call caches
    one_run(loaded, ids, 8, loaded.device, observer)
    arms: dict[str, list[dict]] = {"none": [], "observer": []}
    for r in range(runs):
        order = ("none", "observer") if r % 2 == 0 else ("observer", "none")
        for arm in order:
            arms[arm].append(one_run(loaded, ids, new_tokens, loaded.device, observer if arm == "observer" else None))
    iso = isolated_hook_us(loaded, ids, observer)
    med = {arm: statistics.median(x["tok_s"] for x in v) for arm, v in arms.items()}
    cpu_ratios = [o["cpu_tok_s"] / n["cpu_tok_s"] for n, o in zip(arms["none"], arms["observer"])]
    # Paired ratio per round (both arms ran back to back), then the median of those ratios.
    ratios = [o["tok_s"] / n["tok_s"] for n, o in zip(arms["none"], arms["observer"])]
    return {
        "model": loaded.name, "device": loaded.device, "dtype": loaded.dtype, "load_s": load_s,
        "prompt_tokens": int(ids.shape[1]), "new_tokens": new_tokens, "runs": runs,
        "tok_s": med, "ratio_of_medians": med["observer"] / med["none"],
        "median_paired_ratio": statistics.median(ratios),
        "cpu_tok_s": {arm: statistics.median(x["cpu_tok_s"] for x in v) for arm, v in arms.items()},
        "median_paired_cpu_ratio": statistics.median(cpu_ratios),
        "hook_us": statistics.median(x["hook_us"] for x in arms["observer"]),
        "hook_calls": arms["observer"][0]["hook_calls"],
        "hook_share": statistics.median(x["hook_share"] for x in arms["observer"]),
        "spread": {arm: (min(x["tok_s"] for x in v), max(x["tok_s"] for x in v)) for arm, v in arms.items()},
        "recorded_steps": record.n_steps,
        "isolated_hook_us": iso,
        "fastest_step_ms": 1e3 / max(x["tok_s"] for x in arms["none"]),
        "median_step_ms": 1e3 / med["none"],
    }


def isolated_hook_us(loaded, ids, observer, calls: int = 2000) -> float:
    """Median µs of the observer's hook on the model's real cache, a decode step's arguments, no forward.

    Timed call by call and summarised by the median, so other processes preempting a few calls do
    not move it: the steadiest figure on a shared machine.
    """
    import torch

    from kvinspect.core.compat import cache_from_generate_output, cache_kwarg

    with torch.inference_mode():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                    temperature=None, top_p=None, top_k=None, return_dict_in_generate=True,
                                    pad_token_id=loaded.tokenizer.pad_token_id)
    cache = cache_from_generate_output(out)
    kwargs = {"input_ids": ids[:, -1:], "use_cache": True, cache_kwarg(loaded.model): cache}
    observer._hook(loaded.model, (), kwargs, None)  # first sight of this cache object: layer shapes
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        observer._hook(loaded.model, (), kwargs, None)
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def report(res: dict) -> None:
    print(f"\n{res['model']} on {res['device']} ({res['dtype']}), prompt {res['prompt_tokens']} tokens, "
          f"{res['new_tokens']} new tokens, greedy, {res['runs']} interleaved runs per arm")
    print(f"  {'arm':<10} {'median tok/s':>13} {'min':>8} {'max':>8}")
    for arm in ("none", "observer"):
        lo, hi = res["spread"][arm]
        print(f"  {arm:<10} {res['tok_s'][arm]:>13.2f} {lo:>8.2f} {hi:>8.2f}")
    over = 1 - res["median_paired_ratio"]
    print(f"  observer / none: ratio of medians {res['ratio_of_medians']:.4f}, median paired ratio "
          f"{res['median_paired_ratio']:.4f}  (overhead {100 * over:+.2f} %; goal <= 1 % on CPU)")
    print(f"  per CPU second (less sensitive to other processes): none {res['cpu_tok_s']['none']:.2f}, observer "
          f"{res['cpu_tok_s']['observer']:.2f} tok/CPU-s, median paired ratio {res['median_paired_cpu_ratio']:.4f} "
          f"(overhead {100 * (1 - res['median_paired_cpu_ratio']):+.2f} %)")
    iso = res["isolated_hook_us"]
    print(f"  hook in isolation (median of 2000 calls on the real cache): {iso:.1f} µs = "
          f"{100 * iso / 1e3 / res['median_step_ms']:.3f} % of the median decode step ({res['median_step_ms']:.1f} ms), "
          f"{100 * iso / 1e3 / res['fastest_step_ms']:.3f} % of the fastest run's step ({res['fastest_step_ms']:.1f} ms)")
    print(f"  time in hook: {res['hook_us']:.1f} µs per call × {res['hook_calls']} calls per run "
          f"= {100 * res['hook_share']:.3f} % of the generate() time (independent of load noise)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="model spec (default: smollm2)")
    p.add_argument("--device", default="all", help="cpu, cuda, or all (cpu, then cuda when present)")
    p.add_argument("--runs", type=int, default=9, help="runs per arm (>= 7)")
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    import torch

    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        devices.remove("cuda")
        print("no CUDA device here: CPU only")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average at start {load}")
    for dev in devices:
        res = bench_device(args.model, dev, max(args.runs, 1), args.new_tokens)
        report(res)
    if load is not None:
        print(f"\nload average at end {os.getloadavg()} (other processes share these cores: compare the paired "
              f"ratio and the time in hook, not absolute tok/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
