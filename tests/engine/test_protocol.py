"""``kvinspect engine`` as the window uses it: a real child, JSON lines both ways (docs/engine-protocol.md).

The stream's trace lines decode with the trace reader's own decoder into the same record a trace
file gives; only the protocol may write to stdout; versions are checked on both sides.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pytest

from kvinspect.core.trace.messages import TRACE_KINDS, Steps, Token, from_line
from kvinspect.core.trace.stream import RecordBuilder
from kvinspect.engine import protocol as P
from kvinspect.engine.launch import engine_command
from kvinspect.engine.stdio import LineWriter, coalesce
from tests.helpers import vl_unavailable

from .conftest import HERE


def _decode(lines: list[dict]):
    b = RecordBuilder()
    for obj in lines:
        if obj["type"] in TRACE_KINDS:
            b.feed(from_line(obj))
    return b


def test_hello_load_two_turns_shutdown(engine_child):
    e = engine_child()
    hello = e.hello()
    assert hello["type"] == "hello" and hello["protocol"] == P.PROTOCOL_VERSION and hello["pid"] == e.proc.pid
    rid = e.request("load", spec="tiny-llama", device="cpu")
    loaded = e.until(rid=rid)
    assert loaded["type"] == "loaded", loaded
    info = loaded["info"]
    assert (info["name"], info["n_layers"], info["device"]) == ("tiny-llama", 4, "cpu")
    kinds = [x["type"] for x in e.lines]
    assert "progress" in kinds and kinds.index("header") < kinds.index("loaded")

    replies = []
    for text, n in (("Hello there!", 30), ("And again?", 12)):
        start = len(e.lines)
        rid = e.request("turn", text=text, settings={"max_new_tokens": n, "do_sample": False})
        done = e.until(rid=rid)
        assert done["type"] == "turn_done" and done["status"] == "ok", done
        turn_lines = e.lines[start:]
        kinds = [x["type"] for x in turn_lines]
        assert kinds.index("turn_start") < kinds.index("turn") < kinds.index("turn_done")
        # Every step block of the turn arrives before its turn line: a window that writes what came has them all.
        last_steps = max(i for i, k in enumerate(kinds) if k == "steps")
        assert last_steps < kinds.index("turn")
        tokens = "".join(x["text"] for x in turn_lines if x["type"] == "token")
        replies.append(tokens)
        assert kinds.count("token") <= n  # tokens may be coalesced, never split

    rid = e.request("shutdown")
    assert e.until(rid=rid)["type"] == "bye"
    assert e.close() == 0
    kinds = [x["type"] for x in e.lines]
    assert kinds.index("end") < kinds.index("bye")

    rec = _decode(e.lines).record
    assert [t.status for t in rec.turns] == ["ok", "ok"] and rec.n_steps == rec.turns[1].end_step > 0
    assert [t.reply for t in rec.turns] == replies  # the streamed text is the reply
    assert rec.turns[1].reused_tokens > 0
    assert rec.header["notes"]["engine"]["pid"] == e.proc.pid  # RSS in this stream is the engine's
    assert (np.diff(rec.col("t")) >= 0).all()


def test_a_mismatched_window_is_refused_with_both_versions(engine_child):
    e = engine_child()
    first = e.next()
    assert first["type"] == "hello"
    e.send({"type": "hello", "protocol": 999, "kvinspect": "9.9.9"})
    err = e.until(kinds={"error"})
    assert err["task"] == "hello"
    msg = err["message"]
    assert "protocol 999" in msg and "9.9.9" in msg and f"protocol {P.PROTOCOL_VERSION}" in msg
    assert e.close() == P.EXIT_HANDSHAKE


def test_a_mismatched_engine_is_refused_with_both_versions():
    with pytest.raises(P.ProtocolError) as info:
        P.check_hello({"type": "hello", "protocol": 999, "kvinspect": "9.9.9"}, "0.1.0")
    msg = str(info.value)
    assert "protocol 999" in msg and "9.9.9" in msg and f"protocol {P.PROTOCOL_VERSION}" in msg and "0.1.0" in msg
    with pytest.raises(P.ProtocolError, match="did not start with a hello"):
        P.check_hello({"type": "header"}, "0.1.0")


def test_stdout_is_only_protocol_when_the_model_prints(engine_child):
    e = engine_child([sys.executable, str(HERE / "noisy_engine.py")])
    e.hello()
    assert e.until(rid=e.request("load", spec="tiny-llama", device="cpu"))["type"] == "loaded"
    done = e.until(rid=e.request("turn", text="make some noise", settings={"max_new_tokens": 8}))
    assert done["type"] == "turn_done" and done["status"] == "ok"
    e.request("shutdown")
    e.until(kinds={"bye"})
    assert e.close() == 0
    # Every stdout line parsed as JSON in e.next(); the noise went to stderr, all three kinds of it.
    assert not any(b"NOISE" in raw for raw in e.raw)
    err = e.stderr.decode()
    for noise in ("print() in a forward hook", "a raw write to fd 1", "a warning in a forward hook",
                  "print() after loading"):
        assert f"NOISE: {noise}" in err


def test_stop_ends_the_turn_between_tokens(engine_child):
    e = engine_child()
    e.hello()
    assert e.until(rid=e.request("load", spec="tiny-llama", device="cpu"))["type"] == "loaded"
    rid = e.request("turn", text="go on forever", settings={"max_new_tokens": 20000})
    e.until(kinds={"token"})
    e.send({"type": "stop"})
    done = e.until(rid=rid)
    assert done["type"] == "turn_done" and done["status"] == "stopped"
    rec = _decode(e.lines).record
    assert 0 < rec.turns[0].new_tokens < 20000
    # The next turn runs normally: the flag was for that turn only.
    done = e.until(rid=e.request("turn", text="short", settings={"max_new_tokens": 4}))
    assert done["status"] == "ok"
    assert e.close() == 0


def test_mistakes_are_one_line_errors_and_the_engine_goes_on(engine_child):
    e = engine_child()
    e.hello()
    err = e.until(rid=e.request("turn", text="hi"))
    assert err["type"] == "error" and err["message"] == "load a model first"
    err = e.until(rid=e.request("load", spec="/no/such/model", device="cpu"))
    assert err["type"] == "error" and "no such file or directory" in err["message"] and "\n" not in err["message"]
    err = e.until(rid=e.request("frobnicate"))
    assert err["type"] == "error" and "unknown request" in err["message"]
    assert e.until(rid=e.request("load", spec="tiny-llama", device="cpu"))["type"] == "loaded"
    err = e.until(rid=e.request("turn", text="hi", cache_impl="offloaded"))
    assert err["type"] == "error" and "CUDA" in err["message"]
    assert e.close() == 0  # end of input: the engine closes its session and exits


def test_end_of_input_ends_the_engine(engine_child):
    e = engine_child()
    e.hello()
    assert e.close() == 0


def test_engine_command():
    assert engine_command() == [sys.executable, "-m", "kvinspect", "engine"]
    assert engine_command("gpu-box") == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "--",
                                         "gpu-box", "python3", "-m", "kvinspect", "engine"]
    assert engine_command("me@gpu-box", "/opt/venv/bin/python")[7:9] == ["me@gpu-box", "/opt/venv/bin/python"]


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", " -J evil", "--", "", "a b", "a\x1b[2Jb"])
def test_an_ssh_host_is_never_read_as_an_option(host):
    from kvinspect.engine.launch import SshHostError

    with pytest.raises(SshHostError) as err:
        engine_command(host or " ")
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value)


class _BlockingPipe:
    """A pipe whose first write blocks until released: what a window that fell behind looks like."""

    def __init__(self):
        self.release = threading.Event()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self.writes:
            self.writes.append(data)
            self.release.wait(60)
            return
        self.writes.append(data)


def test_a_slow_reader_gets_bigger_batches_never_a_blocked_engine():
    pipe = _BlockingPipe()
    w = LineWriter(pipe)
    w.send({"type": "hello"})
    for i in range(500):  # returns at once although the pipe is stuck on its first write
        w.send(Token(0, f"t{i} "))
    pipe.release.set()
    w.close()
    lines = b"".join(pipe.writes).decode().splitlines()
    assert len(pipe.writes) <= 3 and len(lines) <= 3
    assert "".join(from_line(__import__("json").loads(x)).text for x in lines[1:]) == "".join(
        f"t{i} " for i in range(500))


class _Recorder:
    def __init__(self):
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


def _steps(first, n):
    return Steps(first, n, {"turn": np.zeros(n, np.int32), "t": np.arange(first, first + n, dtype=np.float64)})


def test_a_step_block_and_its_token_go_out_in_one_write():
    pipe = _Recorder()
    w = LineWriter(pipe, batch_s=0, gather_s=0.5)  # (the gather is long here so that no scheduling can split them)
    w.send(_steps(0, 1))
    w.send(Token(0, "a"))
    w.close()
    assert len(pipe.writes) == 1
    assert [json.loads(x)["type"] for x in pipe.writes[0].decode().splitlines()] == ["steps", "token"]


def test_heartbeats_are_not_written_while_lines_stream_and_are_when_it_is_quiet():
    pipe = _Recorder()
    w = LineWriter(pipe, batch_s=0, gather_s=0, quiet_s=3600)
    w.send(Token(0, "a"))
    deadline = time.monotonic() + 30
    while not pipe.writes and time.monotonic() < deadline:
        time.sleep(0.01)
    w.send({"type": "heartbeat", "t": 1})
    w.send(Token(0, "b"))
    w.close()
    kinds = [json.loads(x)["type"] for d in pipe.writes for x in d.decode().splitlines()]
    assert kinds == ["token", "token"]
    quiet = _Recorder()
    w = LineWriter(quiet, batch_s=0, gather_s=0, quiet_s=0)
    w.send({"type": "heartbeat", "t": 1})
    w.close()
    assert [json.loads(x)["type"] for d in quiet.writes for x in d.decode().splitlines()] == ["heartbeat"]


def test_coalesce_merges_neighbours_only():
    def steps(first, n):
        return Steps(first, n, {"turn": np.zeros(n, np.int32), "t": np.arange(first, first + n, dtype=np.float64)})

    out = coalesce([Token(0, "a"), Token(0, "b"), Token(1, "c"), steps(0, 2), steps(2, 3), {"type": "heartbeat"},
                    {"type": "turn_done"}, {"type": "heartbeat", "t": 2}, Token(1, "d")])
    kinds = [getattr(x, "kind", None) or x["type"] for x in out]
    assert kinds == ["token", "token", "steps", "turn_done", "heartbeat", "token"]
    assert out[0].text == "ab" and out[1].text == "c"
    assert out[2].first == 0 and out[2].n == 5 and list(out[2].cols["t"]) == [0, 1, 2, 3, 4]
    assert out[4]["t"] == 2


@pytest.mark.skipif(bool(vl_unavailable()), reason=vl_unavailable() or "-")
def test_an_image_turn_reaches_the_engine_and_its_media_the_stream(engine_child):
    from tests.helpers import RESOURCES

    e = engine_child()
    e.hello()
    assert e.until(rid=e.request("load", spec="tiny-gemma3-vl", device="cpu"))["type"] == "loaded"
    picture = str(RESOURCES / "images" / "gradient.png")
    done = e.until(rid=e.request("turn", text="What is it?", images=[picture], settings={"max_new_tokens": 4}))
    assert done["type"] == "turn_done" and done["status"] == "ok", done
    bad = e.until(rid=e.request("turn", text="And?", images="not a list"))
    assert bad["type"] == "error" and "images" in bad["message"]
    rid = e.request("shutdown")
    assert e.until(rid=rid)["type"] == "bye"
    e.close()
    rec = _decode(e.lines).record
    (turn,) = rec.turns
    assert turn.vision_calls == 1 and [(m["image"], m["tokens"]) for m in turn.media] == [(0, 16)]
