"""The engine protocol: message names, the handshake, and the wire form of requests (docs/engine-protocol.md).

One JSON object per line in each direction, UTF-8, no pickle. Every object has a ``type``.
Lines from the engine are either *trace lines* (the trace file's line types, see
:data:`kvinspect.core.trace.messages.TRACE_KINDS`, decoded by the same code that reads a trace
file) or *live lines* (tokens, progress, replies, heartbeats). Requests from the window carry an
``id``; each request gets exactly one terminal reply carrying that ``id``.

This module is light (no Qt, no torch): the window imports it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvinspect.core import json_depth
from kvinspect.core.errors import exc_line
from kvinspect.core.text_safety import LONE_SURROGATE, terminal_text

#: Bumped on any change a peer of the previous version would misread. Both sides refuse a mismatch.
PROTOCOL_VERSION = 2

# -- window -> engine ---------------------------------------------------------------------------------
HELLO = "hello"
LOAD = "load"
FETCH = "fetch"
TURN = "turn"
CONFIGURE = "configure"
NEW_CHAT = "new_chat"
CHECK = "check"
COMPARE = "compare"
COMPARE_SETUP = "compare_setup"  # what a comparison would run here (availability, capacities, model facts)
COMPARE_RUN = "compare_run"  # one run of one configuration (a parent process interleaves the runs)
SHUTDOWN = "shutdown"
STOP = "stop"  # no id: the running turn stops after its current token
CANCEL = "cancel"  # no id: a load/fetch at its next stage, a comparison at its next token
PACE = "pace"  # no id: the window paints every `every_s` while a turn streams; the stream comes at that pace
#: The slowest and fastest pace an engine takes (a pace outside is brought inside).
PACE_RANGE_S = (0.02, 1.0)

#: Requests queued for the engine's request loop (one at a time, in order).
REQUESTS = frozenset({LOAD, FETCH, TURN, CONFIGURE, NEW_CHAT, CHECK, COMPARE, COMPARE_SETUP, COMPARE_RUN, SHUTDOWN})
#: Handled the moment they arrive, even while a request runs.
SIGNALS = frozenset({STOP, CANCEL, PACE})

# -- engine -> window (live lines; the trace lines are those of the trace file) -------------------
HEARTBEAT = "heartbeat"
TOKEN = "token"
PROGRESS = "progress"
ERROR = "error"  # terminal reply: the request failed (one line)
CANCELLED = "cancelled"  # terminal reply: the request was cancelled
LOADED = "loaded"  # terminal reply to load
FETCHED = "fetched"  # terminal reply to fetch
TURN_DONE = "turn_done"  # terminal reply to turn (after its `turn` trace line)
CHECKED = "checked"  # one per configuration name of a check request
COMPARE_PROGRESS = "compare_progress"
COMPARE_UPDATE = "compare_update"  # the compare.json document so far, after every finished run
COMPARED = "compared"  # terminal reply to compare: the compare.json document
COMPARE_READY = "compare_ready"  # terminal reply to compare_setup
RUN_DONE = "run_done"  # terminal reply to compare_run: the run's figures (compare.json's run object)
DONE = "done"  # terminal reply to configure, new_chat, check
BYE = "bye"  # the engine's last line before it exits after a shutdown

TERMINAL = frozenset({ERROR, CANCELLED, LOADED, FETCHED, TURN_DONE, COMPARED, COMPARE_READY, RUN_DONE, DONE, BYE})

#: Seconds between two heartbeats while the engine works (none while it waits for a request: each
#: would wake an idle window); a window waiting for a reply calls an engine silent for much longer
#: "not responding".
HEARTBEAT_S = 1.0

#: Exit status of an engine that refused the window's handshake.
EXIT_HANDSHAKE = 3
#: Exit status of an engine whose protocol stdout broke (closed by the reader, or its writer failed).
EXIT_PIPE = 4


class ProtocolError(Exception):
    """The peer speaks another protocol version, or sent something this side cannot read."""


def engine_hello(kvinspect_version: str, **extra: Any) -> dict:
    """The engine's first line. ``versions`` (transformers, torch, … from package metadata, nothing imported)
    lets a comparison across environments name what each engine runs before it loads anything."""
    from kvinspect.core import env

    return {"type": HELLO, "protocol": PROTOCOL_VERSION, "kvinspect": kvinspect_version,
            "versions": env.versions(), **extra}


def client_hello(kvinspect_version: str, *, local: bool = True) -> dict:
    return {"type": HELLO, "protocol": PROTOCOL_VERSION, "kvinspect": kvinspect_version, "local": bool(local)}


def check_hello(peer: dict, own_version: str, peer_role: str = "engine") -> None:
    """Raise :class:`ProtocolError` naming both versions when ``peer`` (a hello) is not ours."""
    if not isinstance(peer, dict) or peer.get("type") != HELLO:
        raise ProtocolError(f"the {peer_role} did not start with a hello line (not a kvinspect {peer_role}?)")
    theirs = peer.get("protocol")
    if type(theirs) is not int or theirs != PROTOCOL_VERSION:  # "1" and true are not 1
        us = "window" if peer_role == "engine" else "engine"
        got = (f"sent {_describe(theirs)} as its protocol version" if type(theirs) is not int
               else f"speaks engine protocol {theirs}")
        raise ProtocolError(
            f"the {peer_role} {got} (kvinspect {terminal_text(str(peer.get('kvinspect', '?')))[:60]}), this {us} "
            f"speaks protocol {PROTOCOL_VERSION} (kvinspect {own_version}): install the same kvinspect version on "
            f"both sides")


def _short(v: Any, limit: int = 60) -> str:
    """A peer's value quoted in a message: its repr, cut, with controls escaped."""
    r = repr(v)
    return terminal_text(r if len(r) <= limit else r[: limit - 1] + "…")


