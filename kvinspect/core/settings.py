"""The window's remembered choices: one typed, Qt-free settings object stored as JSON.

Stored in ``config_dir()/settings.json`` (``KVINSPECT_CONFIG_DIR`` moves it; tests never
touch the real one). Loading is tolerant: a missing or damaged file gives the defaults, and
a key that is unknown or of the wrong type is dropped with a warning, so an old or
hand-edited file never stops the window from opening. Window geometry is plain data here
(numbers and a base64 string), not QSettings, so the core can read and test it without Qt.

``KVINSPECT_THEME`` (``system``/``dark``/``light``) overrides the stored theme for one run. ``system``
(the default) follows the desktop's colour scheme; the GUI resolves it (``gui/base/theme.py``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kvinspect.core.paths import config_dir

log = logging.getLogger(__name__)

SETTINGS_VERSION = 1
FILE_NAME = "settings.json"
THEMES = ("system", "dark", "light")
#: The traces File → Open recent lists, newest first.
RECENT_TRACES_MAX = 10
RUN_ON = ("local", "ssh")
#: Keys that earlier files may hold but that mean nothing any more: read without a warning and
#: never written again. ``top_k`` and ``recent_models`` (until 0.1): the window had no control for
#: either (it samples with the default top_k, and the picker shows the last model only).
RETIRED_KEYS = frozenset({"top_k", "recent_models"})


@dataclass
class WindowGeometry:
    """Normal (not maximised) geometry in screen pixels, plus the dock layout as base64."""

    x: int | None = None
    y: int | None = None
    width: int = 1400
    height: int = 860
    maximized: bool = False
    state: str = ""  # QMainWindow.saveState(), base64: docks and toolbars


@dataclass
class Settings:
    """Everything the window remembers between runs. Field names are the JSON keys."""

    version: int = SETTINGS_VERSION
    theme: str = "system"  # follow the desktop's light/dark scheme; "dark"/"light" pin one
    # model picker
    model: str = ""  # last model spec loaded successfully: the picker's preset
    device: str = "auto"
    dtype: str = "auto"
    run_on: str = "local"  # where the engine runs: "local" (this machine) or "ssh" (ssh_host)
    ssh_host: str = ""  # an ssh destination (user@host, an ssh config alias)
    ssh_python: str = ""  # the host's python with kvinspect ("": python3)
    # trust_remote_code is deliberately not remembered: it must be a fresh decision every time.
    # chat and cache
    policy: str = "reuse"
    cache_impl: str = "dynamic"
    system_prompt: str = ""
    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    picked_layers: list[int] = field(default_factory=list)
    recent_traces: list[str] = field(default_factory=list)  # absolute paths, newest first (File → Open recent)
    window: WindowGeometry = field(default_factory=WindowGeometry)

    def remember_model(self, spec: str) -> None:
        """Make ``spec`` the last model (the one the picker offers first next time)."""
        spec = spec.strip()
        if spec:
            self.model = spec

    def remember_trace(self, path: str | os.PathLike) -> None:
        """Put ``path`` first in :attr:`recent_traces` (once; the oldest beyond :data:`RECENT_TRACES_MAX` go)."""
        p = os.path.abspath(os.fspath(path))
        self.recent_traces = [p, *(q for q in self.recent_traces if q != p)][:RECENT_TRACES_MAX]

    def forget_trace(self, path: str | os.PathLike) -> None:
        p = os.path.abspath(os.fspath(path))
        self.recent_traces = [q for q in self.recent_traces if q != p]

    def to_dict(self) -> dict:
        return asdict(self)


def settings_path() -> Path:
    return config_dir() / FILE_NAME


def _check(value, tp):
    """``value`` converted to the field type ``tp`` (resolved by ``typing.get_type_hints``), or raise TypeError.

    Knows the types the dataclasses above use: bool, int, float, str, None, ``X | Y`` and ``list[X]``.
    """
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        for option in typing.get_args(tp):
            try:
                return _check(value, option)
            except TypeError:
                continue
    elif origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, list):
            try:
                return [_check(v, item) for v in value]
            except TypeError:
                pass
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"no check for the type {tp!r}")  # a field type added above without a case here
    name = tp.__name__ if origin is None and hasattr(tp, "__name__") else str(tp)
    raise TypeError(f"expected {name}, got {type(value).__name__}")


def _fill(obj, data: dict, where: str, problems: list[str]) -> None:
    known = {f.name: f for f in fields(obj)}
    hints = typing.get_type_hints(type(obj))
    for key, value in data.items():
        f = known.get(key)
        if f is None and not where and key in RETIRED_KEYS:
            continue  # an older file's key: it meant nothing, so it goes without a warning
        if f is None:
            problems.append(f"{where}{key}: unknown key, dropped")
            continue
        current = getattr(obj, key)
        if isinstance(current, WindowGeometry):
            if isinstance(value, dict):
                _fill(current, value, f"{where}{key}.", problems)
            else:
                problems.append(f"{where}{key}: expected an object, dropped")
            continue
        try:
            setattr(obj, key, _check(value, hints[key]))
        except TypeError as exc:
            problems.append(f"{where}{key}: {exc}, dropped")


def _sanitise(s: Settings, problems: list[str]) -> None:
    if s.theme not in THEMES:
        problems.append(f"theme: {s.theme!r} is not one of {', '.join(THEMES)}, following the system")
        s.theme = "system"
    if s.run_on not in RUN_ON:
        problems.append(f"run_on: {s.run_on!r} is not one of {', '.join(RUN_ON)}, using local")
        s.run_on = "local"
    if not 1 <= s.max_new_tokens <= 1_000_000:
        problems.append(f"max_new_tokens: {s.max_new_tokens} out of range, using 64")
        s.max_new_tokens = 64
    for name in ("temperature", "top_p"):
        if getattr(s, name) <= 0:
            problems.append(f"{name}: must be positive, using 1.0")
            setattr(s, name, 1.0)
    s.top_p = min(s.top_p, 1.0)
    s.picked_layers = sorted({i for i in s.picked_layers if i >= 0})[:8]
    s.recent_traces = list(dict.fromkeys(q for q in s.recent_traces if q))[:RECENT_TRACES_MAX]  # once each
    s.window.width = max(int(s.window.width), 640)
    s.window.height = max(int(s.window.height), 480)
    s.version = SETTINGS_VERSION


def load_settings(path: str | os.PathLike | None = None) -> Settings:
    """Read the settings file; never raises. Problems are logged as warnings and skipped."""
    p = Path(path) if path is not None else settings_path()
    s = Settings()
    problems: list[str] = []
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("settings: cannot read %s (%s); using defaults", p, exc)
        text = None
    if text is not None:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            log.warning("settings: %s is not valid JSON (line %d: %s); using defaults", p, exc.lineno, exc.msg)
            data = {}
        if not isinstance(data, dict):
            log.warning("settings: %s is not a JSON object; using defaults", p)
            data = {}
        version = data.get("version", SETTINGS_VERSION)
        if isinstance(version, int) and version > SETTINGS_VERSION:
            log.warning("settings: %s has version %d (this kvinspect writes %d); reading the keys it knows",
                        p, version, SETTINGS_VERSION)
        _fill(s, data, "", problems)
    env_theme = os.environ.get("KVINSPECT_THEME", "").strip().lower()
    if env_theme:
        s.theme = env_theme
    _sanitise(s, problems)
    for problem in problems:
        log.warning("settings: %s (%s)", problem, p)
    return s


def save_settings(s: Settings, path: str | os.PathLike | None = None) -> Path | None:
    """Write atomically (a crash mid-write keeps the old file). Returns None if it could not write."""
    p = Path(path) if path is not None else settings_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".settings-", suffix=".json", dir=p.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(s.to_dict(), f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, p)
    except OSError as exc:
        log.warning("settings: cannot write %s (%s)", p, exc)
        return None
    return p
