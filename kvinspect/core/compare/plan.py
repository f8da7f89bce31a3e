"""What a comparison runs and what comes back: the plan, one run's figures, per-configuration results.

Plain data shared by :mod:`.run` (the whole comparison), :mod:`.once` (one run of one
configuration), :mod:`.stress`, :mod:`.lengths`, :mod:`.summary` and :mod:`.report`; it
imports none of them, so no module of this package imports another in a cycle.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvinspect.core.compare.configs import CompareConfig, parse_config, parse_configs
from kvinspect.core.errors import ScriptError
from kvinspect.core.session.script import ChatScript, GenerationSettings

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
    baseline: str | None = None  # replies are compared with this configuration's (default: the first)

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
        if self.baseline is not None and self.baseline not in {c.name for c in self.configs}:
            names = ", ".join(c.name for c in self.configs)
            raise ScriptError(f"--baseline {self.baseline!r} is not one of the configurations compared ({names})")
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
            "baseline": self.baseline,
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
    #: the run's engine child died: ``{message, code, signal}`` (its finished turns are kept)
    engine_exit: dict | None = None

    @property
    def status(self) -> str:
        sts = {t["status"] for t in self.turns}
        if "failed" in sts or self.engine_exit:
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
            "engine_exit": self.engine_exit, "turns": self.turns,
        }

    @classmethod
    def from_dict(cls, d: dict) -> RunMetrics:
        """The inverse of :meth:`to_dict` (``status`` is derived, not read)."""
        return cls(
            config=str(d["config"]), kind=str(d.get("kind") or "conversation"), repeat=int(d.get("repeat") or 1),
            dir=str(d.get("dir") or ""), turns=list(d.get("turns") or []),
            baseline_memory_bytes=int(d.get("baseline_memory_bytes") or 0), wall_s=float(d.get("wall_s") or 0.0),
            compiled_graphs=d.get("compiled_graphs"), length=d.get("length"), max_cache_len=d.get("max_cache_len"),
            started_at=float(d.get("started_at") or 0.0),
            recompile_limit_hits=list(d.get("recompile_limit_hits") or []), engine_exit=d.get("engine_exit"),
        )


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
    #: the environment (an engine's Python) it ran in, when a comparison has several
    env: str | None = None

    @property
    def name(self) -> str:
        """Unique within a comparison: ``dynamic``, or ``dynamic@tf456`` when environments are compared."""
        return f"{self.config.name}@{self.env}" if self.env else self.config.name

    @property
    def active(self) -> bool:
        return self.status == "ran"

    @classmethod
    def from_dict(cls, d: dict, stress: dict | None = None, lengths: dict | None = None) -> ConfigResult:
        """One ``configs[]`` entry of compare.json (plus its ``stress.configs[]`` and ``lengths.configs[]``
        entries) back as a result: the figures are recomputed from the runs, exactly as they were built."""
        cfg = parse_config(str(d.get("config") or d["name"]))
        st = None
        if stress is not None:
            st = {k: v for k, v in stress.items() if k != "name"}
        return cls(
            config=cfg, status=str(d.get("status") or "ran"), reason=d.get("reason"),
            max_cache_len=d.get("max_cache_len"), runs=[RunMetrics.from_dict(r) for r in d.get("runs") or []],
            warmups=[RunMetrics.from_dict(r) for r in d.get("warmup_runs") or []], stress=st,
            lengths=[RunMetrics.from_dict(r) for r in (lengths or {}).get("runs") or []],
            length_warmups=[RunMetrics.from_dict(r) for r in (lengths or {}).get("warmup_runs") or []],
            env=d.get("env"),
        )


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
    #: the engines the configurations ran in: ``{name, python, host, kvinspect, transformers, torch, device, …}``
    environments: list[dict] = field(default_factory=list)
    #: where two environments' (or two configurations') traces part (:mod:`.trace_diff`), filled by the caller
    diffs: list[dict] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict, out_dir, plan: ComparePlan | None = None) -> CompareResult:
        """A compare.json document (or an engine's reply holding one) back as a result.

        ``plan`` is the plan that ran (the document keeps its settings, not the script's every field);
        without one it is rebuilt from the document's ``plan`` and ``script``.
        """
        if plan is None:
            plan = _plan_from_doc(d)
        stress = {c["name"]: c for c in ((d.get("stress") or {}).get("configs") or [])}
        lengths = {c["name"]: c for c in ((d.get("lengths") or {}).get("configs") or [])}
        lens = d.get("lengths") or {}
        return cls(
            plan=plan, out_dir=Path(out_dir), model=dict(d.get("model") or {}), device=str(d.get("device") or ""),
            memory_kind=str(d.get("memory_kind") or "rss"),
            configs=[ConfigResult.from_dict(c, stress.get(c["name"]), lengths.get(c["name"]))
                     for c in d.get("configs") or []],
            created=str(d.get("created") or ""), wall_s=float(d.get("wall_s") or 0.0),
            cancelled=bool(d.get("cancelled")), notes=list(d.get("notes") or []),
            lengths_skipped=list(lens.get("skipped") or []),
            length_prompts={int(k): int(v) for k, v in (lens.get("prompt_tokens") or {}).items()},
            environments=list(d.get("environments") or []), diffs=list(d.get("diff") or []),
        )

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


def _plan_from_doc(d: dict) -> ComparePlan:
    p = d.get("plan") or {}
    sc = d.get("script")
    settings = GenerationSettings(**{k: v for k, v in (p.get("settings") or {}).items()
                                     if k in GenerationSettings.__dataclass_fields__})
    script = None if sc is None else ChatScript(turns=list(sc.get("turns") or []), system=sc.get("system"),
                                                settings=settings)
    return ComparePlan(
        configs=parse_configs(",".join(p.get("configs") or [])), script=script, repeat=int(p.get("repeat") or 1),
        warmup=int(p.get("warmup") or 0), conversation=bool(p.get("conversation", True)),
        turns_until_failure=p.get("turns_until_failure"), prompt_lengths=list(p.get("prompt_lengths") or []),
        max_cache_len=p.get("max_cache_len"), chat_template_name=p.get("chat_template"),
        compile_mode=p.get("compile_mode"), script_name=p.get("script"), command=d.get("command"),
        baseline=p.get("baseline"),
    )
