"""The engine survives any line: each bad request line gets one error reply, and the engine keeps serving.

A real ``kvinspect engine`` child is fed, one by one, what a broken or hostile window could send:
JSON nested 100,000 deep, non-string ``type``, wrong-typed fields, lone surrogates, a 3,000,000-character
turn, bytes that are not UTF-8, an unknown request. After each, one ``error`` line; after all of them
a real turn still runs; at end of input the engine exits (the timeout there is a hang guard).
"""

from __future__ import annotations

import io
import json
import threading

import pytest

from kvinspect.engine import protocol as P
from kvinspect.engine.stdio import LineWriter

#: Waiting for a reply or an exit: a hang guard, far beyond what any of these needs.
HANG_S = 120

#: (bad line, a phrase its one error reply says). Sent before a model is loaded.
BEFORE_LOAD = [
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64"),
    (b'{"type":"turn","id":1,"text":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper than 64"),
    (b'{"type":["turn"],"id":2}', "`type` must be a string"),
    (b'{"type":5,"id":3}', "`type` must be a string"),
    (b'{"type":null}', "`type` must be a string"),
    (b'"just a string"', "must be a JSON object"),
    (b"not json at all", "not JSON"),
    (b'\xff\xfe{"type":"new_chat"}', "not UTF-8"),
    (b'{"type":"\\ud800","id":4}', "unknown request"),
    (b'{"type":"frobnicate","id":5}', "unknown request"),
    (b'{"type":"new_chat","id":{"a":1}}', "`id` must be an integer or a short string"),
    (b'{"type":"load","id":6,"spec":["tiny-llama"]}', "`spec` must be a string"),
    (b'{"type":"load","id":7}', "`spec` is missing"),
    (b'{"type":"load","id":8,"spec":"' + b"a" * 5000 + b'"}', "5,000 characters"),
    (b'{"type":"load","id":9,"spec":"~nosuchuser/m"}', "no user 'nosuchuser'"),
    (b'{"type":"load","id":10,"spec":"tiny-llama","trust_remote_code":"yes"}', "`trust_remote_code` must be true"),
    (b'{"type":"check","id":11,"names":5}', "`names` must be a list"),
    (b'{"type":"compare","id":12,"plan":{"configs":"dynamic"},"out_dir":"x"}', "`plan.configs` must be a list"),
    (b'{"type":"fetch","id":13,"name":{"x":1}}', "`name` must be a string"),
]

#: Sent with a model loaded: the fields a turn and a configure take.
AFTER_LOAD = [
    (b'{"type":"configure","id":20,"system":123}', "`system` must be a string"),
    (b'{"type":"turn","id":21,"text":5}', "`text` must be a string"),
    (b'{"type":"turn","id":22}', "`text` is missing"),
    (b'{"type":"turn","id":23,"text":"hi \\ud800 there"}', "lone surrogate"),
    (b'{"type":"turn","id":24,"text":"' + b"a" * 3_000_000 + b'"}', "no context window holds that much"),
    (b'{"type":"turn","id":25,"text":"hi","system":"' + b"s" * 1_000_001 + b'"}', "no context window"),
    (b'{"type":"turn","id":26,"text":"hi","settings":{"max_new_tokens":"many"}}', "max_new_tokens"),
    (b'{"type":"turn","id":27,"text":"hi","settings":{"temperature":[1]}}', "temperature"),
    (b'{"type":"turn","id":28,"text":"hi","settings":"greedy"}', "`settings` must be an object"),
    (b'{"type":"configure","id":29,"policy":7}', "`policy` must be a string"),
]


def _send_raw(e, raw: bytes) -> None:
    e.proc.stdin.write(raw + b"\n")
    e.proc.stdin.flush()


def _replies_to(e, raw: bytes) -> dict:
    """The one reply a line gets (heartbeats and progress lines are not replies)."""
    _send_raw(e, raw)
    while True:
        obj = e.next()
        assert obj is not None, f"the engine ended: {e.proc.wait()} {e.stderr[-2000:]!r}"
        if obj["type"] not in (P.HEARTBEAT, P.PROGRESS):
            return obj


def _refused(e, cases) -> None:
    for raw, phrase in cases:
        reply = _replies_to(e, raw)
        assert reply["type"] == P.ERROR and phrase in reply["message"], (raw[:80], reply)
        assert "\n" not in reply["message"] and len(reply["message"]) < 400
        rid = json.loads(raw).get("id") if raw.startswith(b"{") and len(raw) < 10_000 and b"\\ud800" not in raw \
            and b"\xff" not in raw else None
        if isinstance(rid, int):
            assert reply["id"] == rid  # the window can tell which request failed


def test_every_bad_line_gets_one_reply_and_the_engine_keeps_serving(engine_child):
    e = engine_child()
    assert e.hello()["type"] == P.HELLO
    _refused(e, BEFORE_LOAD)
    rid = e.request("new_chat")  # still serving
    assert e.until(rid=rid)["type"] == P.DONE
    rid = e.request("load", spec="tiny-llama", device="cpu")
    assert e.until(rid=rid)["type"] == P.LOADED
    _refused(e, AFTER_LOAD)
    rid = e.request("turn", text="Hello after all that", settings={"max_new_tokens": 4, "do_sample": False})
    done = e.until(rid=rid)
    assert done["type"] == P.TURN_DONE and done["status"] == "ok", done
    # End of input: the engine ends by itself (the generous wait is a hang guard, not a speed figure).
    e.proc.stdin.close()
    assert e.proc.wait(timeout=HANG_S) == 0
    assert b"Traceback" not in e.stderr


def test_end_of_input_right_after_bad_lines_ends_the_engine(engine_child):
    """EOF while the engine is still starting (importing torch) after a burst of bad lines: it exits."""
    e = engine_child()
    e.hello()
    for raw, _ in BEFORE_LOAD[:6]:
        _send_raw(e, raw)
    e.proc.stdin.close()
    assert e.proc.wait(timeout=HANG_S) == 0
    replies = []
    while (obj := e.next()) is not None:
        if obj["type"] == P.ERROR:
            replies.append(obj)
    assert len(replies) == 6


def test_a_string_protocol_version_is_refused_by_name(engine_child):
    e = engine_child()
    e.next()
    e.send({"type": "hello", "protocol": "1", "kvinspect": "test"})
    reply = e.until(kinds={P.ERROR})
    assert "the string '1'" in reply["message"] and reply["task"] == P.HELLO
    assert e.proc.wait(timeout=HANG_S) == P.EXIT_HANDSHAKE
    with pytest.raises(P.ProtocolError, match="the boolean true"):
        P.check_hello({"type": "hello", "protocol": True}, "x")  # True == 1 in Python, not on the wire


def test_the_writer_escapes_a_lone_surrogate_instead_of_dying():
    buf = io.BytesIO()
    w = LineWriter(buf, batch_s=0)
    w.send({"type": "token", "turn": 0, "text": "half a pair: \ud83d"})
    w.send({"type": "done", "id": 1})
    w.close()
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert lines[0]["text"] == "half a pair: \\ud83d" and lines[1]["type"] == "done"  # and it went on


def test_a_writer_that_fails_ends_the_engine_loudly():
    class Exploding(io.RawIOBase):
        def write(self, data):
            raise RuntimeError("a bug in the pipe")

    gone = threading.Event()
    w = LineWriter(Exploding(), batch_s=0, on_broken=gone.set)
    w.send({"type": "done", "id": 1})
    assert gone.wait(HANG_S)  # never a silent dead thread: the engine is told, and exits with EXIT_PIPE
    assert w.broken
