"""What the per-forward step hook costs inside ``generate()``, against the layer count (figures, not a test).

Three figures, every run interleaved across models so drift in machine load hits them alike:

1. **In generate()**: ``StepObserver.time_in_hook / calls`` during greedy 64-token generations,
   on tiny random Llamas of 4, 16, 32 and 80 layers (same width) and on SmolLM2 when fetched.
   The forward pass has just evicted the interpreter's working set from the CPU caches, so this
   is the figure that matters (goal: ≤ 30 µs at 80 layers, 80-layer ≤ 1.3× the 4-layer one).
   Beside it: the median call after the first (the steady state, without a new cache's first
   sight or the record's block appends), and the **floor**: a forward hook that does nothing but
   read one layer's length and keep it, in the same generate() loop. The floor is what running
   any Python right after a forward costs on this machine; its growth with the layer count is the
   CPU caches', not kvinspect's.
2. **Isolated**: the same hook timed 2000 times in a loop on the model's real cache (warm caches).
3. **The whole observe() path** (pre-hook, step hook, token book, turn pipeline): the decode-rate
   slowdown of ``kvinspect.observe(model)`` on a narrow random model whose decode step takes about
   4 ms here, like a small model's step on a GPU (goal: ≤ 2 %). Paired ratio per round, median.

With ``--device cuda`` the same models run on the GPU and the hook is given as a share of a step.

    .venv/bin/python benchmarks/step_cost.py                  # CPU, all models
    .venv/bin/python benchmarks/step_cost.py --device cuda --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvinspect.core.compat import cache_kwarg  # noqa: E402

LAYER_COUNTS = (4, 16, 32, 80)
PROMPT = "Explain briefly why a key-value cache makes text generation faster."


def tiny_llama(layers: int, device: str, hidden: int | None = None):
    """The tiny-llama built-in with ``layers`` layers (same width), not in the public catalogue."""
    from kvinspect.core.model.tiny import TinySpec, build_model, build_tokenizer

    over = {"num_hidden_layers": layers}
    if hidden is not None:
        over.update(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=max(hidden // 16, 1),
                    num_key_value_heads=max(hidden // 32, 1), head_dim=16)
    model = build_model(TinySpec("LlamaConfig", over)).to(device)
    return model, build_tokenizer()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _generate(model, ids, new: int, device: str) -> float:
    _sync(device)
    t = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, temperature=None, top_p=None, top_k=None,
                       pad_token_id=model.generation_config.pad_token_id)
    _sync(device)
    return time.perf_counter() - t


def _timed_observer_class():
    from kvinspect.core.cache.observer import StepObserver

    class TimedObserver(StepObserver):
        """The real observer, each call's time kept as well (the wrapper's own cost is in the figures)."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.per_call: list[float] = []

        def _hook(self, module, args, kwargs, output) -> None:
            before = self.time_in_hook
            super()._hook(module, args, kwargs, output)
            self.per_call.append(self.time_in_hook - before)

    return TimedObserver