def _describe(v: Any) -> str:
    """What a peer sent, by type, for a refusal: ``the string '1'``, ``a list of 3``, ``nothing``."""
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, str):
        return f"the string {_short(v)}" if len(v) <= 60 else f"a string of {len(v):,} characters"
    if isinstance(v, (int, float)):
        return f"the number {_short(v)}"
    if isinstance(v, list):
        return f"a list of {len(v):,}"
    if isinstance(v, dict):
        return f"an object of {len(v):,} fields"
    return type(v).__name__


# -- reading and checking a request line ------------------------------------------------------------------

#: A request line no bigger than a chat script (a comparison's plan carries the script's turns).
MAX_LINE_BYTES = 64 << 20
#: JSON nested deeper than this is refused before it is parsed (no request is nested beyond 4).
MAX_DEPTH = 64
#: Short names: a policy, a cache implementation, a device, a dtype, a configuration name, an id.
MAX_NAME_CHARS = 256
MAX_PATH_CHARS = 4096
MAX_ITEMS = 10_000


def parse_line(raw: bytes) -> dict:
    """One request line as a JSON object (checked by :func:`check_request`); :class:`ProtocolError` saying why not."""
    if len(raw) > MAX_LINE_BYTES:
        raise ProtocolError(f"a request line of {len(raw):,} bytes is over the {MAX_LINE_BYTES:,}-byte limit")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"a request line is not UTF-8 (byte {exc.start + 1})") from None
    try:
        obj = json_depth.loads(text, MAX_DEPTH)
    except json_depth.TooDeep:
        raise ProtocolError(f"a request line is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ProtocolError(f"a request line is not JSON ({exc_line(exc)[:120]})") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a request line must be a JSON object, got {_describe(obj)}")
    return obj


def request_id(obj: dict) -> int | str | None:
    """The request's id when it is one a reply can carry (an integer or a short string), else None."""
    rid = obj.get("id")
    if (type(rid) is int and abs(rid) < 2**53) or (isinstance(rid, str) and len(rid) <= MAX_NAME_CHARS
                                                    and rid.isprintable()):
        return rid
    return None


class _Bad(Exception):
    """``path`` and what is wrong with it: ``must be an integer …, got the string 'x'`` unless ``said``."""

    def __init__(self, path: str, what: str = "", got: Any = None, *, said: str | None = None):
        self.path = path
        self.said = said if said is not None else f"must be {what}, got {_describe(got)}"


def _str(limit: int, *, text: bool = False):
    def check(v, path):
        if not isinstance(v, str):
            raise _Bad(path, f"a string of at most {limit:,} characters", v)
        if len(v) > limit:
            why = "; no context window holds that much" if text else ""
            raise _Bad(path, said=f"is {len(v):,} characters{why} (at most {limit:,})")
        bad = LONE_SURROGATE.search(v)
        if bad:
            raise _Bad(path, said=f"holds a lone surrogate ({bad.group()!r} at character {bad.start() + 1}), "
                                  f"which is not text")
    return check



def _int(lo: int, hi: int):
    def check(v, path):
        if type(v) is not int or not lo <= v <= hi:
            raise _Bad(path, f"an integer from {lo:,} to {hi:,}", v)
    return check


def _number(v, path):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(path, "a number", v)


def _seconds(v, path):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
        raise _Bad(path, "a positive number of seconds", v)


