"""Ways to break a valid trace, script or model config: each case is bytes (or JSON) plus its name.

Shared by the seeded corpus (``tests/fuzz/corpus.py``, every case) and the hypothesis suite
(``tests/fuzz/test_fuzz_cli.py``, drawn from the same moves).
"""

from __future__ import annotations

import base64
import json
import random
import zlib

#: Values that have broken readers: wrong types, huge, negative, fractional, empty.
HOSTILE = ["six", -1, 10**9, 10**18, 2**70, 1.5, None, [], {}, True, "", [1, "x"], {"a": [1]}, -(10**9)]


def lines_of(trace: bytes) -> list[dict]:
    return [json.loads(ln) for ln in trace.splitlines() if ln.strip()]


def join(objs: list[dict]) -> bytes:
    return b"".join(json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in objs)


def set_field(objs: list[dict], i: int, path: tuple, value) -> bytes:
    objs = json.loads(json.dumps(objs))
    node = objs[i]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return join(objs)


def field_paths(obj: dict, prefix: tuple = (), depth: int = 2) -> list[tuple]:
    """Every key path of an object, nested objects and step columns included (not list items)."""
    out = []
    for k, v in obj.items():
        if k == "type" and not prefix:
            continue
        out.append(prefix + (k,))
        if isinstance(v, dict) and depth > 0:
            out += field_paths(v, prefix + (k,), depth - 1)
        elif isinstance(v, list) and v and isinstance(v[0], dict) and depth > 0:
            out += field_paths(v[0], prefix + (k, 0), depth - 1)
    return out


def zlib_bomb_line(first: int, n: int, n_layers: int, mb: int) -> bytes:
    """A steps line whose ``seen`` column inflates to ``mb`` MB of zeros while claiming a small shape."""
    raw = zlib.compress(b"\0" * (mb << 20), 9)
    col = {"dtype": "<i4", "shape": [n, n_layers], "delta": True, "data": base64.b64encode(raw).decode()}
    return json.dumps({"type": "steps", "first": first, "n": n, "codec": "zlib-delta-b64",
                       "cols": {"seen": col}}).encode()


def trace_cases(trace: bytes, rng: random.Random, n_field_cases: int) -> list[tuple[str, bytes]]:
    """Named damaged copies of ``trace``: structural damage, then ``n_field_cases`` field swaps."""
    objs = lines_of(trace)
    n_layers = objs[0].get("n_layers", 4)
    raw_lines = trace.splitlines()
    cases: list[tuple[str, bytes]] = []
    steps_i = next(i for i, o in enumerate(objs) if o["type"] == "steps")
    turn_i = next(i for i, o in enumerate(objs) if o["type"] == "turn")
    start_i = next(i for i, o in enumerate(objs) if o["type"] == "turn_start")
    cases += [
        ("steps first 1e9", set_field(objs, steps_i, ("first",), 10**9)),
        ("steps n 1e9", set_field(objs, steps_i, ("n",), 10**9)),
        ("turn index 1e8", set_field(objs, turn_i, ("index",), 10**8)),
        ("turn_start index 1e8", set_field(objs, start_i, ("index",), 10**8)),
        ("n_layers 1e9", set_field(objs, 0, ("n_layers",), 10**9)),
        ("n_layers -1", set_field(objs, 0, ("n_layers",), -1)),
        ("n_layers six", set_field(objs, 0, ("n_layers",), "six")),
        ("session string", set_field(objs, 0, ("session",), "x")),
        ("model list", set_field(objs, 0, ("model",), [1, 2])),
        ("checklist int", set_field(objs, turn_i, ("checklist",), 3)),
        ("turn numbers strings", set_field(objs, turn_i, ("new_tokens",), "12")),
        ("zlib bomb 64 MB", join(objs[:steps_i]) + zlib_bomb_line(0, 4, n_layers, 64) + b"\n" + join(objs[steps_i:])),
        ("zlib bomb claimed shape", join(objs[:steps_i]) + zlib_bomb_line(0, 1_000_000, n_layers, 8) + b"\n"),
        ("5 MB turn text", set_field(objs, turn_i, ("user",), "word " * 1_000_000)),
        ("20k turn_start", join(objs[:1]) + b"".join(
            json.dumps({**objs[start_i], "index": k}).encode() + b"\n" for k in range(20_000))),
        ("deep nesting", raw_lines[0] + b"\n" + b'{"type":"note","key":"k","value":' + b"[" * 100_000
         + b"]" * 100_000 + b"}\n"),
        ("deep header", b'{"type":"header","format":"kvinspect-trace","version":1,"x":' + b"[" * 50_000
         + b"]" * 50_000 + b"}\n"),
        ("empty", b""),
        ("binary junk", bytes(rng.randrange(256) for _ in range(4096))),
        ("header only", raw_lines[0] + b"\n"),
        ("header cut", raw_lines[0][:100]),
        ("bom crlf", b"\xef\xbb\xbf" + b"\r\n".join(raw_lines) + b"\r\n"),
        ("version 99", set_field(objs, 0, ("version",), 99)),
        ("version str", set_field(objs, 0, ("version",), "1")),
        ("format other", set_field(objs, 0, ("format",), "other")),
        ("not an object line", raw_lines[0] + b"\n[1,2,3]\n" + b"\n".join(raw_lines[1:]) + b"\n"),
        ("type int", set_field(objs, turn_i, ("type",), 5)),
        ("dtype object", set_field(objs, steps_i, ("cols", "seen", "dtype"), "|O")),
        ("dtype bogus", set_field(objs, steps_i, ("cols", "seen", "dtype"), "nonsense")),
        ("shape negative", set_field(objs, steps_i, ("cols", "seen", "shape"), [-1, n_layers])),
        ("shape huge", set_field(objs, steps_i, ("cols", "seen", "shape"), [10**9, 10**9])),
        ("data not b64", set_field(objs, steps_i, ("cols", "seen", "data"), "!!!!")),
        ("data not zlib", set_field(objs, steps_i, ("cols", "seen", "data"), base64.b64encode(b"xx" * 50).decode())),
        ("layers huge list", set_field(objs, turn_i, ("layers",), [{}] * 20_000)),
        ("event layers strings", join(objs + [{"type": "event", "kind": "window_reached", "severity": "info",
                                                "turn": 0, "step": 0, "message": "m", "layers": ["a", "b"]}])),
        ("event turn 1e9", join(objs + [{"type": "event", "kind": "window_reached", "severity": "info",
                                          "turn": 10**9, "step": 10**12, "message": "m", "layer": 10**9}])),
        ("devices many", set_field(objs, next(i for i, o in enumerate(objs) if o["type"] == "devices"),
                                   ("devices",), ["cpu"] * 500)),
        ("prompt_ids strings", set_field(objs, turn_i, ("prompt_ids",), ["a"])),
        ("duplicate lines", join(objs + objs[1:])),
        ("reversed", join([objs[0]] + objs[1:][::-1])),
    ]
    for cut in sorted(rng.sample(range(1, len(trace)), min(12, len(trace) - 1))):
        cases.append((f"truncated at {cut}", trace[:cut]))
    paths = [(i, p) for i, o in enumerate(objs) for p in field_paths(o)]
    for _ in range(n_field_cases):
        i, p = rng.choice(paths)
        v = rng.choice(HOSTILE)
        cases.append((f"line {i + 1} {'.'.join(map(str, p))}={json.dumps(v)[:20]}", set_field(objs, i, p, v)))
    return cases


