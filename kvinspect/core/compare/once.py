"""One run of one configuration (a normal ``kvinspect run`` trace folder) and the helpers every section shares.

:func:`run_once` is what the conversation repeats (:mod:`.run`), the stress mode
(:mod:`.stress`) and the prompt-length sweep (:mod:`.lengths`) each call per run.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from pathlib import Path

from kvinspect.core import compat
from kvinspect.core.compare.configs import (
    CompareConfig,
    compiled_decode,
    compiled_graph_count,
    default_compile_mode,
    quiet_recompiles,
)
from kvinspect.core.compare.metrics import memory_kind, memory_now, turn_metrics
from kvinspect.core.compare.plan import CancelCheck, ComparePlan, RunMetrics
from kvinspect.core.model.loading import LoadedModel
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript
from kvinspect.core.trace.record import TurnRecord


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