class _HookModel:
    """One model with a StepObserver wired exactly as ChatSession wires it (probe, memory, pipeline)."""

    def __init__(self, name: str, model, tok, device: str):
        from kvinspect.core.cache.memory import MemorySampler
        from kvinspect.core.cache.probe import CacheProbe
        from kvinspect.core.session.pipeline import TurnPipeline
        from kvinspect.core.trace.record import TraceRecord, TurnRecord

        self.name, self.model, self.device = name, model, device
        text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
        self.ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=device)
        probe = CacheProbe(model.config)
        memory = MemorySampler(device, rss_every_s=0.25)
        _TimedObserver = _timed_observer_class()
        self.pipeline = TurnPipeline(TraceRecord(probe.n_layers), probe, memory)
        self.turns = 0
        self.pipeline.begin(TurnRecord(index=0))
        self.obs = _TimedObserver(model, probe, self.pipeline.step, memory)
        self.probe = probe
        self.layers = probe.n_layers

    def run(self, new: int, grouped: bool = True) -> tuple[float, float, float]:
        """(hook µs per forward, steady-state median µs, generate seconds per forward) of one observed generation.

        ``grouped=False``: every layer read on every forward, as before the layers were grouped (the baseline)."""
        from kvinspect.core.trace.record import TurnRecord

        self.probe.group_layers = grouped
        self.obs.calls, self.obs.time_in_hook = 0, 0.0
        self.obs.per_call.clear()
        self.turns += 1
        self.pipeline.begin(TurnRecord(index=self.turns))  # one turn per generate(), as ChatSession has it
        with self.obs:
            total = _generate(self.model, self.ids, new, self.device)
        steady = statistics.median(self.obs.per_call[1:]) if len(self.obs.per_call) > 1 else 0.0
        return (1e6 * self.obs.time_in_hook / max(self.obs.calls, 1), 1e6 * steady,
                total / max(self.obs.calls, 1))

    def floor_us(self, new: int) -> float:
        """µs per forward of the cheapest observer: one layer's length read and kept, nothing else."""
        kept: list = []
        spent = [0.0]
        name = cache_kwarg(self.model)

        def hook(module, args, kwargs, output):
            t = time.perf_counter()
            cache = kwargs.get(name)
            layers = getattr(cache, "layers", None)
            keys = layers[0].keys if layers else None
            kept.append((t, id(cache), keys.shape[2] if keys is not None else 0))
            spent[0] += time.perf_counter() - t

        handle = self.model.register_forward_hook(hook, with_kwargs=True)
        try:
            _generate(self.model, self.ids, new, self.device)
        finally:
            handle.remove()
        return 1e6 * spent[0] / max(len(kept), 1)

    def isolated_us(self, grouped: bool, calls: int = 2000) -> float:
        from kvinspect.core.compat import cache_from_generate_output, cache_kwarg

        with torch.inference_mode():
            out = self.model.generate(self.ids, attention_mask=torch.ones_like(self.ids), max_new_tokens=8,
                                      do_sample=False, temperature=None, top_p=None, top_k=None,
                                      return_dict_in_generate=True, pad_token_id=self.model.generation_config.pad_token_id)
        kwargs = {"input_ids": self.ids[:, -1:], "use_cache": True,
                  cache_kwarg(self.model): cache_from_generate_output(out)}
        self.probe.group_layers = grouped
        self.obs._hook(self.model, (), kwargs, None)  # first sight of the cache: shapes, groups
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            self.obs._hook(self.model, (), kwargs, None)
            times.append(time.perf_counter() - t)
        return 1e6 * statistics.median(times)


def hook_figures(device: str, rounds: int, new: int, with_smollm2: bool) -> None:
    models = []
    for n in LAYER_COUNTS:
        m, tok = tiny_llama(n, device)
        models.append(_HookModel(f"tiny-llama ×{n}", m, tok, device))
    if with_smollm2:
        from kvinspect.core.model.loading import load_model

        lm = load_model("smollm2", device=device)
        models.append(_HookModel("SmolLM2", lm.model, lm.tokenizer, lm.device))
    for m in models:
        m.run(4)  # warm-up: allocator, first sight of the cache classes
        m.floor_us(4)
    arms = ((False, "every layer (before)"), (True, "one per group (now)"))
    res: dict[tuple, list[tuple[float, float, float]]] = {(m.name, g): [] for m in models for g, _ in arms}
    floors: dict[str, list[float]] = {m.name: [] for m in models}
    for r in range(rounds):
        order = models[r % len(models):] + models[:r % len(models)]
        for m in order:
            for g, _ in (arms if r % 2 else arms[::-1]):
                res[m.name, g].append(m.run(new, g))
            floors[m.name].append(m.floor_us(new))
    print(f"\nstep hook inside generate(), {new} new tokens, {rounds} interleaved rounds, device {device}")
    floor = {m.name: statistics.median(floors[m.name]) for m in models}
    for g, label in arms:
        print(f"  read: {label}")
        print(f"    {'model':<16} {'layers':>6} {'in generate µs':>15} {'min':>7} {'max':>7} {'steady µs':>10} "
              f"{'floor µs':>9} {'isolated µs':>12} {'step ms':>8} {'share':>7}")
        meds = []
        for m in models:
            us = [u for u, _, _ in res[m.name, g]]
            steady = statistics.median(v for _, v, _ in res[m.name, g])
            step = statistics.median(s for _, _, s in res[m.name, g])
            med = statistics.median(us)
            meds.append(med)
            print(f"    {m.name:<16} {m.layers:>6} {med:>15.1f} {min(us):>7.1f} {max(us):>7.1f} {steady:>10.1f} "
                  f"{floor[m.name]:>9.1f} {m.isolated_us(g):>12.1f} {1e3 * step:>8.2f} {100 * med / 1e6 / step:>6.2f}%")
        top = meds[len(LAYER_COUNTS) - 1]
        names = [m.name for m in models]
        f0, f1 = floor[names[0]], floor[names[len(LAYER_COUNTS) - 1]]
        print(f"    80 layers / 4 layers: {top / meds[0]:.2f}× (goal ≤ 1.3×); 80 layers {top:.1f} µs (goal ≤ 30 µs); "
              f"above the floor: {meds[0] - f0:.1f} µs at 4 layers, {top - f1:.1f} µs at 80 "
              f"(the floor itself {f0:.1f} → {f1:.1f} µs, {f1 / f0:.2f}×)")


