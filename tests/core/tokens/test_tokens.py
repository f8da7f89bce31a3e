"""The token view: the states it assigns equal what the cache holds, checked against the real tensors.

Each check replays the cells the view says a layer holds through the model once, on a plain
cache that keeps everything, and compares those keys with the layer's own K rows: the view's
ids, their order and each layer's span must all be right for the tensors to match.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kvinspect.cli import main as cli_main
from kvinspect.core import compat
from kvinspect.core.tokens.ids import pack_ids, turn_sequences
from kvinspect.core.tokens.states import (
    CROPPED,
    DUPLICATE,
    DUPLICATED,
    EVICTED,
    GENERATED,
    HELD,
    NOT_CACHED,
    NOT_RECORDED,
    PENDING,
    REPLACEMENT,
    WINDOWED_OUT,
    token_view,
)
from kvinspect.core.tokens.text import strip, token_text
from kvinspect.core.trace.redact import redact_record
from kvinspect.core.trace.tracefile import read_trace, write_trace
from tests.conftest import load_cached
from tests.core.session.test_session import run_session
from tests.helpers import ROOT

QWEN3 = (ROOT / "resources" / "templates" / "qwen3-think.jinja").read_text()
TURNS = ("Tell me something about the sea, please.", "More about waves and the tides?")
_memo: dict = {}


def session_for(name, policy="reuse", new=16, **opts):
    key = (name, policy, new, repr(sorted(opts.items())))
    if key not in _memo:
        loaded = load_cached(name) if name != "smollm2" else opts.pop("loaded")
        _memo[key] = (loaded, *run_session(loaded, TURNS, new, policy=policy, **opts))
    return _memo[key]


def reference_keys(loaded, ids: np.ndarray):
    """Every layer's keys for ``ids`` fed in one forward onto a cache that keeps every position."""
    cache = compat.new_dynamic_cache(None)
    with torch.inference_mode():
        loaded.model(input_ids=torch.tensor([ids.tolist()]), use_cache=True,
                     **{compat.cache_kwarg(loaded.model): cache})
    return cache


def cache_cells(view):
    """The cells at cache positions, in position order."""
    live = np.flatnonzero(~np.isin(view.state, (CROPPED, NOT_CACHED, PENDING)))
    assert (view.pos[live] == np.arange(len(live))).all()
    return live


def check_against_tensors(loaded, session, view, layers=None):
    live = cache_cells(view)
    assert len(live) == int(view.ends.max())  # the view covers every position the cache has seen
    ref = reference_keys(loaded, view.ids[live])
    for i in layers if layers is not None else range(len(view.starts)):
        keys = session.cache.layers[i].keys
        s, e = int(view.starts[i]), int(view.ends[i])
        assert keys.shape[2] == e - s, i
        torch.testing.assert_close(keys, ref.layers[i].keys[:, :, s:e], atol=2e-4, rtol=1e-3)
        held = [c for c in live if i in view.layers_holding(c)]
        assert [int(view.pos[c]) for c in held] == list(range(s, e))


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-mistral"])
def test_sliding_layers_hold_their_last_positions_as_the_tensors_show(name):
    loaded, session, turns, _ = session_for(name)
    view = token_view(session.record)
    check_against_tensors(loaded, session, view)
    window = loaded.model.config.sliding_window
    sliding = [i for i, k in enumerate(view.kinds) if k == "sliding"]
    full = [i for i, k in enumerate(view.kinds) if k == "full"]
    seen = int(view.ends.max())
    for i in sliding:
        # The window's span at the end of the turn: the last positions, at most `window` of them.
        assert view.ends[i] == seen and 0 < seen - view.starts[i] <= window
        assert view.starts[i] > 0  # the early tokens are gone from this layer
    live = cache_cells(view)
    early = live[: int(min(view.starts[i] for i in sliding))]
    late = live[int(max(view.starts[i] for i in sliding)):]
    assert (view.state[early] == (WINDOWED_OUT if full else EVICTED)).all()
    assert (view.state[late] == HELD).all()
    for c in early[:3]:
        assert view.layers_holding(int(c)) == full
    # Both turns show, the first one's tokens first; the reply tokens are flagged.
    assert set(view.turn_of[live].tolist()) == {0, 1}
    assert (view.flags[live][view.turn_of[live] == 1] & GENERATED).any()
    assert view.state[-1] == PENDING  # generate() never feeds its last token back
    # At a step inside the first turn nothing has left the window yet on gemma3's prompt.
    mid = token_view(session.record, turns[0].first_step)
    assert len(cache_cells(mid)) == turns[0].prompt_tokens


