"""Detectors and the per-turn checklist, on synthetic turns whose token counts are known exactly.

Each detector's threshold comes from the conversation's token counts (prompt, new tokens,
cached tokens, window), so each test puts the numbers right at the edge: at the count a correct
cache reaches nothing fires, one token past it the event fires and reports that one token.
The end of the file runs `kvinspect run` and reads the checklist it prints and writes.
"""

from __future__ import annotations

import json

import numpy as np

from kvinspect.core.cache.observer import StepSample
from kvinspect.core.cache.snapshot import CacheSnapshot, LayerSnapshot
from kvinspect.core.detect.detectors import TurnContext, detect_turn, turn_checklist
from kvinspect.core.detect.events import (
    CACHE_DISABLED,
    CACHE_FED_WITHOUT_USE_CACHE,
    CACHE_RECREATED,
    CHUNK_REACHED,
    CONFIG_OVERRIDE,
    CONTEXT_LIMIT,
    DUPLICATE_CONTEXT,
    PREFIX_DIVERGENCE,
    UNBOUNDED_WINDOW,
    WINDOW_REACHED,
    Event,
)
from kvinspect.core.trace.record import TraceRecord
from tests.helpers import cli_main


def sample(cache_id, q_len, seen, stored, use_cache=True):
    seen = np.asarray(seen, np.int32)
    stored = np.asarray(stored, np.int32)
    return StepSample(t=0.0, cache_id=cache_id, new_cache=False, q_len=q_len, use_cache=use_cache, seen=seen,
                      stored=stored, dev=np.zeros(len(seen), np.int8), nbytes=stored.astype(np.int64) * 64)


def layer(i, attention, config_attention, seen, stored, window=None, storage="dynamic"):
    kind = attention if storage != "static" else f"static-{attention}"
    cap = window if attention in ("sliding", "chunked") else None
    return LayerSnapshot(index=i, kind=kind, attention=attention, config_attention=config_attention, storage=storage,
                         cls="X", seen=seen, stored=stored, capacity=cap, window=window, device="cpu",
                         home_device="cpu", dtype="float32", bytes=stored * 64, held_bytes=stored * 64)


def conversation(prompt_len, new, layers_spec, cache_id=1, prev_cache_id=None, cached_before=0, q_first=None,
                 use_cache=True, seen_offset=None):
    """A turn of ``new`` forwards on a cache; ``layers_spec`` = [(attention, config_attention, window)].

    Seen after each forward follows the token counts exactly: the cached prefix, the prefill of the
    rest of the prompt, then one token per step (the last sampled token is never fed).
    """
    start = cached_before if seen_offset is None else seen_offset
    q0 = prompt_len - cached_before if q_first is None else q_first
    qs = [q0] + [1] * (new - 1)
    samples, seen = [], start
    for q in qs:
        seen += q
        s_row, st_row = [], []
        for attention, _cfg, window in layers_spec:
            s_row.append(seen)
            st_row.append(min(seen, window - 1) if attention in ("sliding", "chunked") else seen)
        samples.append(sample(cache_id, q, s_row, st_row, use_cache))
    last = samples[-1]
    snap = CacheSnapshot(cache_id, "DynamicCache", False, [
        layer(i, a, c, int(last.seen[i]), int(last.stored[i]), w) for i, (a, c, w) in enumerate(layers_spec)])
    prompt = list(range(100, 100 + prompt_len))
    ctx = TurnContext(turn_index=1 if prev_cache_id else 0, policy="reuse", cache_impl="dynamic",
                      cached_before=cached_before, prompt=prompt, prev_cache_id=prev_cache_id,
                      cached_ids_before=prompt[:cached_before], reused=cached_before)
    ctx.samples = samples
    ctx.snapshot = snap
    ctx.new_ids = list(range(new))
    ctx.model_layers = [{"index": i, "config_attention": c, "window": w} for i, (_a, c, w) in enumerate(layers_spec)]
    return ctx