def _bool(v, path):
    if not isinstance(v, bool):
        raise _Bad(path, "true or false", v)


def _opt(check):
    def opt(v, path):
        if v is not None:
            check(v, path)
    return opt


def _list(item, limit: int = MAX_ITEMS):
    def check(v, path):
        if not isinstance(v, list):
            raise _Bad(path, f"a list (of at most {limit:,})", v)
        if len(v) > limit:
            raise _Bad(path, said=f"holds {len(v):,} items (at most {limit:,})")
        for i, x in enumerate(v):
            item(x, f"{path}[{i}]")
    return check


def _obj(fields: dict, *, required: tuple[str, ...] = ()):
    """An object whose known fields are checked (unknown ones are ignored, as a newer window may send them)."""
    def check(v, path):
        if not isinstance(v, dict):
            raise _Bad(path, "an object", v)
        for name in required:
            if name not in v:
                raise _Bad(f"{path}.{name}" if path else name, said="is missing")
        for name, sub in fields.items():
            if name in v:
                sub(v[name], f"{path}.{name}" if path else name)
    return check


def _any(v, path):
    return None


def _settings(v, path):
    """Generation settings: the same checks as a chat script's (GenerationSettings.validate)."""
    from kvinspect.core.errors import KvInspectError

    _obj({})(v, path)
    try:
        settings_from_wire(v).validate()
    except (KvInspectError, TypeError) as exc:
        raise _Bad(path, said=f"is not usable: {exc}") from None


def _request_schemas() -> dict:
    from kvinspect.core.model.loading import MAX_SPEC_CHARS
    from kvinspect.core.session.script import MAX_TEXT_CHARS, MAX_TURNS

    name, path = _opt(_str(MAX_NAME_CHARS)), _opt(_str(MAX_PATH_CHARS))
    text = _str(MAX_TEXT_CHARS, text=True)
    argv = _opt(_list(_str(MAX_PATH_CHARS), 1000))
    settings = _opt(_settings)
    session = _opt(_obj({"policy": name, "cache_impl": name, "settings": settings, "system": _opt(text),
                         "chat_template": _opt(text), "chat_template_name": path,
                         "max_cache_len": _opt(_int(1, 2**31)), "generation_config": _opt(_obj({})),
                         "respect_generation_config": _opt(_bool)}))
    configure = {"policy": name, "cache_impl": name, "settings": settings, "system": _opt(text)}
    script = _opt(_obj({"turns": _list(text, MAX_TURNS), "system": _opt(text), "settings": settings},
                       required=("turns",)))
    plan = _obj({"configs": _list(_str(MAX_NAME_CHARS), 1000), "script": script, "repeat": _opt(_int(1, 10_000)),
                 "warmup": _opt(_int(0, 10_000)), "conversation": _opt(_bool),
                 "turns_until_failure": _opt(_int(1, MAX_TURNS)),
                 "prompt_lengths": _opt(_list(_int(1, 2**31), 1000)), "max_cache_len": _opt(_int(1, 2**31)),
                 "max_new_tokens": _opt(_int(1, 1_000_000)), "chat_template": _opt(text),
                 "chat_template_name": path, "compile_mode": name, "script_name": path, "command": argv},
                required=("configs",))
    return {
        HELLO: _obj({"protocol": _any, "kvinspect": _opt(_str(MAX_NAME_CHARS)), "local": _opt(_bool)}),
        LOAD: _obj({"spec": _str(MAX_SPEC_CHARS), "device": name, "dtype": name, "trust_remote_code": _opt(_bool),
                    "session": session, "command": argv}, required=("spec",)),
        FETCH: _obj({"name": name}),
        # images: picture files the engine reads (on its own machine) for a vision-language model's turn
        TURN: _obj({"text": text, "images": _opt(_list(_str(MAX_PATH_CHARS), 64)), **configure}, required=("text",)),
        CONFIGURE: _obj(configure),
        NEW_CHAT: _obj({}), SHUTDOWN: _obj({}), STOP: _obj({}), CANCEL: _obj({}),
        PACE: _obj({"every_s": _seconds}, required=("every_s",)),
        CHECK: _obj({"names": _list(_str(MAX_NAME_CHARS), 1000)}, required=("names",)),
        COMPARE: _obj({"plan": plan, "out_dir": _str(MAX_PATH_CHARS),
                       "envs": _opt(_list(_obj({"name": _str(MAX_NAME_CHARS), "python": path, "host": name},
                                               required=("name",)), 16))},
                      required=("plan", "out_dir")),
        COMPARE_SETUP: _obj({"plan": plan}, required=("plan",)),
        COMPARE_RUN: _obj({"plan": plan, "out_dir": _str(MAX_PATH_CHARS), "config": _str(MAX_NAME_CHARS),
                           "kind": _str(MAX_NAME_CHARS), "repeat": _int(1, 10_000), "dir": _str(MAX_PATH_CHARS),
                           "max_cache_len": _opt(_int(1, 2**31)), "label": name},
                          required=("plan", "out_dir", "config", "kind", "repeat", "dir")),
    }


