"""The engine frees its model on its own thread when it ends, not in a thread that outlives it.

The reader and heartbeat threads hold the engine through their targets. Had the engine kept the
model, the last of them to end would free its tensors while the interpreter finalizes, where
torch's dealloc waits for the GIL, Python ends the thread, and the unwind through torch's frames
aborts the process ("terminate called without an active exception", exit status -6: seen in CI).
"""

from __future__ import annotations

import io
import json
import threading
import weakref

from kvinspect import __version__
from kvinspect.engine.protocol import client_hello
from kvinspect.engine.server import Engine
from kvinspect.engine.stdio import LineWriter


def test_the_model_is_freed_when_serve_returns_though_the_engine_lives_on():
    requests = [client_hello(__version__), {"type": "load", "id": 1, "spec": "tiny-llama", "device": "cpu"},
                {"type": "turn", "id": 2, "text": "hi", "settings": {"max_new_tokens": 4}}]
    turned = threading.Event()

    def window():  # the requests, then end of input once the turn is done (an earlier end would cancel them)
        yield from ((json.dumps(r) + "\n").encode() for r in requests)
        turned.wait(120)

    out = io.BytesIO()
    engine = Engine(window(), LineWriter(out), heartbeat_s=3600.0)
    models = []
    open_session, do_turn = engine._open_session, engine._do_turn

    def spy(loaded, *args):
        models.append(weakref.ref(loaded.model))
        return open_session(loaded, *args)

    def turn(req):
        try:
            do_turn(req)
        finally:
            turned.set()

    engine._open_session, engine._do_turn = spy, turn
    assert engine.serve() == 0
    replies = [json.loads(line)["type"] for line in out.getvalue().splitlines()]
    assert "loaded" in replies and "turn_done" in replies
    # No gc.collect(): freed by reference counting, on this thread, before serve() returned.
    assert models and models[0]() is None, "the engine still holds its model after serve() returned"
