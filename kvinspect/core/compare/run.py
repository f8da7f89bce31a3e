"""Compare mode: one conversation under several cache configurations, in one process, side by side.

:func:`run_compare` is what ``kvinspect compare`` and the GUI's Compare window run. It loads
nothing (the caller passes one :class:`~kvinspect.core.model.loading.LoadedModel`), runs every
configuration through :func:`~.once.run_once` (so each run is an ordinary trace folder),
interleaves the configurations between repeats so that machine drift hits all of them alike,
and returns a :class:`~.plan.CompareResult` that :mod:`.report` turns into ``compare.md``,
``compare.json`` and plots. It is plain Python: call it from a worker thread, with ``progress`` and ``cancel``
callbacks (both called on that thread).

Sections (any combination): the scripted conversation repeated ``repeat`` times; the
long-conversation stress (:mod:`.stress`); the prompt-length sweep (:mod:`.lengths`). The
plan and result types live in :mod:`.plan`, one run in :mod:`.once`: both sections import
those, never this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kvinspect.core import env
from kvinspect.core.compare.configs import unavailable_reason
from kvinspect.core.compare.lengths import run_lengths
from kvinspect.core.compare.metrics import memory_kind
from kvinspect.core.compare.once import default_max_cache_len, model_info, rotated, run_once, turn_message
from kvinspect.core.compare.plan import (
    COMPARE_FORMAT,
    COMPARE_VERSION,
    RUNS_DIR,
    CancelCheck,
    ComparePlan,
    CompareResult,
    ConfigResult,
    Progress,
    RunMetrics,
)
from kvinspect.core.compare.stress import run_stress
from kvinspect.core.compare.trace_diff import comparison_diffs
from kvinspect.core.model.loading import LoadedModel
from kvinspect.core.session.script import ChatScript

#: Re-exported: ``from kvinspect.core.compare.run import ComparePlan, run_compare`` is the usual pair.
__all__ = [
    "COMPARE_FORMAT", "COMPARE_VERSION", "RUNS_DIR", "CancelCheck", "ComparePlan", "CompareResult", "ConfigResult",
    "Progress", "RunMetrics", "plan_units", "run_compare",
]


class _Ticker:
    """Progress in turns, plus the after-every-run notification."""

    def __init__(self, progress: Progress | None, total: int, on_run=None, result: CompareResult | None = None):
        self.progress = progress
        self.total = total
        self.done = 0
        self.on_run = on_run
        self.result = result

    def __call__(self, message: str, units: int = 1) -> None:
        self.done = min(self.total, self.done + units)
        if self.progress:
            self.progress(self.done, self.total, message)

    def run_finished(self) -> None:
        if self.on_run is not None:
            self.on_run(self.result)


# -- the whole comparison ----------------------------------------------------------------------------
def plan_units(plan: ComparePlan, active: list[ConfigResult]) -> int:
    n = 0
    for cr in active:
        if plan.conversation:
            assert plan.script is not None, "validate() refuses a conversation without a script"
            n += (plan.warmups_for(cr.config) + plan.repeat) * len(plan.script.turns)
        if plan.turns_until_failure:
            n += plan.turns_until_failure
        if plan.prompt_lengths:
            n += plan.warmups_for(cr.config) + plan.repeat * len(plan.prompt_lengths)
    return n


def run_compare(
    loaded: LoadedModel,
    plan: ComparePlan,
    out_dir,
    *,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    on_run: Callable[[CompareResult], None] | None = None,
) -> CompareResult:
    """Run ``plan`` with ``loaded``; traces go to ``out_dir/runs/``. Write the report with :mod:`.report`.

    ``on_run(result)`` is called (on this thread) after every finished run with the result so far:
    a window can call ``report.build_report(result)`` there and hand the dict to its UI.
    A cancel (``cancel()`` returning True) ends the turn in progress at its next token; the
    result then holds every finished turn and ``cancelled`` is True. Configurations that cannot
    run here are returned as skipped with their reason; nothing here raises for them.
    """
    plan.validate()
    out = Path(out_dir)
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    stop = cancel or (lambda: False)
    t_start = time.perf_counter()
    result = CompareResult(plan=plan, out_dir=out, model=model_info(loaded), device=loaded.device,
                           memory_kind=memory_kind(loaded.device), configs=[], created=env.now_iso())
    gc_impl = getattr(getattr(loaded.model, "generation_config", None), "cache_implementation", None)
    if gc_impl:
        result.notes.append(f"the checkpoint's generation_config sets cache_implementation={gc_impl!r}; it was "
                            "cleared for every run so each configuration uses the cache it names")
    for cfg in plan.configs:
        cr = ConfigResult(cfg)
        cr.reason = unavailable_reason(loaded, cfg)
        if cr.reason:
            cr.status = "skipped"
        elif cfg.uses_static:
            cr.max_cache_len = plan.max_cache_len or default_max_cache_len(loaded)
        result.configs.append(cr)
    active = [c for c in result.configs if c.active]
    tick = _Ticker(progress, plan_units(plan, active), on_run, result)
    if plan.conversation and active:
        _run_conversation(loaded, plan, active, out, tick, stop)
    if plan.turns_until_failure and not stop():
        run_stress(loaded, plan, [c for c in active if c.active], out, tick, stop)
    if plan.prompt_lengths and not stop():
        run_lengths(loaded, plan, result, [c for c in active if c.active], out, tick, stop)
    result.diffs = comparison_diffs(result)
    result.cancelled = bool(stop())
    result.wall_s = time.perf_counter() - t_start
    if progress and not result.cancelled and tick.done < tick.total:
        progress(tick.total, tick.total, "done")  # units of skipped work (failed warm-ups, skipped lengths)
    return result


def _run_conversation(loaded, plan: ComparePlan, active: list[ConfigResult], out: Path, tick: _Ticker, stop) -> None:
    script = plan.script
    assert script is not None, "validate() refuses a conversation without a script"
    script = ChatScript(turns=list(script.turns), system=script.system, settings=plan.settings)
    n = len(script.turns)

    def runner(cr: ConfigResult, kind: str, k: int, rel: str) -> RunMetrics:
        label = "warm-up" if kind == "warmup" else f"r{k}"
        return run_once(loaded, plan, cr.config, script, out, rel, kind=kind, repeat=k,
                        max_cache_len=cr.max_cache_len, should_stop=stop,
                        on_turn=lambda t: tick(turn_message(cr.name, label, t, n)))

    rounds = max((plan.warmups_for(c.config) for c in active), default=0)
    for w in range(rounds):
        for cr in rotated(active, w):
            if w >= plan.warmups_for(cr.config) or stop():
                continue
            run = runner(cr, "warmup", w + 1, f"{RUNS_DIR}/{cr.config.slug}-warmup{w + 1}")
            cr.warmups.append(run)
            tick.run_finished()
            if run.turns and all(t["status"] == "failed" for t in run.turns):
                # Nothing would be measured: e.g. compilation itself fails on this machine.
                cr.status, cr.reason = "failed", f"every warm-up turn failed: {run.turns[0]['error']}"
                tick(f"{cr.name}: skipped after its warm-up failed", (plan.repeat + plan.warmups_for(cr.config)
                                                                      - w - 1) * n)
    for r in range(plan.repeat):
        for cr in rotated([c for c in active if c.active], r):
            if stop():
                return
            cr.runs.append(runner(cr, "conversation", r + 1, f"{RUNS_DIR}/{cr.config.slug}-r{r + 1}"))
            tick.run_finished()
