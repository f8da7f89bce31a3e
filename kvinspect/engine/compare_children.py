"""A comparison whose every configuration runs in its own engine child, in one or several environments.

``kvinspect compare`` (and the window's Compare, through its engine) call
:func:`run_compare_in_engines`. Each (environment, configuration) pair gets its own ``kvinspect
engine`` child, which loads the model once and then runs that configuration's runs one at a time
(``compare_run``); this process decides the order, so the repeats stay interleaved and rotated as in
:func:`kvinspect.core.compare.run.run_compare`, and assembles the runs it gets back into the same
:class:`~kvinspect.core.compare.plan.CompareResult`. A child that dies (a segfault, the out-of-memory
killer, ``kill -9``) fails the run it was in, with its exit status or signal, and nothing else: the
other configurations go on, and that configuration's next run starts a fresh engine.

An environment is another Python (``NAME=PYTHON``: another transformers version) or another machine
(``NAME=ssh:HOST:PYTHON``). Every environment runs the same script under the same configurations;
the report gets an environment column, each engine's versions, and where their traces part
(:mod:`kvinspect.core.compare.trace_diff`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvinspect.core import env as core_env
from kvinspect.core.compare.once import rotated
from kvinspect.core.compare.plan import RUNS_DIR, ComparePlan, CompareResult, ConfigResult, RunMetrics
from kvinspect.core.compare.run import plan_units
from kvinspect.core.compare.trace_diff import comparison_diffs
from kvinspect.core.errors import ScriptError
from kvinspect.core.text_safety import terminal_text
from kvinspect.engine import protocol as P
from kvinspect.engine.client import EngineChild, EngineDied, EngineRefused
from kvinspect.engine.launch import check_ssh_host, engine_command

log = logging.getLogger(__name__)

#: compare.json's failure kind of a turn whose engine died under it.
ENGINE_DIED = "engine-died"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


@dataclass(frozen=True)
class Environment:
    """Where a set of engines runs: ``python`` (None: this interpreter) on ``host`` (None: this machine)."""

    name: str
    python: str | None = None
    host: str | None = None

    def command(self) -> list[str]:
        return engine_command(self.host, self.python)

    def to_dict(self) -> dict:
        return {"name": self.name, "python": self.python, "host": self.host}


def parse_env(text: str) -> Environment:
    """``NAME=PYTHON`` or ``NAME=ssh:HOST:PYTHON`` (one line, exit 2, for anything else)."""
    name, sep, where = text.partition("=")
    name = name.strip()
    if not sep or not where.strip():
        raise ScriptError(f"--env takes NAME=PYTHON or NAME=ssh:HOST:PYTHON, got {terminal_text(text[:80])!r}")
    if not _NAME_RE.fullmatch(name):
        raise ScriptError(f"--env name {terminal_text(name[:80])!r}: use letters, digits, '.', '_' or '-' (it names "
                          "folders and report columns), at most 40 characters")
    where = where.strip()
    if where.startswith("ssh:"):
        host, sep2, python = where[4:].partition(":")
        if not sep2 or not python.strip():
            raise ScriptError(f"--env {name}=ssh:HOST:PYTHON needs the remote Python after the host, got "
                              f"{terminal_text(where[:80])!r}")
        return Environment(name, python.strip(), check_ssh_host(host))
    return Environment(name, where, None)


def parse_envs(items: list[str] | None) -> list[Environment]:
    envs = [parse_env(t) for t in items or []]
    seen: set[str] = set()
    for e in envs:
        if e.name in seen:
            raise ScriptError(f"--env {e.name} is given twice; give each environment its own name")
        seen.add(e.name)
    return envs


@dataclass
class ModelArgs:
    """What every engine loads: the same model, device and dtype in each environment."""

    spec: str
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    command: list[str] | None = None


class _Ticker:
    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, message: str, units: int = 1) -> None:
        self.done = min(self.total, self.done + units)
        if self.progress:
            self.progress(self.done, self.total, message)


class _Engines:
    """One engine per (environment, configuration); a dead one is replaced by a fresh one on next use."""

    def __init__(self, model: ModelArgs, plan: ComparePlan, cancel: Callable[[], bool], on_engine=None):
        self.model, self.plan, self.cancel, self.on_engine = model, plan, cancel, on_engine
        self.by_key: dict[tuple[str, str], EngineChild] = {}
        self.spare: dict[str, EngineChild] = {}  # an environment's setup engine, kept for its first configuration
        self.started = 0

    def start(self, env: Environment, label: str) -> EngineChild:
        child = EngineChild(env.command(), name=label)
        child.start()
        self.started += 1
        child.request(P.LOAD, on_line=self._cancel_line(child), spec=self.model.spec, device=self.model.device,
                      dtype=self.model.dtype, trust_remote_code=self.model.trust_remote_code,
                      command=self.model.command)
        return child

    def _cancel_line(self, child: EngineChild):
        sent = []

        def on_line(obj: dict) -> None:
            if not sent and self.cancel():
                sent.append(True)
                child.signal(P.CANCEL)
        return on_line

    def get(self, env: Environment, cr: ConfigResult) -> EngineChild:
        key = (env.name, cr.config.name)
        child = self.by_key.get(key)
        if child is not None and child.alive():
            return child
        child = self.spare.pop(env.name, None) or self.start(env, cr.name)
        self.by_key[key] = child
        if self.on_engine is not None:
            self.on_engine(cr.name, child.pid)
        return child

    def drop(self, env: Environment, cr: ConfigResult) -> None:
        child = self.by_key.pop((env.name, cr.config.name), None)
        if child is not None:
            child.kill()

    def kill(self) -> None:
        for child in [*self.by_key.values(), *self.spare.values()]:
            child.kill()

    def close(self) -> None:
        for child in [*self.by_key.values(), *self.spare.values()]:
            try:
                child.close()
            except Exception:  # noqa: BLE001 - closing the rest matters more
                log.exception("closing an engine failed")
                child.kill()
        self.by_key.clear()
        self.spare.clear()


def run_compare_in_engines(
    model: ModelArgs,
    plan: ComparePlan,
    out_dir,
    *,
    envs: list[Environment] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_run: Callable[[CompareResult], None] | None = None,
    on_engine: Callable[[str, int | None], None] | None = None,
) -> CompareResult:
    """Run ``plan`` with every configuration in its own engine child; write the report with :mod:`.report`.

    ``envs`` empty: one environment, this Python, and the configurations keep their plain names. With
    environments, each configuration is named ``CONFIG@ENV`` and its runs go to ``runs/ENV/``.
    ``on_engine(configuration, pid)`` is called whenever a configuration is given an engine (a fresh
    one after a death included). ``progress``, ``cancel`` and ``on_run`` are as for ``run_compare``.
    """
    plan.validate()
    out = Path(out_dir)
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    stop = cancel or (lambda: False)
    named = bool(envs)
    envs = list(envs or [Environment("")])
    t_start = time.perf_counter()
    engines = _Engines(model, plan, stop, on_engine)
    wire = P.plan_to_wire(plan)
    try:
        result = _setup(engines, envs, named, plan, out, wire)
        by_env = {e.name: e for e in envs}
        active = [c for c in result.configs if c.active]
        tick = _Ticker(progress, plan_units(plan, active))

        def report_run() -> None:
            if on_run is not None:
                on_run(result)

        if plan.conversation and active:
            _conversation(engines, by_env, plan, wire, active, out, tick, stop, report_run)
        if (plan.turns_until_failure or plan.prompt_lengths) and not stop():
            _sections(engines, by_env, plan, result, [c for c in active if c.active], out, tick, stop)
        result.diffs = comparison_diffs(result)
    except BaseException:
        engines.kill()  # a second Ctrl-C, a bug: nothing is waited for
        raise
    finally:
        engines.close()
    result.cancelled = bool(stop())
    result.wall_s = time.perf_counter() - t_start
    if progress and not result.cancelled and tick.done < tick.total:
        progress(tick.total, tick.total, "done")
    return result


def _setup(engines: _Engines, envs: list[Environment], named: bool, plan: ComparePlan, out: Path,
           wire: dict) -> CompareResult:
    """Start one engine per environment: its versions, the model's facts, what can run there."""
    result: CompareResult | None = None
    rows: list[ConfigResult] = []
    environments = []
    for env in envs:
        label = env.name or "engine"
        try:
            child = engines.start(env, label)
            ready = child.request(P.COMPARE_SETUP, plan=wire)
        except (EngineDied, EngineRefused) as exc:
            if not named:
                raise
            # The other environments still run: this one's configurations are failed, with why.
            why = f"the {env.name} engine could not set up {engines.model.spec}: {exc}"
            if "unknown request" in str(exc):
                why += " (an older kvinspect there: install the same kvinspect version in every environment)"
            environments.append({**env.to_dict(), "error": str(exc)})
            for cfg in plan.configs:
                rows.append(ConfigResult(cfg, status="failed", reason=why, env=env.name))
            continue
        engines.spare[env.name] = child
        hello = child.hello or {}
        ver = ready.get("versions") or hello.get("versions") or {}
        environments.append({
            **env.to_dict(), "kvinspect": hello.get("kvinspect"), "transformers": ver.get("transformers"),
            "torch": ver.get("torch"), "python_version": ver.get("python"), "device": ready.get("device"),
            "executable": ready.get("executable"), "host_name": ready.get("host"), "pid": ready.get("pid"),
            "versions": ver, "machine": ready.get("machine"),
        })
        if result is None:
            result = CompareResult(plan=plan, out_dir=out, model=ready.get("model") or {},
                                   device=str(ready.get("device") or ""),
                                   memory_kind=str(ready.get("memory_kind") or "rss"), configs=[],
                                   created=core_env.now_iso())
            if ready.get("cache_implementation"):
                result.notes.append(
                    f"the checkpoint's generation_config sets cache_implementation="
                    f"{ready['cache_implementation']!r}; it was cleared for every run so each configuration uses "
                    "the cache it names")
        avail = {c["name"]: c for c in ready.get("configs") or []}
        for cfg in plan.configs:
            a = avail.get(cfg.name) or {}
            cr = ConfigResult(cfg, env=env.name if named else None, reason=a.get("reason"),
                              max_cache_len=a.get("max_cache_len"))
            if cr.reason:
                cr.status = "skipped"
            rows.append(cr)
    if result is None:
        raise ScriptError("no environment could load the model: "
                          + "; ".join(f"{e['name']}: {e.get('error')}" for e in environments))
    result.configs = rows
    result.environments = environments if named else []
    if named:
        result.notes.append("each environment's configurations ran in their own engine children; the "
                            "environment column says where")
    return result


