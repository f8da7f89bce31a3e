"""Scripted conversations: the JSON a ``kvinspect run`` replays. See docs/trace-format.md#scripts."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvinspect.core.errors import ScriptError
from kvinspect.core.text_safety import json_dumps_utf8


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class GenerationSettings:
    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 50
    seed: int | None = 0

    def validate(self) -> GenerationSettings:
        # bool is an int to Python, but `"max_new_tokens": true` is a mistake, not 1.
        if not (_is_int(self.max_new_tokens) and 1 <= self.max_new_tokens <= 1_000_000):
            raise ScriptError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not isinstance(self.do_sample, bool):
            raise ScriptError(f"do_sample must be true or false, got {self.do_sample!r}")
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise ScriptError(f"{name} must be a positive number, got {v!r}")
        if self.top_p > 1:
            raise ScriptError(f"top_p must be at most 1, got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ScriptError(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ScriptError(f"seed must be an integer or null, got {self.seed!r}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            # torch.manual_seed takes a signed 64-bit value; outside it every turn would fail.
            raise ScriptError(f"seed must be between 0 and 2**63 - 1, got {self.seed}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ChatScript:
    turns: list[str]
    system: str | None = None
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    #: Per turn, the image files sent with it (absolute paths); empty: a text-only script.
    images: list[list[str]] = field(default_factory=list)

    def images_of(self, turn: int) -> list[str]:
        return list(self.images[turn]) if turn < len(self.images) else []

    def to_dict(self) -> dict:
        d: dict = {}
        if self.system is not None:
            d["system"] = self.system
        d["turns"] = [{"text": t, "images": self.images_of(i)} if self.images_of(i) else t
                      for i, t in enumerate(self.turns)]
        d.update(self.settings.to_dict())
        return d

    def save(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.write_text(json_dumps_utf8(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return p


#: No model kvinspect traces has a context this long (about 250k tokens at four characters a
#: token): a longer message cannot fit, so it is refused before the model loads and before a
#: prompt of millions of tokens is built.
MAX_TEXT_CHARS = 1_000_000
MAX_TURNS = 100_000
MAX_SCRIPT_BYTES = 64 << 20


def check_text(text: str, what: str) -> str:
    """Text that a tokenizer can take: UTF-8-encodable (no lone surrogate) and of a size a context can hold."""
    if len(text) > MAX_TEXT_CHARS:
        raise ScriptError(f"{what} is {len(text):,} characters; no context window holds that much "
                          f"(at most {MAX_TEXT_CHARS:,})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ScriptError(f"{what} holds a lone surrogate ({text[exc.start]!r} at character {exc.start + 1}), "
                          f"which is not text: fix the escape in the JSON") from None
    return text


_SETTING_KEYS = set(GenerationSettings.__dataclass_fields__)
_KEYS = {"system", "turns"} | _SETTING_KEYS | {"comment", "description"}


#: More pictures than one message of any chat carries.
MAX_IMAGES_PER_TURN = 64


def _turn(t, i: int, where: str, base: Path | None) -> tuple[str, list[str]]:
    """A turn: a message, or ``{"text": ..., "images": [paths]}`` (paths relative to the script's folder)."""
    images: list[str] = []
    if isinstance(t, dict):
        extra = sorted(set(t) - {"text", "images"})
        if extra:
            raise ScriptError(f"{where}: turn {i + 1} has unknown key(s) {', '.join(extra)}; allowed: images, text")
        raw = t.get("images", [])
        if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
            raise ScriptError(f"{where}: turn {i + 1}'s \"images\" must be a list of image file paths")
        if len(raw) > MAX_IMAGES_PER_TURN:
            raise ScriptError(f"{where}: turn {i + 1} has {len(raw)} images; a turn takes at most {MAX_IMAGES_PER_TURN}")
        images = [os.path.normpath(base / x) if base is not None and not Path(x).is_absolute() else x for x in raw]
        t = t.get("text")
    if not isinstance(t, str) or not t.strip():
        raise ScriptError(f"{where}: turn {i + 1} must be a non-empty string (or {{\"text\": ..., \"images\": [...]}})")
    check_text(t, f"{where}: turn {i + 1}")
    return t, images


def parse_script(data, where: str = "script", base: Path | None = None) -> ChatScript:
    if not isinstance(data, dict):
        raise ScriptError(f"{where}: expected a JSON object with a \"turns\" list")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ScriptError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
    turns = data.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ScriptError(f"{where}: \"turns\" must be a non-empty list of user messages")
    if len(turns) > MAX_TURNS:
        raise ScriptError(f"{where}: {len(turns):,} turns; a script takes at most {MAX_TURNS:,}")
    parsed = [_turn(t, i, where, base) for i, t in enumerate(turns)]
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise ScriptError(f"{where}: \"system\" must be a string")
    if system is not None:
        check_text(system, f"{where}: \"system\"")
    settings = _settings(data, where)
    images = [im for _, im in parsed] if any(im for _, im in parsed) else []
    return ChatScript(turns=[t for t, _ in parsed], system=system, settings=settings, images=images)


def _settings(data: dict, where: str) -> GenerationSettings:
    s = GenerationSettings(**{k: data[k] for k in _SETTING_KEYS if k in data})
    try:
        return s.validate()
    except ScriptError as exc:
        raise ScriptError(f"{where}: {exc}") from None


def load_script(path: str | os.PathLike) -> ChatScript:
    p = Path(path)
    if p.is_dir():
        raise ScriptError(f"{path} is a folder; --script takes a chat script JSON file")
    if p.exists() and not p.is_file():
        raise ScriptError(f"{path} is not a regular file (a pipe or device); --script takes a chat script JSON file")
    if not p.is_file():
        raise ScriptError(f"script not found: {path}")
    if p.stat().st_size > MAX_SCRIPT_BYTES:
        raise ScriptError(f"{path} is {p.stat().st_size:,} bytes; a chat script takes at most {MAX_SCRIPT_BYTES:,}")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is not an error
    except UnicodeDecodeError:
        raise ScriptError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ScriptError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ScriptError(f"{path}: JSON nested too deeply to be a chat script") from None
    except ValueError as exc:  # an integer of thousands of digits
        raise ScriptError(f"{path}: {exc}") from None
    except _DuplicateKey as exc:
        # JSON itself keeps the last value silently: a script edited by hand would run other settings.
        raise ScriptError(f"{path}: the key {exc.args[0]!r} appears twice") from None
    return parse_script(data, str(path), base=p.resolve().parent)


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out
