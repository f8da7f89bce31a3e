"""The window's pace: the engine sends its step blocks and tokens as often as the window paints.

A window that paints three times a second reads and decodes three batches a second, not one line
per token; a reply or a turn's line still goes out at once, with what waited before it, and a turn's
first output waits for no pace (a person waits for its first token).
"""

from __future__ import annotations

import io
import json
import threading
import time
from types import SimpleNamespace

from kvinspect import __version__
from kvinspect.core.trace.messages import Token
from kvinspect.engine import protocol as P
from kvinspect.engine.protocol import client_hello
from kvinspect.engine.server import FLUSH_EVERY_S, Engine
from kvinspect.engine.stdio import LineWriter


def _engine():
    out = io.BytesIO()
    return Engine(iter(()), LineWriter(out), heartbeat_s=3600.0), out


def _lines(out: io.BytesIO) -> list[dict]:
    return [json.loads(x) for x in out.getvalue().splitlines()]


def test_a_pace_sets_the_step_blocks_and_the_writers_batches_of_the_open_session_and_the_next():
    engine, out = _engine()
    engine.session = SimpleNamespace(pipeline=SimpleNamespace(flush_every_s=FLUSH_EVERY_S))
    engine._take(b'{"type": "pace", "every_s": 0.3}')
    assert engine.pace_s == 0.3 and engine.out.batch_s == 0.3
    assert engine.session.pipeline.flush_every_s == 0.3  # the open session, from its next block
    engine._take(b'{"type": "pace", "every_s": 50}')  # brought inside the range an engine takes
    assert engine.pace_s == P.PACE_RANGE_S[1] and engine.out.batch_s == P.PACE_RANGE_S[1]
    engine._take(b'{"type": "pace", "every_s": 0}')
    engine._take(b'{"type": "pace", "every_s": "fast"}')
    engine._take(b'{"type": "pace"}')
    engine.out.close()
    errors = [x for x in _lines(out) if x["type"] == "error"]
    assert len(errors) == 3 and all(e["task"] == "pace" and "every_s" in e["message"] for e in errors), errors
    assert engine.pace_s == P.PACE_RANGE_S[1]  # a refused pace changes nothing


def test_the_engine_says_it_takes_a_pace_and_a_session_opened_after_one_keeps_it():
    requests = [client_hello(__version__), {"type": "pace", "every_s": 0.25},
                {"type": "load", "id": 1, "spec": "tiny-llama", "device": "cpu"},
                {"type": "turn", "id": 2, "text": "hi", "settings": {"max_new_tokens": 24}}]
    turned = threading.Event()

    def window():
        yield from ((json.dumps(r) + "\n").encode() for r in requests)
        turned.wait(120)

    out = io.BytesIO()
    engine = Engine(window(), LineWriter(out), heartbeat_s=3600.0)
    paces = []
    do_turn = engine._do_turn

    def turn(req):
        paces.append(engine.session.pipeline.flush_every_s)
        try:
            do_turn(req)
        finally:
            turned.set()

    engine._do_turn = turn
    assert engine.serve() == 0
    lines = _lines(out)
    assert lines[0]["type"] == "hello" and lines[0]["paced"] is True
    assert paces == [0.25]
    kinds = [x["type"] for x in lines]
    assert "turn" in kinds and kinds.index("turn") < kinds.index("turn_done")
    turn_line = next(x for x in lines if x["type"] == "turn")
    assert sum(x["n"] for x in lines if x["type"] == "steps") == turn_line["end_step"] - turn_line["first_step"]


class _Pipe:
    def __init__(self):
        self.writes: list[bytes] = []
        self.wrote = threading.Event()

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.wrote.set()


def test_a_line_that_may_not_wait_ends_a_paced_wait_and_takes_the_waiting_lines_with_it():
    pipe = _Pipe()
    w = LineWriter(pipe, batch_s=3600, gather_s=3600)  # tokens would wait an hour for companions
    w.send(Token(0, "a"))
    w.send(Token(0, "b"))
    w.send({"type": "turn_done", "id": 2, "index": 0, "status": "ok"})
    assert pipe.wrote.wait(60), "a reply waited for the lazy lines' batch"
    w.close()
    assert len(pipe.writes) == 1
    lines = [json.loads(x) for x in pipe.writes[0].splitlines()]
    assert [x["type"] for x in lines] == ["token", "turn_done"] and lines[0]["text"] == "ab"


def test_paced_tokens_go_out_together():
    pipe = _Pipe()
    w = LineWriter(pipe, batch_s=3600, gather_s=3600)  # a pace longer than the test: one batch, ended by close
    for i in range(20):
        w.send(Token(0, f"{i} "))
        time.sleep(0.001)  # tokens apart, as a model makes them
    w.close()
    assert len(pipe.writes) == 1  # not one write per token
    lines = [json.loads(x) for x in pipe.writes[0].splitlines()]
    assert [x["type"] for x in lines] == ["token"] and lines[0]["text"] == "".join(f"{i} " for i in range(20))


def test_a_turn_s_first_output_waits_for_no_pace_and_the_next_waits_for_the_pace():
    pipe = _Pipe()
    w = LineWriter(pipe, batch_s=3600, gather_s=0.01)  # a pace longer than the test
    w.send(Token(0, "a"))  # the first output of a turn
    w.send({"type": "turn", "index": 0, "status": "ok"})  # a turn's lines go out at once
    w.send({"type": "turn_start", "index": 1})
    for _ in range(600):
        if sum(x.count(b"\n") for x in pipe.writes) >= 3:
            break
        time.sleep(0.1)
    w.send(Token(1, "b"))  # the next turn's first token: not an hour after the last write
    for _ in range(600):
        if b'"b"' in b"".join(pipe.writes):
            break
        time.sleep(0.1)
    assert b'"b"' in b"".join(pipe.writes), "a turn's first token waited for the pace"
    w.send(Token(1, "c"))  # after a streamed batch of the same turn: the pace (an hour, ended by close)
    time.sleep(0.2)
    assert b'"c"' not in b"".join(pipe.writes)
    w.close()
    lines = [json.loads(x) for x in b"".join(pipe.writes).splitlines()]
    assert [(x["type"], x.get("text")) for x in lines] == [("token", "a"), ("turn", None), ("turn_start", None),
                                                             ("token", "b"), ("token", "c")]