def _rel(cr: ConfigResult, tail: str) -> str:
    return f"{RUNS_DIR}/{cr.env}/{cr.config.slug}-{tail}" if cr.env else f"{RUNS_DIR}/{cr.config.slug}-{tail}"


def _env_of(by_env: dict, cr: ConfigResult) -> Environment:
    return by_env[cr.env or ""]


def _conversation(engines, by_env, plan: ComparePlan, wire: dict, active: list[ConfigResult], out: Path,
                  tick: _Ticker, stop, report_run) -> None:
    assert plan.script is not None, "validate() refuses a conversation without a script"
    n = len(plan.script.turns)

    def one(cr: ConfigResult, kind: str, k: int, rel: str) -> RunMetrics:
        env = _env_of(by_env, cr)
        done = [0]

        def on_line(obj: dict) -> None:
            if obj.get("type") == P.COMPARE_PROGRESS:
                done[0] += 1
                tick(str(obj.get("message") or ""))
            cancel_line(obj)

        started = time.time()
        try:
            child = engines.get(env, cr)
            cancel_line = engines._cancel_line(child)
            reply = child.request(P.COMPARE_RUN, on_line=on_line, plan=wire, out_dir=str(out), config=cr.config.name,
                                  kind=kind, repeat=k, dir=rel, max_cache_len=cr.max_cache_len, label=cr.name)
            run = RunMetrics.from_dict(reply["run"])
            run.config = cr.name
        except EngineDied as died:
            engines.drop(env, cr)  # the next run of this configuration starts a fresh engine
            run = _died_run(cr, kind, k, rel, out, died, started)
            tick(f"{cr.name}: the engine died: {died}", max(0, n - done[0]))
        except EngineRefused as exc:
            engines.drop(env, cr)
            run = _died_run(cr, kind, k, rel, out, exc, started)
            tick(f"{cr.name}: {exc}", max(0, n - done[0]))
        return run

    rounds = max((plan.warmups_for(c.config) for c in active), default=0)
    for w in range(rounds):
        for cr in rotated(active, w):
            if w >= plan.warmups_for(cr.config) or stop():
                continue
            run = one(cr, "warmup", w + 1, _rel(cr, f"warmup{w + 1}"))
            cr.warmups.append(run)
            report_run()
            if run.turns and all(t["status"] == "failed" for t in run.turns):
                cr.status, cr.reason = "failed", f"every warm-up turn failed: {run.turns[0]['error']}"
                tick(f"{cr.name}: skipped after its warm-up failed",
                     (plan.repeat + plan.warmups_for(cr.config) - w - 1) * n)
    for r in range(plan.repeat):
        for cr in rotated([c for c in active if c.active], r):
            if stop():
                return
            cr.runs.append(one(cr, "conversation", r + 1, _rel(cr, f"r{r + 1}")))
            report_run()
    for cr in active:
        if cr.runs and all(run.engine_exit for run in cr.runs):
            cr.status, cr.reason = "failed", f"its engine died in every run: {cr.runs[-1].engine_exit['message']}"


