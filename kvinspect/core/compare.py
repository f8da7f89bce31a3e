"""Compare mode: one conversation under several cache configurations, in one process, side by side.

:func:`run_compare` is what ``kvinspect compare`` and the GUI's Compare window run. It loads
nothing (the caller passes one :class:`~.loading.LoadedModel`), runs every configuration
through :func:`~.runner.run_script` (so each run is an ordinary trace folder), interleaves the
configurations between repeats so that machine drift hits all of them alike, and returns a
:class:`CompareResult` that :mod:`.compare_report` turns into ``compare.md``, ``compare.json``
and plots. It is plain Python: call it from a worker thread, with ``progress`` and ``cancel``
callbacks (both called on that thread).

Sections (any combination): the scripted conversation repeated ``repeat`` times; the
long-conversation stress (:mod:`.compare_stress`); the prompt-length sweep
(:mod:`.compare_lengths`).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import compat, env
from .compare_configs import (
    CompareConfig,
    compiled_decode,
    compiled_graph_count,
    default_compile_mode,
    quiet_recompiles,
    unavailable_reason,
)
from .compare_metrics import memory_kind, memory_now, turn_metrics
from .errors import ScriptError
from .loading import LoadedModel
from .record import TurnRecord
from .runner import run_script
from .script import ChatScript, GenerationSettings
from .session import SessionOptions

COMPARE_FORMAT = "kvinspect-compare"
COMPARE_VERSION = 1
RUNS_DIR = "runs"

#: ``progress(done, total, message)``: units are turns; called after every turn.
Progress = Callable[[int, int, str], None]
CancelCheck = Callable[[], bool]


@dataclass
class ComparePlan:
    """What to run. ``script`` is needed for the conversation and the stress sections."""

    configs: list[CompareConfig]
    script: ChatScript | None = None
    repeat: int = 3
    warmup: int = 0  # untimed rounds per configuration (static+compile always gets at least one)
    conversation: bool = True
    turns_until_failure: int | None = None
    prompt_lengths: list[int] = field(default_factory=list)
    max_cache_len: int | None = None  # static caches; default: the session's, or sized for the sweep
    max_new_tokens: int | None = None  # overrides the script's (and the sweep's default of 64)
    chat_template: str | None = None
    chat_template_name: str | None = None
    compile_mode: str | None = None  # default: reduce-overhead on CUDA, default elsewhere
    script_name: str | None = None
    command: list[str] | None = None

    def validate(self) -> ComparePlan:
        if not self.configs:
            raise ScriptError("nothing to compare: no configurations given")
        if not isinstance(self.repeat, int) or self.repeat < 1:
            raise ScriptError(f"--repeat must be a positive integer, got {self.repeat!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ScriptError(f"--warmup must be 0 or more, got {self.warmup!r}")
        if self.turns_until_failure is not None and self.turns_until_failure < 1:
            raise ScriptError(f"--turns-until-failure must be at least 1, got {self.turns_until_failure}")
        if self.max_cache_len is not None and self.max_cache_len < 1:
            raise ScriptError("--max-cache-len must be positive")
        if any((not isinstance(n, int)) or n < 1 for n in self.prompt_lengths):
            raise ScriptError("--prompt-lengths must be positive token counts, e.g. 32,256,2048")
        self.prompt_lengths = sorted(set(self.prompt_lengths))
        if not (self.conversation or self.turns_until_failure or self.prompt_lengths):
            raise ScriptError("nothing to run: ask for the conversation, --turns-until-failure or --prompt-lengths")
        if (self.conversation or self.turns_until_failure) and self.script is None:
            raise ScriptError("--script is needed for the conversation comparison and the stress mode")
        self.settings.validate()
        return self

    @property
    def settings(self) -> GenerationSettings:
        base = self.script.settings if self.script is not None else GenerationSettings()
        s = copy.copy(base)
        if self.max_new_tokens is not None:
            s.max_new_tokens = self.max_new_tokens
        return s

    def warmups_for(self, cfg: CompareConfig) -> int:
        return max(self.warmup, 1 if cfg.compile else 0)

    def to_dict(self) -> dict:
        return {
            "configs": [c.name for c in self.configs],
            "repeat": self.repeat,
            "warmup": self.warmup,
            "conversation": self.conversation,
            "turns_until_failure": self.turns_until_failure,
            "prompt_lengths": list(self.prompt_lengths),
            "max_cache_len": self.max_cache_len,
            "settings": self.settings.to_dict(),
            "chat_template": self.chat_template_name,
            "compile_mode": self.compile_mode,
            "script": self.script_name,
            "order": "interleaved: repeat r runs every configuration once, starting at configuration r (rotated)",
        }


@dataclass
class RunMetrics:
    """One run of one configuration: a trace folder and the figures of its turns."""

    config: str
    kind: str  # conversation | warmup | stress | length | length-warmup
    repeat: int  # 1-based
    dir: str  # relative to the compare folder
    turns: list[dict] = field(default_factory=list)
    baseline_memory_bytes: int = 0
    wall_s: float = 0.0
    compiled_graphs: int | None = None  # graphs dynamo compiled during this run (static+compile)
    length: int | None = None  # prompt-length sweep: the requested prompt tokens
    max_cache_len: int | None = None
    started_at: float = 0.0  # epoch seconds: the order runs really happened in (interleaving)
    #: dynamo's "hit config.recompile_limit" warnings during this run (kept off stderr, reported instead)
    recompile_limit_hits: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        sts = {t["status"] for t in self.turns}
        if "failed" in sts:
            return "failed"
        if "stopped" in sts or not self.turns:
            return "stopped"
        return "ok"

    def to_dict(self) -> dict:
        return {
            "config": self.config, "kind": self.kind, "repeat": self.repeat, "dir": self.dir,
            "status": self.status, "wall_s": self.wall_s, "baseline_memory_bytes": self.baseline_memory_bytes,
            "compiled_graphs": self.compiled_graphs, "length": self.length, "max_cache_len": self.max_cache_len,
            "started_at": self.started_at, "recompile_limit_hits": list(self.recompile_limit_hits),
            "turns": self.turns,
        }


@dataclass
class ConfigResult:
    config: CompareConfig
    status: str = "ran"  # ran | skipped (cannot run here) | failed (every warm-up turn failed)
    reason: str | None = None
    max_cache_len: int | None = None
    runs: list[RunMetrics] = field(default_factory=list)  # conversation repeats
    warmups: list[RunMetrics] = field(default_factory=list)
    stress: dict | None = None
    lengths: list[RunMetrics] = field(default_factory=list)
    length_warmups: list[RunMetrics] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def active(self) -> bool:
        return self.status == "ran"


@dataclass
class CompareResult:
    plan: ComparePlan
    out_dir: Path
    model: dict
    device: str
    memory_kind: str
    configs: list[ConfigResult]
    created: str = ""
    wall_s: float = 0.0
    cancelled: bool = False
    notes: list[str] = field(default_factory=list)
    lengths_skipped: list[dict] = field(default_factory=list)
    length_prompts: dict[int, int] = field(default_factory=dict)  # requested -> rendered prompt tokens

    def config(self, name: str) -> ConfigResult:
        for c in self.configs:
            if c.name == name:
                return c
        raise KeyError(name)

    def unmeasured(self) -> tuple[str, bool] | None:
        """Why a requested section measured nothing because everything in it was skipped, or None.

        Returns ``(one-line reason, total)``; ``total`` is True when the comparison as a whole
        measured nothing. A cancelled comparison is never "unmeasured": it says it was cancelled.
        """
        if self.cancelled:
            return None
        if self.configs and not any(c.active for c in self.configs):
            verb = "skipped" if all(c.status == "skipped" for c in self.configs) else "skipped or failed"
            why = "; ".join(f"{c.name}: {_without_name(c.reason, c.name)}" for c in self.configs)
            return f"nothing was measured: every configuration was {verb} ({why})", True
        if self.plan.prompt_lengths and self.lengths_skipped and not self.length_prompts:
            why = "; ".join(f"{s['length']}: {_without_name(s['reason'], '')}" for s in self.lengths_skipped)
            only = not (self.plan.conversation or self.plan.turns_until_failure)
            head = "nothing was measured" if only else "the prompt-length sweep measured nothing"
            return f"{head}: every --prompt-lengths length was skipped ({why})", only
        return None


def _without_name(reason: str | None, name: str) -> str:
    """``offloaded needs a CUDA device …`` → ``needs a CUDA device …`` (the name is already said)."""
    text = (reason or "no reason given").strip().replace("; ", ", ")  # "; " separates the entries
    return text[len(name) + 1:] if text.lower().startswith(name.lower() + " ") else text


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


def rotated(items: list, r: int) -> list:
    """Repeat ``r`` starts at item ``r``: no configuration always runs first (or right after another)."""
    if not items:
        return []
    k = r % len(items)
    return items[k:] + items[:k]


def model_info(loaded: LoadedModel) -> dict:
    tc = compat.text_config(loaded.model.config)
    return {
        "spec": loaded.spec, "name": loaded.name, "class": type(loaded.model).__name__,
        "device": loaded.device, "dtype": loaded.dtype, "model_type": getattr(tc, "model_type", None),
        "n_layers": getattr(tc, "num_hidden_layers", None),
        "max_position_embeddings": getattr(tc, "max_position_embeddings", None),
        "layer_types": compat.config_layer_types(loaded.model.config),
    }


def max_positions(loaded: LoadedModel) -> int | None:
    mpe = getattr(compat.text_config(loaded.model.config), "max_position_embeddings", None)
    return int(mpe) if mpe else None


def default_max_cache_len(loaded: LoadedModel) -> int:
    """The session's default static capacity: min(max_position_embeddings, 2048)."""
    return int(min(max_positions(loaded) or 2048, 2048))


