"""Headless scripted runs: what ``kvinspect run`` does, callable from any script or test."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvinspect.core.model.loading import LoadedModel
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import ChatScript
from kvinspect.core.trace.record import TraceRecord, TurnRecord
from kvinspect.core.trace.summary import write_summary
from kvinspect.core.trace.tracefile import TRACE_NAME

SCRIPT_NAME = "script.json"
SUMMARY_NAME = "summary.json"


@dataclass
class RunResult:
    out_dir: Path
    record: TraceRecord
    trace: Path
    summary: Path
    script: Path


def options_from_script(script: ChatScript, base: SessionOptions | None = None) -> SessionOptions:
    o = base or SessionOptions()
    o.settings = script.settings
    if script.system is not None:
        o.system = script.system
    return o


def run_script(
    loaded: LoadedModel,
    script: ChatScript,
    out_dir: str | os.PathLike,
    options: SessionOptions | None = None,
    *,
    command: list[str] | None = None,
    on_token: Callable[[str], None] | None = None,
    on_turn_start: Callable[[int, str], None] | None = None,
    on_turn: Callable[[TurnRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RunResult:
    """Run every turn of ``script``; the trace is appended turn by turn (a kill keeps finished turns)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    opts = options_from_script(script, options)
    script_path = script.save(out / SCRIPT_NAME)
    session = ChatSession(loaded, opts, trace_path=out / TRACE_NAME, command=command)
    try:
        for i, text in enumerate(script.turns):
            if should_stop and should_stop():
                break
            if on_turn_start:
                on_turn_start(len(session.record.turns), text)
            # should_stop also reaches generate(): a Cancel ends the turn at the next token.
            turn = session.run_turn(text, on_token=on_token, should_stop=should_stop, images=script.images_of(i))
            if on_turn:
                on_turn(turn)
    finally:
        session.close()
    summary = write_summary(out / SUMMARY_NAME, session.record)
    return RunResult(out, session.record, out / TRACE_NAME, summary, script_path)