def _died_run(cr: ConfigResult, kind: str, k: int, rel: str, out: Path, exc, started: float) -> RunMetrics:
    """The run an engine died in: the turns its trace kept, then the turn it died in, failed with why."""
    from kvinspect.core.compare.metrics import memory_kind, turn_metrics
    from kvinspect.core.trace.tracefile import read_trace

    info = exc.to_dict() if isinstance(exc, EngineDied) else {"message": str(exc), "code": None, "signal": None}
    run = RunMetrics(config=cr.name, kind=kind, repeat=k, dir=rel, started_at=started, engine_exit=info,
                     max_cache_len=cr.max_cache_len if cr.config.uses_static else None)
    turns: list[dict] = []
    try:
        rec = read_trace(out / rel)
    except Exception:  # noqa: BLE001 - no trace (it died before its first turn) or a damaged one: no turns kept
        rec = None
    if rec is not None:
        kind_mem = memory_kind(str(rec.header.get("device") or "cpu"))
        turns = [turn_metrics(t, rec, kind_mem) for t in rec.turns if t.status in ("ok", "stopped", "failed")]
    why = f"the engine died: {info['message']}" if isinstance(exc, EngineDied) else str(exc)
    turns.append({"index": len(turns), "status": "failed", "error": why, "failure_kind": ENGINE_DIED,
                  "prompt_tokens": 0, "reused_tokens": 0, "prefill_tokens": 0, "new_tokens": 0, "ttft_s": None,
                  "total_s": 0.0, "tokens_per_s": None, "prefill_tokens_per_s": None, "kv_bytes": 0,
                  "kv_held_bytes": 0, "peak_kv_bytes": 0, "kv_stored_rows": 0, "kv_capacity_rows": None,
                  "peak_memory_bytes": 0, "cache_id": 0, "cache_class": "", "cache_objects": [], "steps": 0,
                  "reply_ids": None, "reply_pieces": []})
    run.turns = turns
    return run