def script_cases(rng: random.Random) -> list[tuple[str, bytes]]:
    """Chat scripts that must be refused before the model loads (or run, when valid)."""
    good = {"turns": ["hi"], "max_new_tokens": 2}
    out = [
        ("deep nesting", b'{"turns":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("lone surrogate turn", b'{"turns":["hi \\ud800 there"],"max_new_tokens":2}'),
        ("lone surrogate system", b'{"system":"\\udfff","turns":["hi"],"max_new_tokens":2}'),
        ("10 MB turn", json.dumps({"turns": ["word " * 2_000_000], "max_new_tokens": 2}).encode()),
        ("not json", b"{turns"),
        ("list", b"[1]"),
        ("binary", bytes(range(256))),
        ("empty", b""),
        ("nan temperature", b'{"turns":["hi"],"temperature":NaN}'),
        ("huge int", b'{"turns":["hi"],"max_new_tokens":' + b"9" * 5000 + b"}"),
    ]
    for key in ("turns", "system", "max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "seed"):
        for v in rng.sample(HOSTILE, 4):
            out.append((f"{key}={json.dumps(v)[:20]}", json.dumps({**good, key: v}).encode()))
    return out


def config_cases() -> list[tuple[str, dict | None, dict[str, bytes]]]:
    """Model folders: a config.json change and extra files (weights) per case."""
    return [
        ("num_hidden_layers four", {"num_hidden_layers": "four"}, {}),
        ("num_hidden_layers 1e9", {"num_hidden_layers": 10**9}, {}),
        ("num_hidden_layers -1", {"num_hidden_layers": -1}, {}),
        ("hidden_size 1e7", {"hidden_size": 10**7}, {}),
        ("vocab_size 1e10", {"vocab_size": 10**10}, {}),
        ("model_type bogus", {"model_type": "bogus"}, {}),
        ("config not json", None, {"config.json": b"{nope"}),
        ("truncated safetensors", {}, {"model.safetensors": b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":"}),
        ("random safetensors", {}, {"model.safetensors": bytes(random.Random(1).randrange(256) for _ in range(999))}),
        ("pickle bin", {}, {"pytorch_model.bin": b"\x80\x04\x95garbage that is not a pickle"}),
    ]