def run(ctx, record=None):
    record = record or TraceRecord(len(ctx.model_layers))
    events = detect_turn(ctx, record)
    return events, turn_checklist(ctx, events)


def kinds(events):
    return [e.kind for e in events]


def statuses(items):
    return {i["key"]: i["status"] for i in items}


FULL2 = [("full", "full", None)] * 2


# -- a correct turn ------------------------------------------------------------------------------------

def test_a_correct_turn_fires_nothing_and_passes_every_item():
    events, items = run(conversation(40, 10, FULL2, prev_cache_id=1, cached_before=30))
    assert events == []
    assert statuses(items) == {"cache_object": "pass", "length": "pass", "window": "pass", "device": "pass",
                               "config": "pass"}
    assert "reused 30 of 40" in items[0]["evidence"] and "49 tokens" in items[1]["evidence"]


# -- duplicate_context: seen beyond prompt + new - 1 ---------------------------------------------------

def test_duplicate_context_fires_one_token_past_the_conversation():
    ok = conversation(40, 10, FULL2, prev_cache_id=1, cached_before=30)
    assert DUPLICATE_CONTEXT not in kinds(run(ok)[0])  # seen == 40 + 10 - 1 exactly
    # One token too many: the cache started the turn holding 31 tokens where the prompt shares only 30.
    bad = conversation(40, 10, FULL2, prev_cache_id=1, cached_before=30, seen_offset=31)
    events, items = run(bad)
    assert kinds(events) == [DUPLICATE_CONTEXT]
    ev = events[0]
    assert ev.data == {"seen": 50, "expected": 49, "duplicated": 1} and ev.severity == "error"
    assert statuses(items)["length"] == "fail"


def test_refeeding_the_whole_history_duplicates_exactly_the_cached_part():
    # Turn 2 of the refeed mistake: 49 tokens cached, the whole 75-token prompt fed again on top.
    ctx = conversation(75, 8, FULL2, prev_cache_id=1, cached_before=0, seen_offset=49, q_first=75)
    events, _ = run(ctx)
    assert kinds(events) == [DUPLICATE_CONTEXT]
    assert events[0].data == {"seen": 49 + 75 + 7, "expected": 75 + 7, "duplicated": 49}


# -- cache_disabled -------------------------------------------------------------------------------------

def test_cache_disabled_reports_the_positions_recomputed():
    prompt, new = 30, 5
    samples = [sample(0, prompt + k, [-1, -1], [-1, -1], use_cache=False) for k in range(new)]
    ctx = conversation(prompt, new, FULL2)
    ctx.samples, ctx.snapshot = samples, None
    events, items = run(ctx)
    assert kinds(events) == [CACHE_DISABLED]
    assert events[0].data == {"forwards": 5, "q_len_first": 30, "q_len_last": 34, "positions": 30 + 31 + 32 + 33 + 34}
    assert statuses(items) == {"cache_object": "fail", "length": "warn", "window": "pass", "device": "warn",
                               "config": "pass"}


# -- context_limit ----------------------------------------------------------------------------------------

def test_context_limit_fires_only_past_max_position_embeddings():
    at = conversation(40, 10, FULL2, prev_cache_id=1, cached_before=30)
    at.max_positions = 49  # the conversation uses exactly 40 + 10 - 1 positions: fine
    events, items = run(at)
    assert events == [] and statuses(items)["length"] == "pass"
    past = conversation(40, 10, FULL2, prev_cache_id=1, cached_before=30)
    past.max_positions = 45
    events, items = run(past)
    assert kinds(events) == [CONTEXT_LIMIT] and events[0].severity == "warn"
    assert events[0].data == {"positions": 49, "max_position_embeddings": 45}
    # It shows at the first forward that went past the limit: seen 40, 41, … 49 → the 6th forward (46).
    assert events[0].step == past.first_step + 6
    assert statuses(items)["length"] == "warn" and "max_position_embeddings (45)" in items[1]["evidence"]