def _sections(engines, by_env, plan: ComparePlan, result: CompareResult, active: list[ConfigResult], out: Path,
              tick: _Ticker, stop) -> None:
    """Stress and the prompt-length sweep: each configuration's own engine runs its part of the plan."""
    for cr in active:
        if stop():
            return
        env = _env_of(by_env, cr)
        sub = ComparePlan(configs=[cr.config], script=plan.script, repeat=plan.repeat, warmup=plan.warmup,
                          conversation=False, turns_until_failure=plan.turns_until_failure,
                          prompt_lengths=list(plan.prompt_lengths), max_cache_len=plan.max_cache_len,
                          max_new_tokens=plan.max_new_tokens, chat_template=plan.chat_template,
                          chat_template_name=plan.chat_template_name, compile_mode=plan.compile_mode,
                          script_name=plan.script_name, command=plan.command)
        sub_out = out / RUNS_DIR / cr.env if cr.env else out
        prefix = f"{RUNS_DIR}/{cr.env}/" if cr.env else ""

        def on_line(obj: dict, child_box: list) -> None:
            if obj.get("type") == P.COMPARE_PROGRESS:
                tick(str(obj.get("message") or ""))
            if stop() and child_box and not child_box[1:]:
                child_box.append(True)
                child_box[0].signal(P.CANCEL)

        box: list = []
        try:
            child = engines.get(env, cr)
            box.append(child)
            reply = child.request(P.COMPARE, on_line=lambda o: on_line(o, box), plan=P.plan_to_wire(sub),
                                  out_dir=str(sub_out))
        except (EngineDied, EngineRefused) as exc:
            engines.drop(env, cr)
            if plan.turns_until_failure:
                cr.stress = {"status": "failed", "max_turns": plan.turns_until_failure, "failed_at_turn": None,
                             "failure_kind": ENGINE_DIED, "reason": f"the engine died: {exc}",
                             "prompt_tokens_at_failure": None, "tokens_at_failure": None, "cache_rows_needed": None,
                             "turns_completed": None, "tokens_completed": None, "max_cache_len": cr.max_cache_len,
                             "max_position_embeddings": result.model.get("max_position_embeddings"), "run": None}
            continue
        doc = reply.get("report") or {}
        for d in [*((doc.get("stress") or {}).get("configs") or []), *((doc.get("lengths") or {}).get("configs") or [])]:
            for run in [d.get("run")] + list(d.get("runs") or []) + list(d.get("warmup_runs") or []):
                if isinstance(run, dict):
                    run["dir"] = prefix + str(run.get("dir") or "")
                    run["config"] = cr.name
        back = CompareResult.from_dict(doc, sub_out, sub)
        got = back.configs[0] if back.configs else None
        if got is not None:
            cr.stress, cr.lengths, cr.length_warmups = got.stress, got.lengths, got.length_warmups
        if not result.length_prompts:
            result.length_prompts = dict(back.length_prompts)
            result.lengths_skipped = list(back.lengths_skipped)
