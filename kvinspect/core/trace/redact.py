"""Redaction: a copy of a record with the conversation replaced by token counts.

Everything a report bundle holds (report.md, summary.json, the trace copy) is built from
the redacted copy, so no path can leak the text: user messages become ``<N prompt tokens>``,
replies ``<N tokens>``, the system prompt a placeholder, and the decoded excerpts that some
event messages quote (a prefix divergence shows the tokens on both sides) are cut out.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable

from kvinspect.core.detect.events import Event
from kvinspect.core.trace.record import STEP_LAYER, STEP_SCALARS, TraceRecord, TurnRecord

REDACTED_SYSTEM = "<system prompt redacted>"
_QUOTED = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
#: Excerpts the detectors put into messages: ``(cached '…' vs prompt '…')``, ``given`` for observed
#: code's ids, optionally with `` after '…'`` (the context both share).
_EXCERPT = re.compile(rf"\s*\(cached {_QUOTED} vs (?:prompt|given) {_QUOTED}(?: after {_QUOTED})?\)")
#: Command-line options whose value is conversation text.
TEXT_OPTIONS = ("--system",)


def user_placeholder(turn: TurnRecord) -> str:
    return f"<{turn.prompt_tokens} prompt tokens>"


def reply_placeholder(turn: TurnRecord) -> str:
    return f"<{turn.new_tokens} tokens>"


def redact_message(message: str, secrets: Iterable[str] = ()) -> str:
    """Cut quoted excerpts and any verbatim conversation text out of an event message."""
    out = _EXCERPT.sub(" (excerpt redacted)", message)
    for s in sorted({s for s in secrets if s and len(s.strip()) >= 8}, key=len, reverse=True):
        out = out.replace(s, "<redacted>")
    return out


def redact_command(argv: list[str] | None) -> list[str] | None:
    """Replace the values of options that carry conversation text."""
    if argv is None:
        return None
    out, skip = [], False
    for a in argv:
        if skip:
            out.append("<redacted>")
            skip = False
        elif a in TEXT_OPTIONS:
            out.append(a)
            skip = True
        elif any(a.startswith(o + "=") for o in TEXT_OPTIONS):
            out.append(a.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(a)
    return out


def redact_record(record: TraceRecord) -> TraceRecord:
    """A deep copy of ``record`` with the conversation text replaced by token counts.

    Parameters
    ----------
    record
        Any record (live or read from a trace); it is not modified.

    Returns
    -------
    TraceRecord
        The same steps, turns, events and notes; ``header["redacted"]`` is True.
    """
    with record.lock:
        header = copy.deepcopy(record.header)
        sess = header.get("session") or {}
        secrets = [t.user for t in record.turns] + [t.reply for t in record.turns]
        if sess.get("system"):
            secrets.append(sess["system"])
            sess["system"] = REDACTED_SYSTEM
        header["command"] = redact_command(header.get("command"))
        header["redacted"] = True
        out = TraceRecord(record.n_layers, header)
        out.set_devices(list(record.devices))
        if record.n_steps:
            out.append_columns({name: record.col(name).copy() for name in (*STEP_SCALARS, *STEP_LAYER)})
        for t in record.turns:
            c = copy.deepcopy(t)
            c.user = user_placeholder(t)
            c.reply = reply_placeholder(t)
            c.error = redact_message(c.error, secrets)
            c.prompt_ids = None
            c.ids = None  # ids and their pieces are the conversation too
            if "images" in c.settings:  # the pictures' file names are the user's; spans and hashes stay
                c.settings["images"] = [f"<image {i + 1}>" for i in range(len(c.settings["images"]))]
            for item in c.checklist:
                item["evidence"] = redact_message(str(item.get("evidence", "")), secrets)
            out.add_turn(c)
        for e in record.events:
            d = copy.deepcopy(e.to_dict())
            d["message"] = redact_message(e.message, secrets)
            out.add_event(Event.from_dict(d))
        out.notes = list(record.notes)
        out.t0 = record.t0
    return out
