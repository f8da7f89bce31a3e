"""Compare mode: structural relations between configurations, never timings.

What must hold whatever the machine: a static cache holds (and is billed for) its whole
capacity; ``nocache`` never has a cache object; a reused dynamic cache prefills only the new
suffix; a configuration that cannot run here is skipped with its reason; the stress mode
finds the static-cache overflow at exactly the turn the token counts predict.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvinspect.child_render import render_in_child
from kvinspect.core.compare.configs import CompareConfig, parse_config, parse_configs, unavailable_reason
from kvinspect.core.compare.lengths import filler_prompt
from kvinspect.core.compare.report import build_report, write_report
from kvinspect.core.compare.run import ComparePlan, run_compare
from kvinspect.core.errors import ScriptError
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.trace.tracefile import read_trace
from tests.conftest import load_cached
from tests.helpers import cli_main

TURNS = ["hello there how are you", "second turn text", "third one", "and a fourth message"]
HAS_QT = bool(importlib.util.find_spec("PySide6") and importlib.util.find_spec("pyqtgraph"))


def _script(n_turns: int = 3, max_new: int = 6) -> ChatScript:
    return ChatScript(turns=TURNS[:n_turns], settings=GenerationSettings(max_new_tokens=max_new))


def _row_bytes(lm) -> int:
    cfg = lm.model.config
    return 2 * cfg.num_key_value_heads * cfg.head_dim * lm.model.dtype.itemsize


def _expected_prompts(lm, turns: list[str], max_new: int) -> list[int]:
    """Prompt tokens of every turn, from the chat template alone (tiny models: one char = one token,
    EOS suppressed, so every reply is exactly ``max_new`` characters)."""
    tok = lm.tokenizer
    out, history = [], []
    for text in turns:
        msgs = history + [{"role": "user", "content": text}]
        rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append(len(tok(rendered, add_special_tokens=False)["input_ids"]))
        history = msgs + [{"role": "assistant", "content": "x" * max_new}]
    return out


# -- configuration names ------------------------------------------------------------------------------
def test_config_names():
    assert parse_config("dynamic") == CompareConfig("dynamic", "reuse", "dynamic", False)
    assert parse_config("static+compile") == CompareConfig("static+compile", "reuse", "static", True)
    assert parse_config("nocache").policy == "nocache"
    assert parse_config("Recreate") == CompareConfig("recreate", "recreate", "dynamic", False)
    assert parse_config("recreate:static") == CompareConfig("recreate:static", "recreate", "static", False)
    assert parse_config("recreate:static").slug == "recreate-static"
    assert [c.name for c in parse_configs("dynamic, static, nocache")] == ["dynamic", "static", "nocache"]
    for bad, why in (("turbo", "unknown configuration"), ("dynamic+compile", r"\+compile needs a static cache"),
                     ("dynamic,dynamic", "listed twice"), ("", "at least one"),
                     ("reuse:paged", "unknown configuration")):
        with pytest.raises(ScriptError, match=why) as exc:
            parse_configs(bad)
        assert "\n" not in str(exc.value)


@pytest.mark.parametrize("spelling, canonical", [
    ("reuse:static", "static"), ("reuse:dynamic", "dynamic"), ("REUSE:Offloaded", "offloaded"),
    ("reuse:quantized", "quantized"), ("reuse:static+compile", "static+compile"), ("recreate:dynamic", "recreate"),
    ("refeed:dynamic", "refeed"), ("cache-without-config:dynamic", "cache-without-config"),
    ("recreate:static", "recreate:static"), ("recreate_static", None),
])
def test_config_names_are_canonical(spelling, canonical):
    if canonical is None:  # not the grammar: an unknown name
        with pytest.raises(ScriptError, match="unknown configuration"):
            parse_config(spelling)
        return
    cfg = parse_config(spelling)
    assert cfg.name == canonical
    assert cfg == parse_config(canonical)  # same name, policy, cache and compile flag: the same configuration


@pytest.mark.parametrize("text, words", [
    ("reuse:static,static", ["'reuse:static'", "'static'", "twice"]),
    ("dynamic,reuse:dynamic", ["'dynamic'", "'reuse:dynamic'", "twice"]),
    ("static+compile,reuse:static+compile", ["'static+compile'", "'reuse:static+compile'", "twice"]),
    ("recreate,recreate:dynamic", ["'recreate'", "'recreate:dynamic'", "twice"]),
    ("dynamic,,static", ["empty entry"]),
    ("dynamic,static,", ["empty entry"]),
    (",dynamic", ["empty entry"]),
    ("dynamic, ,static", ["empty entry"]),
    ("nocache:static", ["nocache runs without a cache object"]),
    ("nocache:dynamic", ["nocache runs without a cache object"]),
    ("nocache:quantized", ["nocache runs without a cache object"]),
    ("nocache+compile", ["nocache runs without a cache object"]),
    ("cache-without-config:static", ["DynamicCache() without the model config"]),
])
def test_configs_refuse_duplicates_empties_and_ignored_caches(text, words):
    with pytest.raises(ScriptError) as exc:
        parse_configs(text)
    msg = str(exc.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_plan_refuses_nothing_to_do():
    with pytest.raises(ScriptError, match="nothing to run"):
        ComparePlan(configs=parse_configs("dynamic"), script=_script(), conversation=False).validate()
    with pytest.raises(ScriptError, match="--script is needed"):
        ComparePlan(configs=parse_configs("dynamic"), script=None).validate()
    with pytest.raises(ScriptError, match="--repeat"):
        ComparePlan(configs=parse_configs("dynamic"), script=_script(), repeat=0).validate()


# -- the main relations ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_compare(tmp_path_factory):
    lm = load_cached("tiny-llama")
    out = tmp_path_factory.mktemp("compare")
    plan = ComparePlan(configs=parse_configs("dynamic,static,nocache,offloaded"), script=_script(3, 6), repeat=2,
                       max_cache_len=160, command=["kvinspect", "compare", "(test)"])
    seen, partial = [], []

    def on_run(res):  # what a window does: a report of the result so far, built on the worker thread
        partial.append(sum(len(c["runs"]) for c in build_report(res)["configs"]))

    result = run_compare(lm, plan, out, progress=lambda d, t, m: seen.append((d, t, m)), on_run=on_run)
    assert partial == [1, 2, 3, 4, 5, 6]
    files = write_report(result, out, plots=True, formats=("png", "svg"), renderer=render_in_child)
    return lm, out, result, files, seen


def test_compare_writes_every_file(tiny_compare):
    lm, out, result, files, seen = tiny_compare
    assert files.json == out / "compare.json" and files.json.is_file()
    md = files.markdown.read_text(encoding="utf-8")
    for name in ("dynamic", "static", "nocache"):
        assert f"### {name}" in md
        for r in (1, 2):
            run = out / "runs" / f"{name}-r{r}"
            for f in ("trace.jsonl", "summary.json", "script.json"):
                assert (run / f).is_file(), run / f
    data = json.loads(files.json.read_text(encoding="utf-8"))
    assert data["format"] == "kvinspect-compare" and data["version"] == 1
    assert [c["name"] for c in data["configs"]] == ["dynamic", "static", "nocache", "offloaded"]
    assert data["baseline"] == "dynamic"
    if HAS_QT:
        for stem in ("latency_per_turn", "memory_per_turn"):
            assert (out / "plots" / f"{stem}.png").stat().st_size > 10_000
            assert (out / "plots" / f"{stem}.svg").is_file()
            assert f"(plots/{stem}.png)" in md
        assert data["plots"] and all((out / p).is_file() for p in data["plots"])
    else:
        assert any("plots skipped" in n for n in data["notes"])
    # progress: one call per turn, ending at the total
    assert seen[-1][0] == seen[-1][1] == 3 * 2 * 3
    assert all(b[0] >= a[0] for a, b in zip(seen, seen[1:]))


def test_export_elsewhere_is_self_contained(tiny_compare, tmp_path):
    _, out, result, _, _ = tiny_compare
    files = write_report(result, tmp_path / "export", plots=False)
    assert files.json.parent == tmp_path / "export"
    assert (tmp_path / "export" / "runs" / "static-r2" / "trace.jsonl").is_file()
    exported = json.loads(files.json.read_text(encoding="utf-8"))
    assert exported["configs"][0]["runs"][0]["dir"] == "runs/dynamic-r1"


def test_plots_come_from_the_callers_renderer(tiny_compare, tmp_path):
    from kvinspect.core.report.renderer import PlotResult

    _, _, result, _, _ = tiny_compare
    files = write_report(result, tmp_path / "none")  # no renderer: no images, and the report says so
    data = json.loads(files.json.read_text(encoding="utf-8"))
    assert files.plots == [] and data["plots"] == [] and any("no renderer" in n for n in data["notes"])
    calls = []

    def fake(kind, input_path, out_dir, formats):
        calls.append((kind, Path(input_path).name, Path(out_dir).name, formats))
        return PlotResult(notes=["drawn elsewhere"])

    files = write_report(result, tmp_path / "fake", formats=("png",), renderer=fake)
    assert calls == [("compare", "compare.json", "plots", ("png",))] and files.notes == ["drawn elsewhere"]


def test_configurations_are_interleaved(tiny_compare):
    _, _, result, _, _ = tiny_compare
    ran = [c for c in result.configs if c.runs]
    first = max(c.runs[0].started_at for c in ran)
    second = min(c.runs[1].started_at for c in ran)
    assert first < second, "repeat 1 must run every configuration before repeat 2 starts"
    # and the order rotates, so no configuration always goes first
    order = [sorted(ran, key=lambda c: c.runs[r].started_at)[0].name for r in (0, 1)]
    assert order[0] != order[1]


def test_static_holds_its_whole_capacity(tiny_compare):
    lm, out, result, files, _ = tiny_compare
    rb = _row_bytes(lm)
    trace = read_trace(out / "runs" / "static-r1")
    assert trace.turns and all(t.status == "ok" for t in trace.turns)
    for t in trace.turns:
        for lay in t.layers:
            assert lay["capacity"] == 160
            assert lay["bytes"] == 160 * rb  # the allocated rows: the whole buffer, whatever is in use
            assert lay["stored"] <= lay["capacity"]
    static = next(c for c in build_report(result)["configs"] if c["name"] == "static")
    assert static["max_cache_len"] == 160
    assert all(r["kv_capacity_rows"] == 160 for r in static["per_turn"])
    assert static["summary"]["peak_kv_bytes"] == lm.model.config.num_hidden_layers * 160 * rb
    # a dynamic cache holds exactly what was seen, so it is smaller here
    dynamic = next(c for c in build_report(result)["configs"] if c["name"] == "dynamic")
    assert dynamic["summary"]["peak_kv_bytes"] < static["summary"]["peak_kv_bytes"]


def test_nocache_has_no_cache_snapshots(tiny_compare):
    _, out, result, _, _ = tiny_compare
    for r in (1, 2):
        trace = read_trace(out / "runs" / f"nocache-r{r}")
        assert trace.n_steps > 0
        assert set(trace.cache_id.tolist()) == {0}
        assert all(t.layers == [] and t.kv_bytes == 0 and t.cache_id == 0 for t in trace.turns)
    s = result.config("nocache")
    assert all(t["cache_objects"] == [] and t["peak_kv_bytes"] == 0 for run in s.runs for t in run.turns)
    # every turn prefills the whole prompt
    assert all(t["prefill_tokens"] == t["prompt_tokens"] for run in s.runs for t in run.turns)


def test_dynamic_prefills_only_the_suffix(tiny_compare):
    lm, _, result, _, _ = tiny_compare
    expected = _expected_prompts(lm, TURNS[:3], 6)
    for run in result.config("dynamic").runs:
        turns = run.turns
        assert [t["prompt_tokens"] for t in turns] == expected
        assert turns[0]["prefill_tokens"] == turns[0]["prompt_tokens"]
        for prev, t in zip(turns, turns[1:]):
            # the cache holds the previous prompt + reply minus the last sampled token
            assert t["reused_tokens"] == prev["prompt_tokens"] + prev["new_tokens"] - 1
            assert t["prefill_tokens"] == t["prompt_tokens"] - t["reused_tokens"]
        assert len({c for t in turns for c in t["cache_objects"]}) == 1  # one cache object all along
    summary = next(c for c in build_report(result)["configs"] if c["name"] == "dynamic")["summary"]
    assert summary["prefill_tokens_per_turn"][1] < summary["prompt_tokens_per_turn"][1]


def test_offloaded_is_skipped_on_cpu_with_its_reason(tiny_compare):
    _, out, result, files, _ = tiny_compare
    off = result.config("offloaded")
    assert off.status == "skipped" and not off.runs
    assert "CUDA" in off.reason and "\n" not in off.reason
    assert not list((out / "runs").glob("offloaded*"))
    assert "**offloaded** (skipped)" in files.markdown.read_text(encoding="utf-8")


def test_quantized_on_a_sliding_model_is_skipped(tmp_path):
    lm = load_cached("tiny-mistral")
    why = unavailable_reason(lm, parse_config("quantized"))
    assert why and "full-attention" in why
    assert unavailable_reason(lm, parse_config("dynamic")) is None
    assert "llama4" in unavailable_reason(load_cached("tiny-llama4"), parse_config("static+compile"))


def test_static_compile_warms_up_apart_from_steady_state(tmp_path):
    lm = load_cached("tiny-llama")
    cfg = parse_config("static+compile")
    why = unavailable_reason(lm, cfg)
    if why:
        pytest.skip(why)  # e.g. no C++ compiler for inductor: the report lists it as skipped instead
    plan = ComparePlan(configs=[cfg], script=_script(2, 3), repeat=1, max_cache_len=96)
    result = run_compare(lm, plan, tmp_path)
    assert "forward" not in vars(lm.model)  # the instance is restored after every run
    cr = result.config("static+compile")
    assert cr.status == "ran" and len(cr.warmups) == 1 and len(cr.runs) == 1
    assert (tmp_path / "runs" / "static+compile-warmup1" / "trace.jsonl").is_file()
    assert all(t["status"] == "ok" for t in cr.runs[0].turns)
    data = next(c for c in build_report(result)["configs"] if c["name"] == "static+compile")
    assert data["warmup"]["compiled_graphs"] >= 1  # compilation happened in the warm-up...
    assert data["steady_compiled_graphs"] == 0  # ...and not in the measured repeat
    assert data["summary"]["turns_ok"] == 2  # the warm-up is not among the measured turns
    md = write_report(result, tmp_path, plots=False).markdown.read_text(encoding="utf-8")
    assert "Warm-up (not in the figures above)" in md


def test_recompile_limit_warning_is_captured_and_scoped():
    """dynamo's "hit config.recompile_limit" warning is kept off stderr during a compiled run, reported
    instead, and the filter is gone afterwards (other warnings pass untouched)."""
    import logging

    from kvinspect.core.compare.configs import quiet_recompiles

    lg = logging.getLogger("torch._dynamo.convert_frame")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    h = Keep()
    lg.addHandler(h)
    filters_before = list(lg.filters)
    try:
        with quiet_recompiles() as hits:
            lg.warning("torch._dynamo hit config.%s (%s)\n   function: %s\n   last reason: %s\nsee %s",
                       "recompile_limit", 8, "'forward' (x.py:1)", "1/7: kwargs['n'] == 60  # n = f()", "url")
            lg.warning("something else")
        assert hits == [{"limit_type": "recompile_limit", "limit": 8, "function": "'forward' (x.py:1)",
                         "reason": "kwargs['n'] == 60"}]
        assert seen == ["something else"]
        assert lg.filters == filters_before
        lg.warning("torch._dynamo hit config.%s (%s)", "recompile_limit", 8)  # outside: not swallowed
        assert len(seen) == 2
    finally:
        lg.removeHandler(h)


# -- stress ---------------------------------------------------------------------------------------------
def _first_overflow(prompts: list[int], max_new: int, cap: int) -> int:
    """1-based turn whose prompt + new tokens no longer fit: a turn needs prompt + max_new - 1 rows."""
    return next(i + 1 for i, p in enumerate(prompts) if p + max_new - 1 > cap)


@pytest.mark.parametrize("slack", [-1, 0])
def test_stress_finds_the_static_overflow_turn_exactly(tmp_path, slack):
    lm = load_cached("tiny-llama")
    max_new, max_turns = 8, 7
    turns = [TURNS[i % len(TURNS)] for i in range(max_turns)]
    prompts = _expected_prompts(lm, turns, max_new)
    # capacity right at the edge of turn 4: one row short (slack -1) or exactly enough (slack 0)
    cap = prompts[3] + max_new - 1 + slack
    expected = _first_overflow(prompts, max_new, cap)
    assert expected == (4 if slack < 0 else 5)
    plan = ComparePlan(configs=parse_configs("static,dynamic"), script=_script(len(TURNS), max_new),
                       conversation=False, turns_until_failure=max_turns, max_cache_len=cap)
    result = run_compare(lm, plan, tmp_path)
    st = result.config("static").stress
    assert st["status"] == "failed"
    assert st["failed_at_turn"] == expected
    assert st["failure_kind"] == "static-cache-overflow"
    assert st["prompt_tokens_at_failure"] == prompts[expected - 1]
    assert st["tokens_at_failure"] == prompts[expected - 1] + max_new
    assert st["turns_completed"] == expected - 1
    assert st["tokens_completed"] == prompts[expected - 2] + max_new
    assert "static cache overflow" in st["reason"] and "\n" not in st["reason"]
    # the rows the static cache needed (one less than the tokens: the last token is never fed back) are
    # the figure the reason names, and exactly one more than the capacity that was just enough
    assert st["cache_rows_needed"] == prompts[expected - 1] + max_new - 1 == st["tokens_at_failure"] - 1
    assert f"needs up to {st['cache_rows_needed']} cache rows" in st["reason"]
    assert st["cache_rows_needed"] > cap
    dyn = result.config("dynamic").stress
    assert dyn["status"] == "survived" and dyn["failed_at_turn"] is None
    assert dyn["turns_completed"] == max_turns
    assert dyn["tokens_completed"] == prompts[-1] + max_new
    # the stress run's trace keeps every turn up to and including the failed one
    trace = read_trace(tmp_path / "runs" / "static-stress")
    assert [t.status for t in trace.turns] == ["ok"] * (expected - 1) + ["failed"]
    data = build_report(result)
    assert data["stress"]["configs"][0]["failed_at_turn"] == expected


def test_stress_reports_the_context_limit(tmp_path):
    lm = load_cached("tiny-llama")
    max_new = 8
    prompts = _expected_prompts(lm, TURNS, max_new)
    mpe = lm.model.config.max_position_embeddings
    lm.model.config.max_position_embeddings = prompts[2] + max_new - 1  # turn 3 crosses it
    try:
        plan = ComparePlan(configs=parse_configs("dynamic"), script=_script(4, max_new), conversation=False,
                           turns_until_failure=6)
        st = run_compare(lm, plan, tmp_path).config("dynamic").stress
    finally:
        lm.model.config.max_position_embeddings = mpe
    assert (st["status"], st["failed_at_turn"], st["failure_kind"]) == ("failed", 3, "context-limit")
    assert st["tokens_at_failure"] == prompts[2] + max_new
    assert st["turns_completed"] == 2


# -- prompt-length sweep ------------------------------------------------------------------------------
def test_prompt_length_sweep(tmp_path):
    lm = load_cached("tiny-llama")
    text, n = filler_prompt(lm, 40)
    assert n == 40 and text.strip()
    with pytest.raises(ScriptError, match="shorter than the chat template"):
        filler_prompt(lm, 5)
    plan = ComparePlan(configs=parse_configs("dynamic,static"), script=None, conversation=False,
                       prompt_lengths=[64, 24], repeat=2, max_new_tokens=4)
    result = run_compare(lm, plan, tmp_path)
    assert result.length_prompts == {24: 24, 64: 64}
    data = build_report(result)
    lg = data["lengths"]
    assert lg["lengths"] == [24, 64] and lg["max_cache_len"] == 64 + 4
    pts = {c["name"]: {p["length"]: p for p in c["points"]} for c in lg["configs"]}
    rb = _row_bytes(lm) * lm.model.config.num_hidden_layers
    # the static cache costs the short request as much as the long one: its whole capacity
    assert pts["static"][24]["peak_kv_bytes"] == pts["static"][64]["peak_kv_bytes"] == 68 * rb
    assert pts["static"][24]["kv_capacity_rows"] == 68
    # a dynamic cache grows with the prompt: prompt + new - 1 rows
    assert pts["dynamic"][24]["peak_kv_bytes"] == (24 + 4 - 1) * rb
    assert pts["dynamic"][64]["peak_kv_bytes"] == (64 + 4 - 1) * rb
    assert all(p["repeats"] == 2 and p["prompt_tokens"] == n for c in pts.values() for n, p in c.items())
    md = write_report(result, tmp_path, plots=False).markdown.read_text(encoding="utf-8")
    assert "## Prompt-length sweep" in md and "| **static** |" in md


# -- cancel ---------------------------------------------------------------------------------------------
def test_cancel_keeps_what_finished(tmp_path):
    lm = load_cached("tiny-llama")
    calls = []
    plan = ComparePlan(configs=parse_configs("dynamic,static"), script=_script(3, 6), repeat=3)
    result = run_compare(lm, plan, tmp_path, progress=lambda d, t, m: calls.append(d),
                         cancel=lambda: len(calls) >= 4)
    assert result.cancelled
    # Progress comes once per turn: dynamic's first repeat finished its 3 turns, static's first
    # repeat stopped after the 4th turn overall, and nothing later started.
    done = {c.config.name: [(r.repeat, len(r.turns)) for r in c.runs] for c in result.configs}
    assert done == {"dynamic": [(1, 3)], "static": [(1, 1)]}
    assert all(t["status"] == "ok" for c in result.configs for r in c.runs for t in r.turns)
    files = write_report(result, tmp_path, plots=False)
    assert "Cancelled" in files.markdown.read_text(encoding="utf-8")
    assert json.loads(files.json.read_text(encoding="utf-8"))["cancelled"] is True


# -- a hybrid model: failures are reported, not raised ------------------------------------------------------
def test_hybrid_static_reports_failures_with_reasons(tmp_path):
    lm = load_cached("tiny-gemma3")
    plan = ComparePlan(configs=parse_configs("dynamic,static"), script=_script(2, 4), repeat=1, max_cache_len=128)
    result = run_compare(lm, plan, tmp_path)
    data = write_report(result, tmp_path, plots=False)
    static = result.config("static")
    assert static.status == "ran" and len(static.runs[0].turns) == 2
    for t in static.runs[0].turns:
        # transformers 4.56 cannot reuse a hybrid StaticCache across generate calls (turn 2 fails there)
        assert t["status"] == "ok" or (t["status"] == "failed" and t["error"] and "\n" not in t["error"])
    assert data.json.is_file()


# -- nothing measured: every configuration or every length skipped ------------------------------------------
def _assert_no_empty_tables(md: str) -> None:
    """Every markdown table has at least one row, and no sentence ends in an empty list (``: .``)."""
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| ---") or line.startswith("| :---"):
            assert i + 1 < len(lines) and lines[i + 1].startswith("|"), f"empty table at line {i}: {lines[i - 1]}"
    assert ": ." not in md and "():" not in md


def test_every_configuration_skipped_is_reported_not_measured(tmp_path):
    lm = load_cached("tiny-mistral")  # sliding layers: quantized is skipped on any machine
    plan = ComparePlan(configs=parse_configs("quantized"), script=_script(2, 4), repeat=1,
                       turns_until_failure=3, prompt_lengths=[40])
    result = run_compare(lm, plan, tmp_path)
    assert result.config("quantized").status == "skipped" and not result.config("quantized").runs
    why, total = result.unmeasured()
    assert total and why.startswith("nothing was measured: every configuration was skipped (quantized: ")
    assert "full-attention" in why and "\n" not in why
    files = write_report(result, tmp_path, plots=True)
    data = json.loads(files.json.read_text(encoding="utf-8"))
    assert data["nothing_measured"] == why
    assert data["configs"][0]["status"] == "skipped" and data["configs"][0]["reason"]
    assert data["stress"]["configs"] == [] and data["lengths"]["configs"] == []
    assert data["plots"] == [] and not any("no plots" in n for n in data["notes"])
    md = files.markdown.read_text(encoding="utf-8")
    assert "> **Nothing was measured**: every configuration was skipped" in md
    assert "**quantized** (skipped)" in md
    assert "## Summary" not in md and "## Per configuration" not in md
    _assert_no_empty_tables(md)


def test_every_length_skipped_is_reported_not_measured(tmp_path):
    lm = load_cached("tiny-llama")
    too_long = lm.model.config.max_position_embeddings + 1
    plan = ComparePlan(configs=parse_configs("dynamic,static"), script=None, conversation=False,
                       prompt_lengths=[too_long], repeat=1, max_new_tokens=4)
    result = run_compare(lm, plan, tmp_path)
    assert result.length_prompts == {} and [s["length"] for s in result.lengths_skipped] == [too_long]
    why, total = result.unmeasured()
    assert total and why.startswith(f"nothing was measured: every --prompt-lengths length was skipped ({too_long}: ")
    md = write_report(result, tmp_path, plots=False).markdown.read_text(encoding="utf-8")
    assert f"length {too_long} skipped: context limit" in md
    assert "Prompt tokens are the rendered prompt" not in md and "**TTFT" not in md
    _assert_no_empty_tables(md)
    # with the conversation too, the sweep alone is called out (the conversation was measured)
    plan = ComparePlan(configs=parse_configs("dynamic"), script=_script(1, 4), repeat=1,
                       prompt_lengths=[too_long], max_new_tokens=4)
    result = run_compare(lm, plan, tmp_path / "both")
    why, total = result.unmeasured()
    assert not total and why.startswith("the prompt-length sweep measured nothing: every --prompt-lengths length")
    md = write_report(result, tmp_path / "both", plots=False).markdown.read_text(encoding="utf-8")
    assert "## Summary" in md and "| **dynamic** |" in md
    _assert_no_empty_tables(md)


def test_measured_comparisons_are_not_flagged(tiny_compare):
    _, _, result, files, _ = tiny_compare
    assert result.unmeasured() is None  # offloaded skipped, the others ran
    assert json.loads(files.json.read_text(encoding="utf-8"))["nothing_measured"] is None
    _assert_no_empty_tables(files.markdown.read_text(encoding="utf-8"))


# -- the real model -------------------------------------------------------------------------------------------
@pytest.mark.smollm2
def test_compare_on_smollm2(smollm2, tmp_path):
    script = ChatScript(turns=["What is the capital of France?", "And of Italy?"],
                        settings=GenerationSettings(max_new_tokens=4))
    plan = ComparePlan(configs=parse_configs("dynamic,static,nocache"), script=script, repeat=1, max_cache_len=96)
    result = run_compare(smollm2, plan, tmp_path)
    write_report(result, tmp_path, plots=False)
    dyn = result.config("dynamic").runs[0].turns
    assert all(t["status"] == "ok" for t in dyn)
    assert dyn[1]["reused_tokens"] == dyn[0]["prompt_tokens"] + dyn[0]["new_tokens"] - 1
    assert dyn[1]["prefill_tokens"] == dyn[1]["prompt_tokens"] - dyn[1]["reused_tokens"]
    rb = _row_bytes(smollm2)
    trace = read_trace(tmp_path / "runs" / "static-r1")
    assert all(lay["capacity"] == 96 and lay["bytes"] == 96 * rb for t in trace.turns for lay in t.layers)
    assert set(read_trace(tmp_path / "runs" / "nocache-r1").cache_id.tolist()) == {0}
    # stress on the real model: replies may end early at EOS, so the overflow turn is the first
    # whose prompt + generated tokens did not fit, and every earlier turn fitted
    plan = ComparePlan(configs=parse_configs("static"), script=script, conversation=False, turns_until_failure=8,
                       max_cache_len=96)
    st = run_compare(smollm2, plan, tmp_path / "stress").config("static").stress
    assert st["status"] == "failed" and st["failure_kind"] == "static-cache-overflow"
    turns = st["run"]["turns"]
    k = st["failed_at_turn"]
    assert all(t["prompt_tokens"] + t["new_tokens"] - 1 <= 96 for t in turns[: k - 1])
    assert turns[k - 1]["prompt_tokens"] + 4 - 1 > 96
    text, n = filler_prompt(smollm2, 48)
    assert n == 48


# -- the command line -------------------------------------------------------------------------------------------
def test_cli_compare(tmp_path, capsys):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": TURNS[:2], "max_new_tokens": 4}), encoding="utf-8")
    out = tmp_path / "cmp"
    base = ["compare", "--model", "tiny-llama", "--script", str(script), "--configs", "dynamic,nocache,offloaded",
            "--repeat", "1", "--out", str(out), "--no-plots", "-q"]
    rc, stdout, err = cli_main(base, capsys)
    assert rc == 0, err
    assert "offloaded: skipped:" in stdout and "report:" in stdout
    data = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    assert data["command"][:2] == ["kvinspect", "compare"]
    assert (out / "runs" / "nocache-r1" / "trace.jsonl").is_file()
    # the same --out again: refused in one line, then replaced on request
    rc, _, err = cli_main(base, capsys)
    assert rc == 2 and "already holds a comparison" in err and err.count("\n") == 1
    rc, _, err = cli_main(base + ["--overwrite"], capsys)
    assert rc == 0, err
    # the sweep alone needs no script
    rc, stdout, err = cli_main(["compare", "--model", "tiny-llama", "--configs", "dynamic", "--prompt-lengths", "24",
                            "--repeat", "1", "--max-new-tokens", "3", "--out", str(tmp_path / "len"), "--no-plots",
                            "-q"], capsys)
    assert rc == 0, err
    assert "TTFT by prompt length" in stdout


@pytest.mark.parametrize("model, extra, message", [
    ("tiny-mistral", ["--configs", "quantized"],
     "kvinspect: error: nothing was measured: every configuration was skipped (quantized: "),
    ("tiny-llama", ["--configs", "dynamic", "--prompt-lengths", "100000"],
     "kvinspect: error: nothing was measured: every --prompt-lengths length was skipped (100000: context limit"),
])
def test_cli_compare_nothing_measured_exits_2_after_writing(tmp_path, capsys, model, extra, message):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": ["hi"], "max_new_tokens": 2}), encoding="utf-8")
    out = tmp_path / "o"
    rc, stdout, err = cli_main(["compare", "--model", model, "--script", str(script), "--out", str(out), "--repeat", "1",
                            "-q"] + extra, capsys)
    assert rc == 2
    assert err.startswith(message) and err.count("\n") == 1, err  # exactly one line, no traceback
    data = json.loads((out / "compare.json").read_text(encoding="utf-8"))  # the files are still written
    assert data["nothing_measured"] and err.strip().endswith(data["nothing_measured"])
    assert (out / "compare.md").is_file()
    assert "no plots" not in stdout and "report:" in stdout


@pytest.mark.parametrize("configs, message", [
    ("reuse:static,static", "'reuse:static' and 'static' are both 'static'"),
    ("dynamic,,static", "empty entry"),
    ("nocache:static", "nocache runs without a cache object"),
])
def test_cli_compare_config_mistakes_are_one_line(tmp_path, capsys, configs, message):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": ["hi"]}), encoding="utf-8")
    rc, _, err = cli_main(["compare", "--model", "tiny-llama", "--script", str(script), "--out", str(tmp_path / "o"),
                       "--configs", configs], capsys)
    assert rc == 2 and err.startswith("kvinspect: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()  # refused before the model loads or anything is written


@pytest.mark.parametrize("extra, message", [
    (["--configs", "turbo"], "unknown configuration"),
    (["--prompt-lengths", "32,x"], "--prompt-lengths expects token counts"),
    (["--repeat", "0"], "--repeat must be a positive integer"),
    (["--turns-until-failure", "0"], "--turns-until-failure must be at least 1"),
    (["--script", "/nonexistent/s.json"], "script not found"),
])
def test_cli_compare_mistakes_are_one_line(tmp_path, capsys, extra, message):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": ["hi"]}), encoding="utf-8")
    args = ["compare", "--model", "tiny-llama", "--script", str(script), "--out", str(tmp_path / "o")] + extra
    rc, _, err = cli_main(args, capsys)
    assert rc == 2
    assert err.startswith("kvinspect: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o" / "compare.json").exists()


# -- correctness: do the replies stay the baseline's? -----------------------------------------------------

def test_lossless_configurations_reply_exactly_like_the_baseline(tiny_compare):
    _lm, out, _result, files, _seen = tiny_compare
    doc = json.loads(files.json.read_text(encoding="utf-8"))["correctness"]
    assert doc["baseline"] == "dynamic" and doc["skip"] is None
    by = {c["name"]: c for c in doc["configs"]}
    for name in ("static", "nocache"):  # greedy, same model: token for token the same
        assert (by[name]["same_turns"], by[name]["compared_turns"]) == (3, 3), by[name]
        assert all(t["same"] and t["first_diff"] is None for t in by[name]["turns"])
    assert by["offloaded"]["skip"] and "CUDA" in by["offloaded"]["skip"] and by["offloaded"]["turns"] == []
    md = files.markdown.read_text(encoding="utf-8")
    assert "## Correctness" in md and "| static | 3/3 turns |" in md and "| offloaded | – | not compared:" in md


def test_a_configuration_that_changes_the_reply_says_where_and_how(tmp_path):
    lm = load_cached("tiny-llama")
    plan = ComparePlan(configs=parse_configs("dynamic,refeed,static"), script=_script(2, 8), repeat=1,
                       baseline="static", max_cache_len=160)
    result = run_compare(lm, plan, tmp_path)
    doc = build_report(result)["correctness"]
    assert doc["baseline"] == "static"
    by = {c["name"]: c for c in doc["configs"]}
    assert by["dynamic"]["same_turns"] == 2
    # refeed duplicates the context from turn 2 on: same first reply, then another one.
    t1, t2 = by["refeed"]["turns"]
    assert t1["same"] is True and t2["same"] is False
    assert 0 <= t2["first_diff"] < 8 and t2["continuation"] != t2["baseline_continuation"]
    base_ids = result.config("static").runs[0].turns[1]["reply_ids"]
    ids = result.config("refeed").runs[0].turns[1]["reply_ids"]
    assert base_ids[:t2["first_diff"]] == ids[:t2["first_diff"]] and base_ids[t2["first_diff"]] != ids[t2["first_diff"]]


def test_baseline_must_be_a_compared_configuration():
    with pytest.raises(ScriptError, match="--baseline 'quantized' is not one of"):
        ComparePlan(configs=parse_configs("dynamic,static"), script=_script(), baseline="quantized").validate()
