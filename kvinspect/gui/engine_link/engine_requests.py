"""What the window asks the engine for (load, turn, compare) and what it gets back about a model."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoadRequest:
    spec: str
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    host: str | None = None  # None: the engine runs on this machine; else over ssh on this host
    python: str | None = None  # the host's python with kvinspect (None: python3)


@dataclass
class TurnRequest:
    text: str
    policy: str = "reuse"
    cache_impl: str = "dynamic"
    settings: object = None  # GenerationSettings
    system: str | None = None
    images: list[str] = field(default_factory=list)  # picture files sent with the message


@dataclass
class CompareRequest:
    """A comparison for the loaded model (Tools → Compare configurations…)."""

    plan: object  # core.compare.run.ComparePlan
    out_dir: str
    #: environments to compare in, ``{name, python, host}`` each (empty: the loaded model's engine alone)
    envs: list = field(default_factory=list)


@dataclass
class ModelInfo:
    """What the window shows about a loaded model: plain data sent by the engine, plus this window's record."""

    spec: str
    name: str
    cls: str
    device: str
    dtype: str
    n_layers: int
    load_seconds: float
    notes: list[str] = field(default_factory=list)
    trace_path: str | None = None  # this window's autosave of the session
    record: object = None  # this window's TraceRecord, decoded from the engine's stream
    engine_pid: int | None = None