# -- one run ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _isolated_generation_config(model):
    """A session writes its overrides into ``model.generation_config``: restore it for the next run."""
    saved = copy.deepcopy(model.generation_config)
    try:
        yield
    finally:
        model.generation_config = saved


def _overrides(model) -> dict:
    # On CUDA, generate() auto-compiles the forward for a static cache (with our hook traced inside);
    # "static" is measured eager and "static+compile" compiles the decode step itself, so turn it off.
    gc = getattr(model, "generation_config", None)
    return {"disable_compile": True} if gc is not None and hasattr(gc, "disable_compile") else {}


def _command(loaded: LoadedModel, plan: ComparePlan, cfg: CompareConfig, max_cache_len: int | None):
    if cfg.compile:
        return None  # `kvinspect run` has no compiled mode: no command would reproduce this run
    cmd = ["kvinspect", "run", "--model", loaded.spec, "--script", "script.json", "--out", "rerun",
           "--device", loaded.device, "--dtype", loaded.dtype]
    if cfg.policy != "reuse":
        cmd += ["--policy", cfg.policy]
    if cfg.cache_impl != "dynamic":
        cmd += ["--cache", cfg.cache_impl]
    if max_cache_len and cfg.uses_static:
        cmd += ["--max-cache-len", str(max_cache_len)]
    if plan.chat_template_name:
        cmd += ["--chat-template", plan.chat_template_name]
    return cmd


