"""The trace file: what a session writes reads back equal, and bad files fail in one line.

Equal means every step column bit for bit (dtype included), the device table, every turn field,
every event and the header. Damage recovery in depth is tests/core/trace/test_trace_damage.py; here:
the round trip, the basic refusals, and that reading never executes anything from the file.
"""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import numpy as np
import pytest

from kvinspect.core.detect.events import Event
from kvinspect.core.errors import TraceError
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.trace.record import STEP_LAYER, STEP_SCALARS, TraceRecord, TurnRecord
from kvinspect.core.trace.stream import Stream
from kvinspect.core.trace.summary import build_summary
from kvinspect.core.trace.tracefile import FORMAT, TRACE_NAME, VERSION, TraceWriter, read_trace, write_trace
from tests.conftest import load_cached

COLUMNS = list(STEP_SCALARS) + list(STEP_LAYER)


def _json(x):
    return json.loads(json.dumps(x))


def assert_records_equal(read: TraceRecord, rec: TraceRecord) -> None:
    assert read.n_layers == rec.n_layers and read.n_steps == rec.n_steps
    for name in COLUMNS:
        a, b = read.col(name), rec.col(name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b), name
    assert read.devices == rec.devices
    assert [t.to_dict() for t in read.turns] == [_json(t.to_dict()) for t in rec.turns]
    assert [e.to_dict() for e in read.events] == [_json(e.to_dict()) for e in rec.events]
    expected_header = _json({"format": FORMAT, "version": VERSION, **rec.header, "n_layers": rec.n_layers})
    assert read.header == expected_header


def test_a_session_trace_reads_back_equal(tmp_path):
    loaded = load_cached("tiny-gemma3")
    path = tmp_path / TRACE_NAME
    opts = SessionOptions(settings=GenerationSettings(max_new_tokens=20))
    # flush_every_s=0: a steps line after every forward, the most chunks a session can write.
    with ChatSession(loaded, opts, trace_path=path, command=["kvinspect", "run"], flush_every_s=0) as session:
        for text in ("Tell me something about the sea, please.", "More about waves?", "And the tides?"):
            session.run_turn(text)
        got: list[str] = []
        session.run_turn("Stop soon.", on_token=got.append, should_stop=lambda: len(got) >= 2)
    rec = session.record
    assert {e.kind for e in rec.events} == {"window_reached", "turn_stopped"}
    read = read_trace(path)
    assert_records_equal(read, rec)
    assert read.notes == []
    lines = path.read_text(encoding="utf-8").splitlines()
    kinds = [json.loads(ln)["type"] for ln in lines]
    assert kinds[0] == "header" and kinds[-1] == "end"
    assert kinds.count("turn_start") == kinds.count("turn") == 4
    assert kinds.count("steps") > 10  # written in chunks as the session went
    # The folder works as well as the file.
    assert read_trace(tmp_path).n_steps == rec.n_steps


def _synthetic(n: int = 3000, layers: int = 6) -> TraceRecord:
    """Edge values on purpose: crops (seen going down), -1 'no token axis', >2**31 bytes, odd times."""
    rng = np.random.default_rng(7)
    rec = TraceRecord(layers, {"created": "now", "model": {"spec": "synthetic"}, "layers": []})
    rec.set_devices(["cpu", "cuda:0"])
    seen = 0
    t = 0.0
    for k in range(n):
        q = 40 if k % 500 == 0 else 1
        seen = seen + q if k % 777 else max(seen - 30, 0)
        t += 10 ** float(rng.uniform(-7, 1))
        if k % 50 == 0:
            t *= float(rng.uniform(2, 9))  # jumps where t - t_prev is not exact: float deltas would not sum back
        s = np.full(layers, seen, np.int32)
        st = s.copy()
        st[1] = min(seen, 63)
        s[-1] = st[-1] = -1  # a linear-attention layer: no token axis
        rec.append_step(turn=k // 1000, t=t, cache_id=1 + k // 1500, q_len=q, use_cache=[True, None, False][k % 3],
                        seen=s, stored=st, dev=np.array([0, 1, 0, 1, 0, -1], np.int8),
                        nbytes=st.astype(np.int64) * (1 << 26), rss=(1 << 33) + k, accel_allocated=k * 1000,
                        accel_reserved=k * 2000)
    for i in range(3):
        rec.add_turn(TurnRecord(index=i, user=f"ü {i}", status="ok", first_step=i * 1000, end_step=(i + 1) * 1000,
                                reply="réponse", layers=[{"index": 0, "kind": "full"}], ttft_s=0.25,
                                kv_bytes_by_device={"cpu": 10, "cuda:0": 20}, checklist=[{"key": "x"}]))
    rec.add_event(Event("window_reached", "info", 0, 5, "m", "a", layer=1, layers=[1], data={"window": 64}))
    return rec


def test_write_trace_round_trips_edge_values_exactly(tmp_path):
    rec = _synthetic()
    read = read_trace(write_trace(tmp_path / "x.jsonl", rec))
    assert_records_equal(read, rec)
    assert read.nbytes.max() > 2**31 and (read.seen[:, -1] == -1).all()