def test_kvinspect_run_warns_past_the_context_length(tmp_path, capsys):
    from kvinspect.cli import main

    script = tmp_path / "long.json"
    script.write_text(json.dumps({"turns": ["a" * 4100], "max_new_tokens": 4}))  # tiny-llama: 4096 positions
    rc = main(["run", "--model", "tiny-llama", "--script", str(script), "--out", str(tmp_path / "o"), "-q"])
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert rc == 0 and summary["problems"] == [CONTEXT_LIMIT]
    ev = summary["turns"][0]["events"]
    assert [e["kind"] for e in ev] == [CONTEXT_LIMIT] and "4096" in ev[0]["message"]


# -- cache_recreated --------------------------------------------------------------------------------------

def test_a_new_object_between_turns_is_recreated_with_what_was_reusable():
    ctx = conversation(60, 4, FULL2, cache_id=2, prev_cache_id=1, cached_before=0)
    ctx.cached_ids_before = ctx.prompt[:45] + [7, 7]  # the old cache shared 45 tokens with this prompt
    events, items = run(ctx)
    assert kinds(events) == [CACHE_RECREATED]
    assert events[0].data["reusable_tokens"] == 45 and events[0].data["prefill_tokens"] == 60
    assert events[0].data["cache_id"] == 2 and events[0].data["previous_cache_id"] == 1
    assert statuses(items)["cache_object"] == "fail"


def test_same_object_shorter_than_before_is_a_reset():
    # Held 50 after the last turn, yet the turn started from 0: someone reset it.
    ctx = conversation(60, 4, FULL2, prev_cache_id=1, cached_before=50, seen_offset=0, q_first=60)
    events, _ = run(ctx)
    assert kinds(events) == [CACHE_RECREATED]
    assert events[0].data == {"before": 50, "at_start": 0}
    same = conversation(60, 4, FULL2, prev_cache_id=1, cached_before=50)
    assert run(same)[0] == []


def test_first_turn_is_never_recreated():
    assert run(conversation(20, 3, FULL2))[0] == []


# -- cache_fed_without_use_cache -------------------------------------------------------------------------

def test_cache_fed_with_use_cache_false_reports_its_growth():
    prompt, new = 20, 4
    samples, seen = [], 0
    for k in range(new):
        q = prompt + k  # use_cache=False: every forward re-feeds the whole sequence
        seen += q
        samples.append(sample(1, q, [seen, seen], [seen, seen], use_cache=False))
    ctx = conversation(prompt, new, FULL2)
    ctx.samples = samples
    # What the cache held when the turn ended (the checklist reads the end-of-turn snapshot).
    ctx.snapshot = CacheSnapshot(1, "DynamicCache", False, [layer(i, "full", "full", seen, seen) for i in range(2)])
    events, items = run(ctx)
    assert kinds(events) == [CACHE_FED_WITHOUT_USE_CACHE]  # not also duplicate_context: one cause, one event
    assert events[0].data == {"growth": 20 + 21 + 22 + 23, "forwards": 4}
    assert statuses(items)["cache_object"] == "fail" and statuses(items)["length"] == "fail"


# -- windows ------------------------------------------------------------------------------------------------

def test_window_reached_fires_at_the_first_step_past_window_minus_one():
    spec = [("sliding", "sliding", 8), ("full", "full", None), ("sliding", "sliding", 8)]
    ctx = conversation(5, 6, spec)  # seen 5, 6, 7, 8, 9, 10; stored caps at 7
    events, items = run(ctx)
    assert kinds(events) == [WINDOW_REACHED]
    ev = events[0]
    assert ev.layers == [0, 2] and ev.severity == "info"
    assert ev.step == 3 and ev.data["seen"] == 8 and ev.data["stored"] == 7 and ev.data["window"] == 8
    assert statuses(items)["window"] == "pass" and "reached" in items[2]["evidence"]
    short = conversation(5, 3, spec)  # seen stops at 7 = window - 1: nothing dropped yet
    events, items = run(short)
    assert events == [] and "not reached yet" in items[2]["evidence"]