def observe_slowdown(device: str, rounds: int, new: int, layers: int, hidden: int) -> None:
    """Decode slowdown of kvinspect.observe() on a narrow model with a ~4 ms decode step."""
    import kvinspect

    model, tok = tiny_llama(layers, device, hidden)
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"].to(device)
    def plain() -> float:
        return _generate(model, ids, new, device)

    hooks: dict[bool, list[float]] = {False: [], True: []}

    def observed(grouped: bool) -> float:
        with kvinspect.observe(model, tok) as rec:
            rec.observer.probe.group_layers = grouped
            s = _generate(model, ids, new, device)
        o = rec.observer
        hooks[grouped].append((o.steps.time_in_hook + o.time_in_pre_hook) / max(o.steps.calls, 1))
        return s

    cache_name = cache_kwarg(model)

    def floor() -> float:
        """The cheapest observer of the same shape: a pre-hook and a hook, one layer's length kept."""
        kept: list = []

        def pre(module, args, kwargs):
            kept.append(time.perf_counter())

        def post(module, args, kwargs, output):
            cache = kwargs.get(cache_name)
            layers = getattr(cache, "layers", None)
            keys = layers[0].keys if layers else None
            kept.append((id(cache), keys.shape[2] if keys is not None else 0))

        handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
                   model.register_forward_hook(post, with_kwargs=True)]
        try:
            return _generate(model, ids, new, device)
        finally:
            for h in handles:
                h.remove()

    plain(), observed(True), observed(False), floor()  # warm-up
    hooks[True].clear(), hooks[False].clear()
    runs: dict[str, list[float]] = {"plain": [], "floor": [], "before": [], "now": []}
    for r in range(rounds):
        arms = [("plain", plain), ("floor", floor), ("before", lambda: observed(False)),
                ("now", lambda: observed(True))]
        for name, fn in arms[r % 4:] + arms[:r % 4]:
            runs[name].append(fn())
    step_ms = 1e3 * statistics.median(runs["plain"]) / new
    print(f"\nobserve() path on a narrow random Llama ({layers} layers, width {hidden}), device {device}: "
          f"{new} new tokens, {rounds} interleaved rounds; plain generate {step_ms:.2f} ms per forward")
    ratio = statistics.median(o / b for b, o in zip(runs["plain"], runs["floor"]))
    print(f"   floor: a pre-hook and a hook that keep one layer's length: paired ratio {ratio:.4f} = slowdown "
          f"{100 * (ratio - 1):+.2f} % (what any Python observer costs this model here)")
    for name, grouped in (("before", False), ("now", True)):
        ratio = statistics.median(o / b for b, o in zip(runs["plain"], runs[name]))
        h = statistics.median(hooks[grouped])
        print(f"  {name:>6}: observed / plain time, median paired ratio {ratio:.4f} = slowdown "
              f"{100 * (ratio - 1):+.2f} % (goal ≤ 2 %); pre-hook + step hook inside generate() "
              f"{1e6 * h:.1f} µs per forward = {100 * h / (step_ms / 1e3):.2f} % of a step")


def main(argv: list[str] | None = None) -> int:
    from kvinspect.core.model.fetch import is_fetched

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--narrow-layers", type=int, default=14,
                    help="layers of the ~4 ms-step model (14 at width 64: 3.8 ms a forward here)")
    ap.add_argument("--narrow-width", type=int, default=64)
    ap.add_argument("--skip", choices=("hook", "observe"), default=None)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average at start {os.getloadavg()}")
    if args.skip != "hook":
        hook_figures(args.device, args.rounds, args.new, is_fetched("smollm2"))
    if args.skip != "observe":
        # Many short rounds: one round's four arms take about a second, and single runs vary by ±5 % here.
        observe_slowdown(args.device, max(args.rounds, 5) * 6 + 1, args.new, args.narrow_layers, args.narrow_width)
    print(f"\nload average at end {os.getloadavg()} (a shared machine: compare the medians within this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