def test_chunked_writes_round_trip_exactly(tmp_path):
    rec = _synthetic(1200)
    # Replay the record into a fresh one, flushing at irregular points as a live session does.
    live = TraceRecord(rec.n_layers, rec.header)
    w = Stream(live, [TraceWriter(tmp_path / "live.jsonl")])
    w.devices(list(rec.devices))
    for k in range(rec.n_steps):
        live.append_step(turn=int(rec.turn[k]), t=float(rec.t[k]) + 100.0, cache_id=int(rec.cache_id[k]),
                         q_len=int(rec.q_len[k]), use_cache=[False, True, None][int(rec.use_cache[k]) % 3],
                         seen=rec.seen[k], stored=rec.stored[k], dev=rec.dev[k], nbytes=rec.nbytes[k],
                         rss=int(rec.rss[k]), accel_allocated=int(rec.accel_allocated[k]),
                         accel_reserved=int(rec.accel_reserved[k]))
        if k % 37 == 0 or k % 101 == 0:
            w.flush_steps()
    w.close()
    read = read_trace(tmp_path / "live.jsonl")
    assert_records_equal(read, live)


def test_run_script_summary_is_rebuilt_from_the_trace(tmp_path):
    loaded = load_cached("tiny-llama4")
    script = ChatScript(turns=["Tell me something about the sea, please.", "More about waves?"],
                        settings=GenerationSettings(max_new_tokens=16))
    res = run_script(loaded, script, tmp_path / "out")
    written = json.loads(res.summary.read_text(encoding="utf-8"))
    rebuilt = build_summary(read_trace(res.out_dir))
    assert rebuilt == written
    # The documented contract (fields may be added, never renamed).
    for key in ("model", "versions", "device", "cache_class", "turns"):
        assert key in written
    for t in written["turns"]:
        for key in ("index", "prompt_tokens", "reused_tokens", "prefill_tokens", "new_tokens", "ttft_s", "total_s",
                    "tokens_per_s", "reply", "cache_id", "layers", "events", "checklist"):
            assert key in t, key
        for lay in t["layers"]:
            assert set(lay) >= {"index", "kind", "seen", "stored", "capacity", "window", "device", "dtype", "bytes",
                                "held_bytes"}
        for ev in t["events"]:
            assert set(ev) >= {"kind", "layer", "step", "message"}
    assert [ev["kind"] for t in written["turns"] for ev in t["events"]] == ["chunk_reached"]
    assert written["problems"] == []
    assert json.loads((res.out_dir / "script.json").read_text()) == script.to_dict()


# -- refusals ------------------------------------------------------------------------------------------

def _refused(path, *needles):
    with pytest.raises(TraceError) as info:
        read_trace(path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def _small_trace(tmp_path) -> tuple:
    rec = _synthetic(50)
    return write_trace(tmp_path / "t.jsonl", rec), rec


def test_missing_and_empty_and_foreign_files(tmp_path):
    _refused(tmp_path / "nothing.jsonl", "nothing.jsonl")
    _refused(tmp_path)  # a folder without trace.jsonl
    (tmp_path / "empty.jsonl").write_text("")
    _refused(tmp_path / "empty.jsonl", "empty")
    (tmp_path / "text.jsonl").write_text("hello world\n")
    _refused(tmp_path / "text.jsonl", "not a kvinspect trace")
    (tmp_path / "other.jsonl").write_text('{"type": "header", "format": "something-else", "version": 1}\n')
    _refused(tmp_path / "other.jsonl", "not a kvinspect trace")
    (tmp_path / "list.jsonl").write_text("[1, 2, 3]\n")
    _refused(tmp_path / "list.jsonl", "not a kvinspect trace")


def test_a_newer_format_version_names_both_versions(tmp_path):
    path, _ = _small_trace(tmp_path)
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["version"] = VERSION + 41
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    _refused(path, str(VERSION + 41), str(VERSION), "upgrade")


def test_cut_inside_the_header_is_refused(tmp_path):
    path, _ = _small_trace(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"\n") // 2])
    _refused(path)


def test_cut_mid_file_keeps_every_complete_turn(tmp_path):
    path, rec = _small_trace(tmp_path)
    data = path.read_bytes()
    last_turn = data.rindex(b'{"type":"turn"')
    path.write_bytes(data[: last_turn + 40])  # the last turn line is cut half way
    read = read_trace(path)
    assert [t.index for t in read.turns if t.status == "ok"] == [0, 1]
    assert read.n_steps == rec.n_steps
    assert any("cut short" in n for n in read.notes), read.notes


def test_malformed_lines_after_the_header_are_skipped_and_named(tmp_path):
    path, rec = _small_trace(tmp_path)
    lines = path.read_text().splitlines()
    lines.insert(2, "{not json")
    lines.insert(3, json.dumps({"type": "event", "kind": "x"})[:-1])
    path.write_text("\n".join(lines) + "\n")
    read = read_trace(path)
    assert read.n_steps == rec.n_steps and len(read.turns) == 3
    assert read.notes and any("damaged" in n for n in read.notes)


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/kvinspect-trace-executed",))


def test_reading_never_executes_anything_from_the_file(tmp_path):
    """A steps column claiming an object dtype with a pickle payload is damage, never unpickled."""
    import os

    marker = "/tmp/kvinspect-trace-executed"
    if os.path.exists(marker):
        os.remove(marker)
    path, rec = _small_trace(tmp_path)
    payload = base64.b64encode(zlib.compress(pickle.dumps(_Boom()))).decode()
    evil = {"type": "steps", "first": rec.n_steps, "n": 1,
            "cols": {"turn": {"dtype": "|O", "shape": [1], "delta": False, "data": payload}}}
    with path.open("a") as f:
        f.write(json.dumps(evil) + "\n")
    read = read_trace(path)
    assert not os.path.exists(marker)
    assert read.n_steps == rec.n_steps
    assert any("damaged" in n for n in read.notes), read.notes
    text = path.read_bytes()
    assert all(json.loads(ln) is not None for ln in text.splitlines() if ln.strip())