def run_once(
    loaded: LoadedModel,
    plan: ComparePlan,
    cfg: CompareConfig,
    script: ChatScript,
    out_dir: Path,
    rel_dir: str,
    *,
    kind: str,
    repeat: int,
    max_cache_len: int | None,
    should_stop: CancelCheck,
    on_turn: Callable[[TurnRecord], None] | None = None,
    length: int | None = None,
) -> RunMetrics:
    """Run ``script`` once under ``cfg`` into ``out_dir / rel_dir`` (a normal `kvinspect run` folder)."""
    model = loaded.model
    mem_kind = memory_kind(loaded.device)
    opts = SessionOptions(
        policy=cfg.policy, cache_impl=cfg.cache_impl,
        chat_template=plan.chat_template, chat_template_name=plan.chat_template_name,
        max_cache_len=max_cache_len if cfg.uses_static else None,
        generation_config=_overrides(model),
    )
    run = RunMetrics(config=cfg.name, kind=kind, repeat=repeat, dir=rel_dir, length=length,
                     max_cache_len=max_cache_len if cfg.uses_static else None)
    # One full collection per run (≈0.3 s with transformers loaded): it frees the previous run's cache,
    # which sits in reference cycles (session ↔ observer hook), and gives the memory baseline.
    run.baseline_memory_bytes = memory_now(loaded)
    g0 = compiled_graph_count() if cfg.compile else None
    run.started_at = time.time()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_isolated_generation_config(model))
        if cfg.compile:
            run.recompile_limit_hits = stack.enter_context(quiet_recompiles())
            stack.enter_context(compiled_decode(model, plan.compile_mode or default_compile_mode(loaded.device)))
        res = run_script(loaded, script, out_dir / rel_dir, opts, command=_command(loaded, plan, cfg, max_cache_len),
                         on_turn=on_turn, should_stop=should_stop)
    run.wall_s = time.perf_counter() - t0
    if g0 is not None and g0 >= 0:
        run.compiled_graphs = compiled_graph_count() - g0
    run.turns = [turn_metrics(t, res.record, mem_kind) for t in res.record.turns]
    return run


def turn_message(cfg: str, label: str, t: TurnRecord, n_turns: int | None = None) -> str:
    of = f"/{n_turns}" if n_turns else ""
    head = f"{cfg} {label} turn {t.index + 1}{of}"
    if t.status == "failed":
        return f"{head}: failed: {t.error}"
    ttft = "-" if t.ttft_s is None else f"{t.ttft_s:.3f}"
    return (f"{head}: {t.status}, prompt {t.prompt_tokens}, prefill {t.prefill_tokens}, TTFT {ttft} s, "
            f"total {t.total_s:.3f} s")


# -- the whole comparison ----------------------------------------------------------------------------
def plan_units(plan: ComparePlan, active: list[ConfigResult]) -> int:
    n = 0
    for cr in active:
        if plan.conversation:
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
    """Run ``plan`` with ``loaded``; traces go to ``out_dir/runs/``. Write the report with compare_report.

    ``on_run(result)`` is called (on this thread) after every finished run with the result so far:
    a window can call ``compare_report.build_report(result)`` there and hand the dict to its UI.
    A cancel (``cancel()`` returning True) ends the turn in progress at its next token; the
    result then holds every finished turn and ``cancelled`` is True. Configurations that cannot
    run here are returned as skipped with their reason; nothing here raises for them.
    """
    from .compare_lengths import run_lengths
    from .compare_stress import run_stress

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
    result.cancelled = bool(stop())
    result.wall_s = time.perf_counter() - t_start
    if progress and not result.cancelled and tick.done < tick.total:
        progress(tick.total, tick.total, "done")  # units of skipped work (failed warm-ups, skipped lengths)
    return result


def _run_conversation(loaded, plan: ComparePlan, active: list[ConfigResult], out: Path, tick: _Ticker, stop) -> None:
    script = plan.script
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
