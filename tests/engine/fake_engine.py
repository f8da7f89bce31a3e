"""A stand-in engine for the window's tests of what a real one rarely does: refuse, hang, ignore Stop.

``python fake_engine.py MODE``; MODE is one of

* ``protocol999``: greets with protocol 999, then waits;
* ``silent``: greets properly, then says nothing at all (no heartbeat): a hung engine;
* ``stubborn``: greets, answers a load with a one-layer session (header + loaded), starts every turn
  (turn_start) and then ignores everything, Stop and Cancel included, heartbeating all the while;
* ``deaf``: greets and heartbeats, but never answers a request (a load that cannot be cancelled);
  it exits at the end of its input, as the real engine does.

No torch, and of kvinspect only its protocol version: it starts in a few milliseconds.
"""

import json
import sys
import threading
import time

from kvinspect.engine.protocol import PROTOCOL_VERSION

MODE = sys.argv[1]
out = sys.stdout


def send(obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()


def heartbeat():
    while True:
        time.sleep(0.5)
        send({"type": "heartbeat", "busy": "?", "t": 0})


send({"type": "hello", "protocol": 999 if MODE == "protocol999" else PROTOCOL_VERSION, "kvinspect": "9.9.9", "pid": 0})
if MODE in ("stubborn", "deaf"):
    threading.Thread(target=heartbeat, daemon=True).start()
turns = 0
for raw in sys.stdin:
    req = json.loads(raw)
    if MODE != "stubborn":
        continue
    if req["type"] == "load":
        send({"type": "header", "format": "kvinspect-trace", "version": 1, "n_layers": 1,
              "model": {"name": "fake", "spec": "fake"}, "layers": [{"index": 0, "config_attention": "full"}]})
        send({"type": "loaded", "id": req["id"], "info": {"spec": "fake", "name": "fake", "cls": "Fake",
                                                          "device": "cpu", "dtype": "float32", "n_layers": 1,
                                                          "load_seconds": 0.0, "notes": []}})
    elif req["type"] == "turn":
        send({"type": "turn_start", "index": turns, "user": req["text"], "policy": "reuse",
              "cache_impl": "dynamic", "first_step": 0, "settings": {}})
        send({"type": "token", "turn": turns, "text": "partial reply"})
        turns += 1
if MODE != "deaf":  # end of input: a deaf engine goes; the others stay until they are killed
    time.sleep(3600)
