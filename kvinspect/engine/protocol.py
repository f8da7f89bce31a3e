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

#: Bumped on any change a peer of the previous version would misread. Both sides refuse a mismatch.
PROTOCOL_VERSION = 1

# -- window -> engine ---------------------------------------------------------------------------------
HELLO = "hello"
LOAD = "load"
FETCH = "fetch"
TURN = "turn"
CONFIGURE = "configure"
NEW_CHAT = "new_chat"
CHECK = "check"
COMPARE = "compare"
SHUTDOWN = "shutdown"
STOP = "stop"  # no id: the running turn stops after its current token
CANCEL = "cancel"  # no id: a load/fetch at its next stage, a comparison at its next token

#: Requests queued for the engine's request loop (one at a time, in order).
REQUESTS = frozenset({LOAD, FETCH, TURN, CONFIGURE, NEW_CHAT, CHECK, COMPARE, SHUTDOWN})
#: Handled the moment they arrive, even while a request runs.
SIGNALS = frozenset({STOP, CANCEL})

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
DONE = "done"  # terminal reply to configure, new_chat, check
BYE = "bye"  # the engine's last line before it exits after a shutdown

TERMINAL = frozenset({ERROR, CANCELLED, LOADED, FETCHED, TURN_DONE, COMPARED, DONE, BYE})

#: Seconds between two heartbeats; the window calls an engine silent for much longer "not responding".
HEARTBEAT_S = 1.0

#: Exit status of an engine that refused the window's handshake.
EXIT_HANDSHAKE = 3


class ProtocolError(Exception):
    """The peer speaks another protocol version, or sent something this side cannot read."""


def engine_hello(kvinspect_version: str, **extra: Any) -> dict:
    return {"type": HELLO, "protocol": PROTOCOL_VERSION, "kvinspect": kvinspect_version, **extra}


def client_hello(kvinspect_version: str, *, local: bool = True) -> dict:
    return {"type": HELLO, "protocol": PROTOCOL_VERSION, "kvinspect": kvinspect_version, "local": bool(local)}


def check_hello(peer: dict, own_version: str, peer_role: str = "engine") -> None:
    """Raise :class:`ProtocolError` naming both versions when ``peer`` (a hello) is not ours."""
    if not isinstance(peer, dict) or peer.get("type") != HELLO:
        raise ProtocolError(f"the {peer_role} did not start with a hello line (not a kvinspect {peer_role}?)")
    theirs = peer.get("protocol")
    if theirs != PROTOCOL_VERSION:
        us = "window" if peer_role == "engine" else "engine"
        raise ProtocolError(
            f"the {peer_role} speaks engine protocol {theirs} (kvinspect {peer.get('kvinspect', '?')}), this {us} "
            f"speaks protocol {PROTOCOL_VERSION} (kvinspect {own_version}): install the same kvinspect version on "
            f"both sides")


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