def test_smollm2_full_layers_hold_every_token(smollm2):
    loaded, session, turns, _ = session_for("smollm2", new=4, loaded=smollm2)
    view = token_view(session.record)
    check_against_tensors(loaded, session, view, layers=[0, 29])
    live = cache_cells(view)
    assert (view.state[live] == HELD).all() and (view.starts == 0).all()
    assert len(view.bands) == 1 and view.bands[0].kind == "full" and len(view.bands[0].layers) == 30
    assert "<|im_start|>" in token_text(view)


def test_refeed_marks_both_copies_of_the_history():
    loaded, session, turns, _ = session_for("tiny-llama", policy="refeed", new=8)
    view = token_view(session.record)
    check_against_tensors(loaded, session, view, layers=[0, 3])
    first = np.flatnonzero(view.flags & DUPLICATED)
    second = np.flatnonzero(view.flags & DUPLICATE)
    t0 = turns[0]
    assert len(first) == len(second) == t0.prompt_tokens + t0.new_tokens - 1  # all of turn 1's cache, again
    assert (view.ids[first] == view.ids[second]).all()
    assert (view.turn_of[first] == 0).all() and (view.turn_of[second] == 1).all()
    assert second[0] == first[-1] + 1  # appended right after what the cache held
    assert "«dup:" in token_text(view)


def test_think_template_shows_the_cropped_tokens_and_their_replacement():
    loaded, session, turns, _ = session_for("tiny-llama", new=8, chat_template=QWEN3)
    t1 = turns[1]
    assert t1.divergence_at is not None and t1.cropped_from is not None
    view = token_view(session.record)
    check_against_tensors(loaded, session, view, layers=[0, 3])
    cropped = np.flatnonzero(view.state == CROPPED)
    assert len(cropped) == t1.cropped_from - t1.reused_tokens
    assert (view.pos[cropped] == np.arange(t1.reused_tokens, t1.cropped_from)).all()
    assert (view.turn_of[cropped] == 0).all()
    repl = np.flatnonzero(view.flags & REPLACEMENT)
    assert len(repl) and repl[0] == cropped[-1] + 1 and view.pos[repl[0]] == t1.reused_tokens
    assert f"diverged at position {t1.divergence_at}" in view.labels[int(repl[0])]
    text = strip(view, int(repl[0]))
    assert "~~" in text and f"<<diverged at position {t1.divergence_at}" in text
    assert len(text) < 400  # a strip, not the conversation


def test_nocache_tokens_are_never_cached():
    loaded, session, turns, _ = session_for("tiny-llama", policy="nocache", new=8)
    view = token_view(session.record)
    assert len(view) == turns[1].prompt_tokens + turns[1].new_tokens
    assert (view.state == NOT_CACHED).all()
    assert view.layers_holding(0) == []


def test_ids_reference_the_previous_turn_and_survive_the_trace(tmp_path):
    loaded, session, turns, _ = session_for("tiny-gemma3")
    rec = session.record
    ids = turns[1].ids
    assert ids["base_turn"] == 0 and ids["base_len"] > turns[0].prompt_tokens  # prompt + part of the reply
    seqs = turn_sequences(rec.turns)
    assert seqs[1][0].tolist() == turns[1].prompt_ids
    path = write_trace(tmp_path / "trace.jsonl", rec)
    back = read_trace(path)
    a, b = token_view(rec), token_view(back)
    for f in ("ids", "pos", "state", "flags", "turn_of"):
        assert (getattr(a, f) == getattr(b, f)).all(), f
    assert a.pieces == b.pieces and a.labels == b.labels
    line = next(d for d in map(json.loads, path.read_text().splitlines()) if d["type"] == "turn" and d["index"] == 1)
    assert len(line["ids"]["prompt"]) == turns[1].prompt_tokens - ids["base_len"]  # not copied again


def test_v1_trace_and_redacted_copy_say_ids_were_not_recorded(tmp_path):
    loaded, session, turns, _ = session_for("tiny-gemma3")
    path = write_trace(tmp_path / "trace.jsonl", session.record)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for d in lines:
        d.pop("ids", None)
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(d) + "\n" for d in lines))
    view = token_view(read_trace(old))
    assert len(view) == 0 and view.note == NOT_RECORDED
    assert len(view.bands) == 2  # the layers' spans still show
    red = redact_record(session.record)
    assert all(t.ids is None for t in red.turns)
    assert token_view(red).note == NOT_RECORDED


def test_pack_ids_writes_each_piece_once():
    known: set[int] = set()
    a = pack_ids([1, 2, 3], [4, 5], prev=None, known=known, decode=lambda ids: f"p{ids[0]}")
    b = pack_ids([1, 2, 3, 4, 6], [7], prev=(0, [1, 2, 3, 4, 5]), known=known, decode=lambda ids: f"p{ids[0]}")
    assert a["pieces"] == {"1": "p1", "2": "p2", "3": "p3", "4": "p4", "5": "p5"}
    assert (b["base_turn"], b["base_len"], b["prompt"], b["pieces"]) == (0, 4, [6], {"6": "p6", "7": "p7"})