def test_chunked_layers_report_chunk_reached():
    spec = [("chunked", "chunked", 16), ("full", "full", None)]
    events, _ = run(conversation(20, 2, spec))
    assert kinds(events) == [CHUNK_REACHED] and events[0].layers == [0] and events[0].data["window"] == 16


def test_window_events_fire_once_per_cache_object():
    spec = [("sliding", "sliding", 8)]
    rec = TraceRecord(1)
    first, _ = run(conversation(10, 2, spec), rec)
    for e in first:
        rec.add_event(e)
    again, _ = run(conversation(30, 2, spec, prev_cache_id=1, cached_before=11), rec)
    assert kinds(first) == [WINDOW_REACHED] and again == []
    other, _ = run(conversation(30, 2, spec, cache_id=2), rec)  # a new object: said again
    assert kinds(other) == [WINDOW_REACHED]


def test_unbounded_window_fires_when_a_full_cache_layer_holds_the_window():
    spec = [("full", "sliding", 8), ("full", "full", None)]  # DynamicCache() without the config
    assert run(conversation(5, 3, spec))[0] == []  # 7 stored: a window-8 layer could hold that too
    events, items = run(conversation(5, 4, spec))  # 8 stored: more than a sliding layer keeps
    assert kinds(events) == [UNBOUNDED_WINDOW]
    assert events[0].layers == [0] and events[0].data["stored"] == 8 and events[0].data["window"] == 8
    assert events[0].step == 3
    assert statuses(items)["window"] == "warn"


def test_unbounded_checklist_keeps_warning_after_the_event():
    spec = [("full", "sliding", 8)]
    rec = TraceRecord(1)
    first, _ = run(conversation(10, 2, spec), rec)
    for e in first:
        rec.add_event(e)
    events, items = run(conversation(30, 2, spec, prev_cache_id=1, cached_before=11), rec)
    assert events == []  # said once per object ...
    assert statuses(items)["window"] == "warn" and "31 tokens stored" in items[2]["evidence"]  # ... shown every turn


# -- prefix divergence and config --------------------------------------------------------------------------

def test_prefix_divergence_reports_position_and_crop():
    ctx = conversation(70, 3, FULL2, prev_cache_id=1, cached_before=37)
    ctx.divergence_at, ctx.cropped_from, ctx.cropped_to = 37, 55, 37
    events, items = run(ctx)
    assert kinds(events) == [PREFIX_DIVERGENCE]
    assert events[0].data == {"position": 37, "cached": 37, "cropped_to": 37, "recreated": False,
                              "cause": "history_changed"}
    assert "cropped from 55 to 37" in events[0].message
    assert statuses(items)["length"] == "pass"


def test_config_override_cleared_is_a_warning_and_refused_is_an_error():
    ctx = conversation(20, 3, FULL2)
    ctx.config_collision, ctx.config_cleared = "static", True
    events, _ = run(ctx)
    assert kinds(events) == [CONFIG_OVERRIDE] and events[0].severity == "warn"
    failed = conversation(20, 3, FULL2)
    failed.samples, failed.snapshot, failed.status, failed.error = [], None, "failed", "ValueError: Passing both"
    failed.config_collision = "static"
    events, items = run(failed)
    assert kinds(events) == [CONFIG_OVERRIDE] and events[0].severity == "error"
    assert events[0].data == {"cache_implementation": "static", "cleared": False}
    assert statuses(items)["cache_object"] == "fail"


