"""`kvinspect trace -- python script.py`: unmodified programs observed in a child process.

Each test starts real processes (kvinspect, then the traced Python), so they are grouped: the
example programs run together through resources/examples/run_all.py (one model load), and each
turn is attributed to its example by the file:line kvinspect records for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import transformers

from kvinspect.core.trace.tracefile import TraceReader, read_trace
from tests.core.examples_expected import load_expected
from tests.helpers import ROOT, run_cli, start_cli, vl_unavailable, wait_for

EXAMPLES_DIR = ROOT / "resources" / "examples"
EXPECTED = load_expected()
EXPECTED_IMAGES = load_expected(images=True)


def kvinspect_trace(out: Path, *cmd, env=None, timeout=900, extra=()):
    return run_cli(["trace", "--out", out, *extra, "--", *cmd], env=env, timeout=timeout, cwd=out.parent)


def problems_by_example(record) -> dict[str, dict[str, list[int]]]:
    """{example file: {kind: [turn numbers counted from the example's first turn]}}."""
    first: dict[str, int] = {}
    out: dict[str, dict[str, set[int]]] = {}
    for t in record.turns:
        name = t.settings["where"].split(":")[0]
        first.setdefault(name, t.index)
        out.setdefault(name, {})
    for e in record.events:
        if e.is_problem:
            name = record.turns[e.turn].settings["where"].split(":")[0]
            out[name].setdefault(e.kind, set()).add(e.turn - first[name] + 1)
    return {n: {k: sorted(v) for k, v in kinds.items()} for n, kinds in out.items()}


def _run_all_order() -> tuple[str, ...]:
    import ast

    tree = ast.parse((EXAMPLES_DIR / "run_all.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "EXAMPLES")
    return tuple(ast.literal_eval(node.value))


def _check_examples(tmp_path, spec: str, max_new_tokens: int, model_kind: str):
    out = tmp_path / "examples"
    # Every example, in run_all's order (the order matters), unless this transformers leaves some out.
    every = json.loads((EXAMPLES_DIR / "expected.json").read_text())
    kept = [n.removesuffix(".py") for n in every if n in EXPECTED]
    only = [] if len(kept) == len([n for n in every if n.endswith(".py")]) else [
        a for name in _run_all_order() if name in kept for a in ("--only", name)]
    r = kvinspect_trace(out, sys.executable, str(EXAMPLES_DIR / "run_all.py"), "--model", spec,
                        "--max-new-tokens", str(max_new_tokens), *only)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("== ") == len(EXPECTED)  # the program's own output, untouched
    rec = read_trace(out / "trace.jsonl")
    # 'sliding' (every layer windowed) falls back to 'windowed' where an example does not tell them apart.
    want = {name: EXPECTED[name].get(model_kind, EXPECTED[name]["windowed"]) for name in EXPECTED}
    got = problems_by_example(rec)
    # A turn fails only where its example's mistake makes transformers raise (a full static cache).
    assert rec.notes == [] and all(t.status == "ok" or "turn_failed" in want[t.settings["where"].split(":")[0]]
                                   for t in rec.turns)
    assert got == want
    for e in rec.events:  # where each pattern comes from: the example's 'origin', else the program's own code
        if e.is_problem:
            name = rec.turns[e.turn].settings["where"].split(":")[0]
            assert e.data.get("origin") == EXPECTED[name].get("origin", "user_code"), (name, e.message)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == sorted({k for name in want for k in want[name]})
    assert "events:" in r.stderr and "prefix_divergence" in r.stderr  # the report went to stderr


def test_trace_names_each_example_mistake_on_a_windowed_model(tmp_path):
    _check_examples(tmp_path, "tiny-mistral", 8, "sliding")


@pytest.mark.smollm2
@pytest.mark.e2e
@pytest.mark.timeout(900)  # one child process: load SmolLM2 (~15 s), then every example, 4 new tokens a turn
def test_trace_names_each_example_mistake_on_smollm2(tmp_path, smollm2_fetched):
    _check_examples(tmp_path, "smollm2", 4, "full")


@pytest.mark.skipif(bool(vl_unavailable()), reason=vl_unavailable() or "-")
def test_trace_names_a_swapped_picture_media_changed_at_its_first_image_token(tmp_path):
    out = tmp_path / "stale"
    r = kvinspect_trace(out, sys.executable, str(EXAMPLES_DIR / "mistake_swapped_image.py"), "--model", "tiny-gemma3-vl",
                        "--max-new-tokens", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "failed: ValueError" in r.stdout  # the program's own output, untouched
    rec = read_trace(out / "trace.jsonl")
    (image,) = rec.turns[0].media
    (div,) = [e for e in rec.events if e.kind == "prefix_divergence"]
    assert (div.turn, div.data["cause"], div.data["position"]) == (1, "media_changed", image["first"])
    assert div.data["cached_hash"] == image["hash"] and "image 1 changed" in div.message
    assert rec.turns[1].media[0]["hash_given"] == div.data["given_hash"]
    assert "media_changed" in r.stderr or "prefix_divergence" in r.stderr


@pytest.mark.skipif(bool(vl_unavailable()), reason=vl_unavailable() or "-")
@pytest.mark.parametrize("name", ["correct_image_chat.py", "mistake_images_passed_again.py"])
def test_images_encoded_by_the_first_generate_are_seen_under_trace(tmp_path, name):
    # Each example alone, so its first turn is the model's first generate(): transformers 5.x encodes the
    # images (get_image_features) before that call's first forward, where the model's own hook first runs.
    out = tmp_path / "out"
    r = kvinspect_trace(out, sys.executable, str(EXAMPLES_DIR / name), "--model", "tiny-gemma3-vl",
                        "--max-new-tokens", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = read_trace(out / "trace.jsonl")
    assert problems_by_example(rec) == {name: EXPECTED_IMAGES[name]["windowed"]}
    first = rec.turns[0].media
    assert first and all(m["encoded"] and m["hash"] for m in first)  # turn 1's pictures, hashed as encoded


ASSISTED_VL = textwrap.dedent('''
    from kvinspect.core.media.images import read_image
    from kvinspect.core.model.loading import load_model

    main, draft = load_model("tiny-gemma3-vl", device="cpu"), load_model("tiny-gemma3-vl", device="cpu")
    proc = main.processor
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=text, images=[read_image(IMAGES)], return_tensors="pt")
    out = main.model.generate(**inputs, assistant_model=draft.model, max_new_tokens=6, do_sample=False)
    print(out.shape[1])
''')


@pytest.mark.skipif(bool(vl_unavailable()), reason=vl_unavailable() or "-")
def test_what_assisted_decoding_feeds_the_draft_model_is_the_librarys(tmp_path):
    # transformers builds the draft's inputs itself (no pixels, no token_type_ids): true, and not the program's.
    p = tmp_path / "assisted.py"
    p.write_text(ASSISTED_VL.replace("IMAGES", repr(str(ROOT / "resources" / "images" / "gradient.png"))))
    out = tmp_path / "out"
    r = kvinspect_trace(out, sys.executable, str(p))
    assert r.returncode == 0, r.stderr[-3000:]
    main = read_trace(out / "trace.jsonl")
    (draft_path,) = out.glob("trace-*-draft.jsonl")
    draft = read_trace(draft_path)
    assert main.turns and draft.turns
    assert [e.kind for e in main.events if e.is_problem] == [] == [e.kind for e in draft.events if e.is_problem]
    named = [e for e in draft.events if e.kind in ("media_fed_as_text", "image_causal")]
    if int(transformers.__version__.split(".")[0]) >= 5:  # 5.x's candidate generator passes neither on
        assert {e.kind for e in named} == {"media_fed_as_text", "image_causal"}
    assert all(e.data["origin"] == "library" and "drove the draft model" in e.message for e in named)


def test_single_example_script_output_and_exit_code_pass_through(tmp_path):
    script = EXAMPLES_DIR / "mistake_cache_in_loop.py"
    args = [sys.executable, str(script), "--model", "tiny-llama", "--max-new-tokens", "5"]
    plain = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    r = kvinspect_trace(tmp_path / "out", *args)
    assert r.returncode == plain.returncode == 0
    assert r.stdout == plain.stdout  # byte for byte: kvinspect writes only to stderr
    rec = read_trace(tmp_path / "out")
    assert {e.kind for e in rec.events if e.is_problem} == {"cache_recreated"}
    assert rec.header["observed"]["mode"] == "trace"
    assert rec.header["command"][:3] == ["kvinspect", "trace", "--"]
    assert "cache_recreated" in r.stderr and str(tmp_path / "out" / "trace.jsonl") in r.stderr


PROGRAM = textwrap.dedent('''
    import os, sys
    import torch
    from kvinspect.core.model.loading import load_model

    print("user sitecustomize ran:", os.environ.get("USER_SITECUSTOMIZE_RAN"))
    print("boot folder on sys.path:", any("_trace_boot" in p for p in sys.path))
    names = sys.argv[2:] or ["tiny-llama"]
    for name in names:
        lm = load_model(name, device="cpu")
        ids = lm.tokenizer("hello there", return_tensors="pt")["input_ids"]
        out = lm.model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
        print(name, out[0, -3:].tolist())
    sys.stderr.write("my own stderr line\\n")
    mode = sys.argv[1]
    if mode in ("crash-inside", "caught-inside"):
        import time
        from transformers import StoppingCriteria, StoppingCriteriaList

        class Boom(StoppingCriteria):
            calls = 0
            def __call__(self, input_ids, scores, **kw):
                Boom.calls += 1
                if Boom.calls == 2:
                    raise RuntimeError("boom inside generate")
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        try:
            lm.model.generate(input_ids=ids, max_new_tokens=6, stopping_criteria=StoppingCriteriaList([Boom()]))
        except RuntimeError:
            if mode == "crash-inside":
                raise
            print("caught it")
        finally:
            time.sleep(0.8)  # generate() has returned by raising; kvinspect's ticker looks meanwhile
        sys.exit(0)
    elif mode == "crash-after":
        raise ValueError("boom after the model ran")
    sys.exit(int(mode))
''')


@pytest.fixture()
def program(tmp_path):
    p = tmp_path / "prog.py"
    p.write_text(PROGRAM)
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    return p, env


def test_exit_code_stdout_and_an_existing_sitecustomize_are_kept(tmp_path, program):
    p, env = program
    plain = subprocess.run([sys.executable, str(p), "3"], capture_output=True, text=True, env=env, timeout=600)
    r = kvinspect_trace(tmp_path / "out", sys.executable, str(p), "3", env=env)
    assert plain.returncode == r.returncode == 3
    assert r.stdout == plain.stdout
    assert "user sitecustomize ran: yes" in r.stdout and "boot folder on sys.path: False" in r.stdout
    assert r.stderr.startswith("kvinspect: tracing") and "my own stderr line" in r.stderr
    rec = read_trace(tmp_path / "out")
    assert len(rec.turns) == 1 and rec.turns[0].new_tokens == 3 and rec.turns[0].status == "ok"


@pytest.mark.parametrize("mode", ["crash-inside", "crash-after"])
def test_a_crashing_script_leaves_a_readable_trace_and_its_exit_code(tmp_path, program, mode):
    p, env = program
    r = kvinspect_trace(tmp_path / "out", sys.executable, str(p), mode, env=env)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "boom" in r.stderr  # the script's own traceback, as Python printed it
    rec = read_trace(tmp_path / "out")
    crash = rec.header["notes"]["crash"]
    assert "boom" in crash["error"]
    if mode == "crash-inside":
        assert [t.status for t in rec.turns] == ["ok", "failed"] and crash["in_turn"]
        assert rec.turns[1].end_step - rec.turns[1].first_step == 2  # the forwards made before the crash
        assert "RuntimeError: boom inside generate" in rec.turns[1].error
    else:
        assert [t.status for t in rec.turns] == ["ok"] and not crash["in_turn"]
    assert (tmp_path / "out" / "summary.json").is_file()


def test_a_generate_that_raised_and_was_caught_is_a_failed_turn(tmp_path, program):
    p, env = program
    r = kvinspect_trace(tmp_path / "out", sys.executable, str(p), "caught-inside", env=env)
    assert r.returncode == 0 and "caught it" in r.stdout, r.stderr[-2000:]
    rec = read_trace(tmp_path / "out")
    assert [t.status for t in rec.turns] == ["ok", "failed"] and "crash" not in rec.header.get("notes", {})
    assert "generate() raised" in rec.turns[1].error


def test_two_models_get_two_clearly_named_traces(tmp_path, program):
    p, env = program
    r = kvinspect_trace(tmp_path / "out", sys.executable, str(p), "0", "tiny-mistral", "tiny-llama", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    names = sorted(x.name for x in (tmp_path / "out").iterdir())
    assert names == ["index.json", "summary-llama.json", "summary.json", "trace-llama.jsonl", "trace.jsonl"]
    assert read_trace(tmp_path / "out" / "trace.jsonl").header["model"]["class"] == "MistralForCausalLM"
    assert read_trace(tmp_path / "out" / "trace-llama.jsonl").header["model"]["class"] == "LlamaForCausalLM"


def test_quiet_says_one_line_and_the_folder_lists_its_traces(tmp_path, program):
    p, env = program
    out = tmp_path / "out"
    r = kvinspect_trace(out, sys.executable, str(p), "0", "tiny-mistral", "tiny-llama", env=env, extra=("-q",))
    assert r.returncode == 0, r.stderr[-2000:]
    ours = [line for line in r.stderr.splitlines() if line.startswith(("kvinspect", "trace:", "summary:"))]
    assert len(ours) == 2 and ours[0].startswith("kvinspect: tracing ")  # where it goes, then what it saw
    assert ours[1:] == [f"kvinspect: 2 models observed → {out} (0 with events); `{sys.executable} {p} 0 tiny-mistral "
                    f"tiny-llama` exited normally"]
    index = json.loads((out / "index.json").read_text())
    assert [(i["trace"], i["class"], i["turns"], i["problems"]) for i in index["traces"]] == [
        ("trace.jsonl", "MistralForCausalLM", 1, 0), ("trace-llama.jsonl", "LlamaForCausalLM", 1, 0)]
    listed = run_cli(["view", str(out), "--list"])
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].startswith("trace.jsonl: ")
    assert "2 trace(s)" in listed.stdout
    missing = run_cli(["view", str(tmp_path), "--list"])
    assert missing.returncode == 2 and "no trace index" in missing.stderr


def test_a_script_without_a_model_says_nothing_observed(tmp_path):
    p = tmp_path / "plain.py"
    p.write_text("print('no model here')\nraise SystemExit(5)\n")
    r = kvinspect_trace(tmp_path / "out", sys.executable, str(p))
    assert r.returncode == 5 and r.stdout == "no model here\n"
    assert "nothing observed" in r.stderr
    assert not (tmp_path / "out").exists()  # the folder kvinspect created for it is gone again


def test_usage_mistakes_are_one_line_and_exit_2(tmp_path):
    r = run_cli(["trace"], cwd=None, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nothing to run" in r.stderr


def test_a_program_that_cannot_start_exits_127_or_126_like_a_shell(tmp_path):
    """kvinspect's own failure to start the program must not pass for an exit code the program chose."""
    r = kvinspect_trace(tmp_path / "out", "no-such-program-kvinspect")
    assert r.returncode == 127 and r.stderr.count("\n") == 1
    assert "command not found: no-such-program-kvinspect" in r.stderr
    assert not (tmp_path / "out").exists()


def _trace_in_process(out, *cmd) -> int:
    from kvinspect.cli import main

    return main(["trace", "--out", str(out), "--", *cmd])


def test_not_found_127_not_executable_126(tmp_path, capsys, monkeypatch):
    import kvinspect.cli

    monkeypatch.setattr(kvinspect.cli, "quiet_libraries", lambda: None)
    plain = tmp_path / "plain.py"
    plain.write_text("print('hi')\n")  # not executable
    no_format = tmp_path / "noformat"
    no_format.write_bytes(b"\x00\x01 not a program\n")  # executable bit, but no shebang and not a binary
    no_format.chmod(0o755)
    cases = [
        (str(tmp_path / "missing-program"), 127, "command not found:"),
        ("no-such-program-kvinspect", 127, "command not found:"),
        (str(plain), 126, "not an executable file"),
        (str(tmp_path), 126, "not an executable file"),
        (str(no_format), 126, "cannot run"),
    ]
    for prog, code, words in cases:
        out = tmp_path / "out"
        assert _trace_in_process(out, prog) == code, prog
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("kvinspect: error:")]
        assert len(err) == 1 and words in err[0] and prog in err[0], (prog, err)
        assert not out.exists()  # the folder made for it is gone again

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("subprocess.Popen", denied)  # found and executable, refused by the kernel (noexec mount)
    assert _trace_in_process(tmp_path / "out", sys.executable, "-c", "pass") == 126
    assert "permission denied" in capsys.readouterr().err


def test_an_earlier_trace_is_never_lost_and_the_program_sees_its_own_environment(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "trace.jsonl").write_text("earlier\n")
    (out / "summary.json").write_text("{}")
    p = tmp_path / "env.py"
    p.write_text("import os\nprint(sorted(k for k in ('TQDM_DISABLE', 'TRANSFORMERS_VERBOSITY', "
                 "'HF_HUB_DISABLE_PROGRESS_BARS') if k in os.environ))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TQDM_DISABLE", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")}
    r = kvinspect_trace(out, sys.executable, str(p), env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--overwrite" in r.stderr
    assert (out / "trace.jsonl").read_text() == "earlier\n" and (out / "summary.json").exists()
    # With --overwrite a program that runs no model still leaves the earlier files as they were
    # (tests/core/cli/test_overwrite.py); the program's environment is its own (kvinspect's quieting of
    # its own output does not reach it).
    r = kvinspect_trace(out, sys.executable, str(p), env=env, extra=("--overwrite",))
    assert r.returncode == 0 and r.stdout == "[]\n", (r.stdout, r.stderr)
    assert (out / "trace.jsonl").read_text() == "earlier\n" and "earlier traces there are kept" in r.stderr


LIVE = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from kvinspect.core.model.loading import load_model

    lm = load_model("tiny-gemma3", device="cpu")
    ids = lm.tokenizer("hello there", return_tensors="pt")["input_ids"]
    lm.model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    flag = Path(sys.argv[1])
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:  # the program idles, like a chat waiting for input
        time.sleep(0.05)
    lm.model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
''')


def test_a_follower_sees_turns_while_the_traced_program_runs(tmp_path):
    p = tmp_path / "live.py"
    p.write_text(LIVE)
    flag = tmp_path / "go"
    out = tmp_path / "out"
    proc = start_cli(["trace", "--out", out, "--", sys.executable, p, flag], cwd=None, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: (out / "trace.jsonl").is_file() and (out / "trace.jsonl").stat().st_size > 0,
                        timeout=120.0, every=0.1)
        follower = TraceReader(out)

        def first_turn_closed():
            follower.poll()
            rec = follower.record
            return rec is not None and rec.turns and rec.turns[0].status == "ok"

        # generate() returned and the program waits: the turn is closed and on disk while it still runs.
        assert wait_for(first_turn_closed, timeout=120.0, every=0.1)
        assert proc.poll() is None and not follower.ended and follower.record.n_steps == 4
        flag.write_text("go")
        assert proc.wait(timeout=300) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    follower.poll()
    assert follower.ended and [t.status for t in follower.record.turns] == ["ok", "ok"]
    assert follower.record.n_steps == 7