def test_cli_plain_when_piped_coloured_only_when_asked_and_never_with_no_color(tmp_path, capsys, monkeypatch):
    loaded, session, turns, _ = session_for("tiny-gemma3")
    path = write_trace(tmp_path / "trace.jsonl", session.record)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert cli_main(["tokens", str(path)]) == 0
    plain = capsys.readouterr().out
    assert "\x1b[" not in plain and "sliding 96 ×5 (layers 0–4)" in plain and " |t2| " in plain
    assert "[" in plain.split("\n\n", 1)[1]  # evicted tokens are bracketed
    assert cli_main(["tokens", str(path), "--color", "always"]) == 0
    assert "\x1b[48;5;94m" in capsys.readouterr().out
    monkeypatch.setenv("NO_COLOR", "1")
    assert cli_main(["tokens", str(path), "--color", "always"]) == 0
    assert "\x1b[" not in capsys.readouterr().out
    assert cli_main(["tokens", str(path), "--turn", "1", "--step", "0"]) == 0
    assert f"step {turns[0].first_step} · turn 1 of 2" in capsys.readouterr().out
    assert cli_main(["tokens", str(path), "--turn", "3"]) == 2
    assert "--turn 3 is not in the trace" in capsys.readouterr().err


def test_report_quotes_a_token_strip_around_divergence_and_duplicate_events():
    from kvinspect.core.report.report_md import report_markdown

    _, think, turns, _ = session_for("tiny-llama", new=8, chat_template=QWEN3)
    md = report_markdown(think.record)
    block = md.split("prefix_divergence (turn 2)", 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0]
    assert "~~" in block and f"<<diverged at position {turns[1].divergence_at}" in block and "\n" not in block
    _, refeed, _, _ = session_for("tiny-llama", policy="refeed", new=8)
    md = report_markdown(refeed.record)
    assert "«dup:" in md.split("duplicate_context (turn 2)", 1)[1]
    assert "Tokens at step" not in report_markdown(redact_record(refeed.record))  # no ids, no strip


def test_observed_loops_feed_the_same_view():
    """The user's own loop (kvinspect.observe): re-encoded history and a template diverging unchecked."""
    from tests.core.observe.test_observe import run_observed

    lm = load_cached("tiny-llama")
    rec = run_observed(lm, "mistake_reencode_history.py")
    record = getattr(rec, "record", rec)
    ev = next(e for e in record.events if e.kind == "duplicate_context" and e.turn == 1)
    view = token_view(record, record.turns[1].end_step - 1)
    assert len(cache_cells(view)) == int(view.ends.max())
    second = np.flatnonzero(view.flags & DUPLICATE)
    assert len(second) == ev.data["count"] and view.pos[second[0]] == ev.data["position"]
    assert (view.ids[np.flatnonzero(view.flags & DUPLICATED)] == view.ids[second]).all()
    rec = run_observed(lm, "mistake_think_template_no_prefix_check.py")
    record = getattr(rec, "record", rec)
    ev = next(e for e in record.events if e.kind == "prefix_divergence")
    view = token_view(record, ev.step)
    cell = view.cell_at(ev.data["position"])
    assert view.labels[cell].startswith(f"diverged at position {ev.data['position']}")
    assert not (view.state == CROPPED).any()  # generate() sliced by length: nothing was cropped


def test_a_running_turn_shows_the_previous_turns_end_until_its_ids_arrive():
    import copy
    import dataclasses

    _, session, turns, _ = session_for("tiny-gemma3")
    live = copy.copy(session.record)
    live.turns = [turns[0], dataclasses.replace(turns[1], status="running", ids=None)]
    view = token_view(live)
    assert view.step == turns[1].first_step - 1 and "turn 2 is running" in view.note
    assert (view.ids == token_view(session.record, turns[0].end_step - 1).ids).all()


def test_sequences_rebuild_from_any_earlier_turn_and_refuse_damaged_ids():
    from types import SimpleNamespace as T

    turns = [T(ids={"base_turn": -1, "base_len": 0, "prompt": [1, 2], "generated": [3]}),
             T(ids={"base_turn": 0, "base_len": 3, "prompt": [4], "generated": [5]}),
             T(ids={"base_turn": 0, "base_len": 2, "prompt": [9], "generated": []}),  # skips turn 1
             T(ids={"base_turn": 2, "base_len": 1, "prompt": ["x"], "generated": []}),  # damaged
             T(ids={"base_turn": 3, "base_len": 1, "prompt": [], "generated": []})]  # its base is gone
    seqs = turn_sequences(turns)
    assert [s[0].tolist() if s else None for s in seqs] == [[1, 2], [1, 2, 3, 4], [1, 2, 9], None, None]