_SCHEMAS: dict | None = None


def check_request(obj: dict) -> dict:
    """``obj`` (from :func:`parse_line`) checked against its request's schema: types, ranges, lengths.

    The text limits are the CLI's (a turn or system prompt of at most ``MAX_TEXT_CHARS`` characters,
    no lone surrogate). Raises :class:`ProtocolError` naming the request, the field and what came.
    """
    global _SCHEMAS
    if _SCHEMAS is None:
        _SCHEMAS = _request_schemas()
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(f"a request's `type` must be a string, got {_describe(kind)}")
    schema = _SCHEMAS.get(kind)
    if schema is None:
        raise ProtocolError(f"unknown request {_short(kind)} (engine protocol {PROTOCOL_VERSION})")
    if "id" in obj and obj["id"] is not None and request_id(obj) is None:
        raise ProtocolError(f"{kind} request: `id` must be an integer or a short string, got {_describe(obj['id'])}")
    try:
        schema(obj, "")
    except _Bad as bad:
        raise ProtocolError(f"{kind} request: `{bad.path}` {bad.said}") from None
    return obj


# -- wire form of the requests' payloads ----------------------------------------------------------------

def options_to_wire(opts) -> dict | None:
    """A :class:`~kvinspect.core.session.options.SessionOptions` as plain JSON (None stays None)."""
    if opts is None:
        return None
    return dataclasses.asdict(opts)


def options_from_wire(d: dict | None):
    from kvinspect.core.session.options import SessionOptions
    from kvinspect.core.session.script import GenerationSettings

    if not d:
        return SessionOptions()
    known = {f.name for f in dataclasses.fields(SessionOptions)}
    kw = {k: v for k, v in d.items() if k in known}
    kw["settings"] = settings_from_wire(kw.get("settings")) or GenerationSettings()
    kw["generation_config"] = dict(kw.get("generation_config") or {})
    return SessionOptions(**kw)


def settings_to_wire(settings) -> dict | None:
    return None if settings is None else settings.to_dict()


def settings_from_wire(d: dict | None):
    from kvinspect.core.session.script import GenerationSettings

    if d is None:
        return None
    known = {f.name for f in dataclasses.fields(GenerationSettings)}
    return GenerationSettings(**{k: v for k, v in d.items() if k in known})


def plan_to_wire(plan) -> dict:
    """A :class:`~kvinspect.core.compare.run.ComparePlan` as plain JSON (configurations by name)."""
    script = plan.script
    return {
        "configs": [c.name for c in plan.configs],
        "script": None if script is None else {"turns": list(script.turns), "system": script.system,
                                               "settings": script.settings.to_dict()},
        "repeat": plan.repeat, "warmup": plan.warmup, "conversation": plan.conversation,
        "turns_until_failure": plan.turns_until_failure, "prompt_lengths": list(plan.prompt_lengths),
        "max_cache_len": plan.max_cache_len, "max_new_tokens": plan.max_new_tokens,
        "chat_template": plan.chat_template, "chat_template_name": plan.chat_template_name,
        "compile_mode": plan.compile_mode, "script_name": plan.script_name, "command": plan.command,
    }


def plan_from_wire(d: dict):
    from kvinspect.core.compare.configs import parse_configs
    from kvinspect.core.compare.plan import ComparePlan
    from kvinspect.core.session.script import ChatScript, GenerationSettings

    s = d.get("script")
    script = None if s is None else ChatScript(turns=list(s["turns"]), system=s.get("system"),
                                               settings=settings_from_wire(s.get("settings")) or GenerationSettings())
    plan = ComparePlan(
        configs=parse_configs(",".join(d["configs"])), script=script, repeat=d.get("repeat", 3),
        warmup=d.get("warmup", 0), conversation=d.get("conversation", True),
        turns_until_failure=d.get("turns_until_failure"), prompt_lengths=list(d.get("prompt_lengths") or []),
        max_cache_len=d.get("max_cache_len"), max_new_tokens=d.get("max_new_tokens"),
        chat_template=d.get("chat_template"), chat_template_name=d.get("chat_template_name"),
        compile_mode=d.get("compile_mode"), script_name=d.get("script_name"), command=d.get("command"),
    )
    return plan.validate()
