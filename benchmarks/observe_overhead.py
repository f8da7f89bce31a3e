"""Decode tokens/s of a plain generate() vs the same call observed by kvinspect (figures, not a test).

Modes, interleaved in one process (rotating order, so drift hits every mode alike):

- ``none``      nothing attached
- ``observe``   ``kvinspect.observe(model)``, in memory
- ``trace``     ``kvinspect.observe(model, trace=DIR)``: the trace file is appended live (+ ticker)
- ``zero-edit`` what ``kvinspect trace`` installs: the module-registration hook plus the lazy per-model
                pre-hook, an observer writing its trace

Prints the median decode rate per mode, its ratio to ``none`` and the time spent in kvinspect's
hooks per forward pass; then the hooks' cost measured in isolation (median of 2000 calls on the
model's real cache, so a busy machine does not blur it) against the median decode step, and the
once-a-turn cost of closing a turn. Goal: overhead ≤ 1 % of decode tokens/s.

    .venv/bin/python benchmarks/observe_overhead.py                 # SmolLM2 if fetched, else tiny-llama
    .venv/bin/python benchmarks/observe_overhead.py --model tiny-llama --runs 9 --new 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import kvinspect  # noqa: E402
from kvinspect.core.model.loading import load_model  # noqa: E402
from kvinspect.core.observe.tracer import Tracer  # noqa: E402

PROMPT = ("You are a careful assistant. Explain, step by step and with one small example, how a key-value "
          "cache speeds up autoregressive decoding in a transformer language model.")


class _Clock:
    """A streamer that only timestamps: first new token and the end."""

    def __init__(self):
        self.prompt_seen = False
        self.first = None
        self.n = 0

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        if self.first is None:
            self.first = time.perf_counter()
        self.n += int(value.numel())

    def end(self):
        self.last = time.perf_counter()


def _once(model, ids, new: int) -> float:
    clock = _Clock()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, streamer=clock)
    return (clock.n - 1) / (clock.last - clock.first)


def main() -> int:
    from kvinspect.core.model.fetch import is_fetched

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2" if is_fetched("smollm2") else "tiny-llama")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()

    lm = load_model(args.model, device=args.device)
    model, tok = lm.model, lm.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"].to(lm.input_device)
    tmp = Path(tempfile.mkdtemp(prefix="kvinspect-bench-"))
    observers: dict[str, list] = {}

    def run(mode: str, i: int) -> float:
        if mode == "none":
            return _once(model, ids, args.new)
        if mode == "zero-edit":
            tracer = Tracer(tmp / f"zero-edit-{i}")
            tracer.install_torch_hooks()
            tracer.watch(model)  # the model exists already; `kvinspect trace` finds it while it is built
            try:
                return _once(model, ids, args.new)
            finally:
                tracer.finish()
                tracer.remove_torch_hooks()
                for o in tracer.observers:
                    o.detach()
                observers.setdefault(mode, []).extend(tracer.observers)
        trace = tmp / f"{mode}-{i}" if mode == "trace" else None
        with kvinspect.observe(model, tok, trace=trace) as rec:
            rate = _once(model, ids, args.new)
        observers.setdefault(mode, []).append(rec.observer)
        return rate

    modes = ["none", "observe", "trace", "zero-edit"]
    print(f"model {args.model} on {lm.device} ({lm.dtype}), prompt {ids.shape[1]} tokens, {args.new} new tokens, "
          f"greedy, {args.runs} interleaved runs per mode, torch threads {torch.get_num_threads()}")
    run("none", -1)  # warm-up
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.runs):
        order = modes[i % len(modes):] + modes[:i % len(modes)]
        for mode in order:
            rates[mode].append(run(mode, i))
    base = statistics.median(rates["none"])
    for mode in modes:
        med = statistics.median(rates[mode])
        line = f"{mode:>10}: {med:8.2f} tok/s  ratio {med / base:.4f}  overhead {100 * (1 - med / base):+.2f} %"
        obs = observers.get(mode, [])
        if mode != "none" and obs:
            calls = sum(o.steps.calls for o in obs)
            hook = sum(o.steps.time_in_hook + o.time_in_pre_hook for o in obs)
            if calls:
                step_ms = 1000 / med
                share = 100 * hook / calls / (step_ms / 1000)
                line += f"  | hooks {1e6 * hook / calls:.1f} µs/forward ({share:.2f} % of a step)"
        print(line)
        print(f"{'':>12}runs: {', '.join(f'{r:.2f}' for r in rates[mode])}")
    assert not model._forward_hooks and not model._forward_pre_hooks, "a hook was left behind"
    print(f"(medians of per-run decode rates; traces in {tmp})")
    _isolated(model, ids, 1.0 / base)
    return 0


def _isolated(model, ids, step_s: float, n: int = 2000) -> None:
    """Per-call cost of the pre-hook and the step hook, and of closing a 64-forward turn."""
    from kvinspect.core import compat
    from kvinspect.core.observe.model_observer import ModelObserver

    cache = compat.new_dynamic_cache(model.config)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, **{compat.cache_kwarg(model): cache})
    obs = ModelObserver(model)
    step_ids = ids[:, -1:]
    kwargs = {"input_ids": step_ids, compat.cache_kwarg(model): cache, "use_cache": True}
    pre, post, close = [], [], []
    for i in range(n):
        t0 = time.perf_counter()
        obs.before_forward((), kwargs)
        t1 = time.perf_counter()
        obs.steps._hook(model, (), kwargs, out)
        t2 = time.perf_counter()
        pre.append(t1 - t0)
        post.append(t2 - t1)
        if i % 64 == 63:  # a turn of 64 forwards ends
            t3 = time.perf_counter()
            obs.mark(f"turn {i // 64 + 1}")
            close.append(time.perf_counter() - t3)
    med_pre, med_post = statistics.median(pre), statistics.median(post)
    total = med_pre + med_post
    print(f"isolated, {len(cache.layers)} layers, {cache.get_seq_length()} cached tokens: pre-hook "
          f"{1e6 * med_pre:.1f} µs + step hook {1e6 * med_post:.1f} µs = {1e6 * total:.1f} µs per forward = "
          f"{100 * total / step_s:.2f} % of the median decode step ({1e3 * step_s:.1f} ms); closing a 64-forward "
          f"turn {1e3 * statistics.median(close):.2f} ms (once per turn)")


if __name__ == "__main__":
    sys.exit(main())