def test_every_event_says_what_to_do():
    cases = [
        conversation(40, 10, FULL2, prev_cache_id=1, cached_before=30, seen_offset=31),
        conversation(60, 4, FULL2, cache_id=2, prev_cache_id=1),
        conversation(5, 4, [("full", "sliding", 8)]),
    ]
    for ctx in cases:
        for e in run(ctx)[0]:
            assert e.message and e.advice and "\n" not in e.message
            assert Event.from_dict(json.loads(json.dumps(e.to_dict()))) == e


# -- `kvinspect run` prints and writes the checklist ----------------------------------------------------

def _cli_run(tmp_path, capsys, *extra):
    rc, out, _err, summary = _cli_run_full(tmp_path, capsys, *extra)
    return rc, out, summary


def _cli_run_full(tmp_path, capsys, *extra, model="tiny-mistral"):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": ["Tell me about the sea, please.", "More about waves?"],
                                  "max_new_tokens": 16}))
    out = tmp_path / ("o" + "".join(extra).replace("-", ""))
    rc, stdout, stderr = cli_main(["run", "--model", model, "--script", script, "--out", out, "-q", *extra], capsys)
    return rc, stdout, stderr, json.loads((out / "summary.json").read_text())


def test_kvinspect_run_prints_and_writes_a_passing_checklist(tmp_path, capsys):
    rc, text, summary = _cli_run(tmp_path, capsys)
    assert rc == 0
    for k in (1, 2):
        assert f"checklist, turn {k}:" in text
    assert "FAIL" not in text and "WARN" not in text
    assert text.count("PASS  Cache object present and reused") == 2
    for t in summary["turns"]:
        assert [i["key"] for i in t["checklist"]] == ["cache_object", "length", "window", "device", "config"]
        assert {i["status"] for i in t["checklist"]} == {"pass"}
        assert all(i["evidence"] for i in t["checklist"])
    assert summary["problems"] == []
    # The per-turn table: one header, one rule, one row per turn, columns aligned.
    table = text[text.index("turn  status"):].split("\n\n")[0].splitlines()
    assert len(table) == 4 and len({len(ln) for ln in table}) == 1


def test_kvinspect_run_checklist_fails_on_the_mistakes(tmp_path, capsys):
    rc, text, summary = _cli_run(tmp_path, capsys, "--policy", "recreate")
    assert rc == 0
    st = [{i["key"]: i["status"] for i in t["checklist"]} for t in summary["turns"]]
    assert st[0]["cache_object"] == "pass" and st[1]["cache_object"] == "fail"
    assert "FAIL  Cache object present and reused" in text
    assert summary["problems"] == [CACHE_RECREATED]
    rc, text, summary = _cli_run(tmp_path, capsys, "--policy", "cache-without-config")
    assert rc == 0 and "WARN  Attention window applied" in text
    assert all(t["checklist"][2]["status"] == "warn" for t in summary["turns"])


def test_kvinspect_run_exit_code_tells_ci_what_happened(tmp_path, capsys):
    # --fail-on-problems: a mistake policy is a failed check, the correct one is not.
    rc, _, _ = _cli_run(tmp_path, capsys, "--fail-on-problems")
    assert rc == 0
    rc, _, err, summary = _cli_run_full(tmp_path, capsys, "--policy", "recreate", "--fail-on-problems")
    assert rc == 1 and summary["problems"] == [CACHE_RECREATED]
    assert "cache_recreated" in err
    # A turn that fails (a full-attention static cache smaller than the conversation) exits 1 with or
    # without the flag, and the summary still records every turn.
    rc, text, err, summary = _cli_run_full(tmp_path, capsys, "--cache", "static", "--max-cache-len", "100",
                                           model="tiny-llama")
    assert rc == 1, text
    assert [t["status"] for t in summary["turns"]] == ["ok", "failed"]
    lines = [ln for ln in err.splitlines() if ln.startswith("kvinspect:")]
    assert len(lines) == 1 and "failed" in lines[0], err
