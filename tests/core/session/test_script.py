"""Chat scripts: the documented JSON loads, and every malformed or truncated file is refused in one line.

Each message must name the file and what is wrong in it, so a user can fix the script without
reading a traceback; the CLI turns the same errors into `kvinspect: error: …` and exit code 2.
"""

from __future__ import annotations

import json

import pytest

from kvinspect.core.errors import KvInspectError, ScriptError
from kvinspect.core.session.script import ChatScript, GenerationSettings, load_script, parse_script
from tests.helpers import RESOURCES


def _write(tmp_path, text: str | bytes, name: str = "script.json"):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def _one_line_error(path, *needles: str) -> str:
    with pytest.raises(ScriptError) as info:
        load_script(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip() == msg, msg
    assert "Traceback" not in msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_documented_example_loads_with_every_setting(tmp_path):
    doc = {"system": "You are brief.", "turns": ["Hi", "And then?"], "max_new_tokens": 12,
           "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 7}
    s = load_script(_write(tmp_path, json.dumps(doc)))
    assert s.system == "You are brief." and s.turns == ["Hi", "And then?"]
    assert s.settings == GenerationSettings(max_new_tokens=12, do_sample=True, temperature=0.7, top_p=0.9,
                                            top_k=20, seed=7)


def test_only_turns_is_required_and_defaults_are_greedy(tmp_path):
    s = load_script(_write(tmp_path, '{"turns": ["one"]}'))
    assert s.system is None and s.turns == ["one"]
    assert s.settings.do_sample is False and s.settings.max_new_tokens == 64


def test_save_then_load_round_trips(tmp_path):
    s = ChatScript(turns=["a", "ü ∑ — 日本"], system="sys",
                   settings=GenerationSettings(max_new_tokens=5, seed=None))
    again = load_script(s.save(tmp_path / "copy.json"))
    assert again == s


def test_shipped_scripts_are_valid():

    root = RESOURCES / "scripts"
    files = sorted(root.glob("*.json"))
    assert files, root
    for f in files:
        assert load_script(f).turns


def test_utf8_bom_is_accepted(tmp_path):
    p = _write(tmp_path, b"\xef\xbb\xbf" + b'{"turns": ["hi"]}')
    assert load_script(p).turns == ["hi"]


def test_missing_file(tmp_path):
    _one_line_error(tmp_path / "nope.json", "script not found", "nope.json")


def test_a_folder_is_not_a_script(tmp_path):
    _one_line_error(tmp_path, "is a folder")


@pytest.mark.parametrize("cut", [1, 10, 25])
def test_truncated_file_names_line_and_column(tmp_path, cut):
    full = json.dumps({"turns": ["What is the capital of France?", "And of Italy?"], "max_new_tokens": 8}, indent=1)
    p = _write(tmp_path, full[: len(full) - cut])
    msg = _one_line_error(p, str(p), "not valid JSON", "line ")
    assert "column" in msg


def test_empty_file(tmp_path):
    _one_line_error(_write(tmp_path, ""), "not valid JSON")


def test_binary_file_is_not_utf8(tmp_path):
    _one_line_error(_write(tmp_path, b"\x80\x81\xfe\xff" * 10), "not UTF-8")


@pytest.mark.parametrize(
    "doc, needles",
    [
        ([], ["expected a JSON object"]),
        ("just text", ["expected a JSON object"]),
        ({}, ['"turns"']),
        ({"turns": []}, ['"turns" must be a non-empty list']),
        ({"turns": "hello"}, ['"turns" must be a non-empty list']),
        ({"turns": ["ok", ""]}, ["turn 2 must be a non-empty string"]),
        ({"turns": ["ok", "   "]}, ["turn 2"]),
        ({"turns": ["ok", 3]}, ["turn 2"]),
        ({"turns": ["ok"], "system": ["x"]}, ['"system" must be a string']),
        ({"turns": ["ok"], "max_tokens": 5}, ["unknown key(s) max_tokens", "allowed:"]),
        ({"turns": ["ok"], "turn": ["typo"]}, ["unknown key(s) turn"]),
        ({"turns": ["ok"], "max_new_tokens": 0}, ["max_new_tokens"]),
        ({"turns": ["ok"], "max_new_tokens": -3}, ["max_new_tokens"]),
        ({"turns": ["ok"], "max_new_tokens": "12"}, ["max_new_tokens"]),
        ({"turns": ["ok"], "max_new_tokens": 1.5}, ["max_new_tokens"]),
        ({"turns": ["ok"], "max_new_tokens": True}, ["max_new_tokens"]),
        ({"turns": ["ok"], "do_sample": "yes"}, ["do_sample"]),
        ({"turns": ["ok"], "temperature": 0}, ["temperature"]),
        ({"turns": ["ok"], "temperature": -1.0}, ["temperature"]),
        ({"turns": ["ok"], "top_p": 1.5}, ["top_p must be at most 1"]),
        ({"turns": ["ok"], "top_k": -1}, ["top_k"]),
        ({"turns": ["ok"], "top_k": False}, ["top_k"]),
        ({"turns": ["ok"], "seed": "0"}, ["seed"]),
        ({"turns": ["ok"], "seed": 1.0}, ["seed"]),
        ({"turns": ["ok"], "seed": True}, ["seed"]),
    ],
)
def test_malformed_script_is_refused_naming_file_and_key(tmp_path, doc, needles):
    p = _write(tmp_path, json.dumps(doc))
    _one_line_error(p, str(p), *needles)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(tmp_path, value):
    # Python's json accepts these spellings, so the check must be explicit.
    p = _write(tmp_path, f'{{"turns": ["ok"], "temperature": {value}}}')
    _one_line_error(p, "temperature")


def test_parse_script_error_is_a_kvinspect_error():
    with pytest.raises(KvInspectError):
        parse_script({"turns": []}, "inline")


def test_cli_run_with_bad_script_exits_2_with_one_line(tmp_path, capsys):
    from kvinspect.cli import main

    bad = _write(tmp_path, '{"turns": ["ok"], "max_new_tokens": 0}')
    rc = main(["run", "--model", "tiny-llama", "--script", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("kvinspect: error: ") and "max_new_tokens" in err[0], err
    assert not (tmp_path / "out" / "trace.jsonl").exists()


def test_cli_max_new_tokens_override_is_validated(tmp_path, capsys):
    from kvinspect.cli import main

    ok = _write(tmp_path, '{"turns": ["ok"]}')
    rc = main(["run", "--model", "tiny-llama", "--script", str(ok), "--out", str(tmp_path / "o"),
               "--max-new-tokens", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "max_new_tokens" in err[0], err


def test_a_key_given_twice_is_refused(tmp_path):
    p = tmp_path / "s.json"
    p.write_text('{"turns": ["hi"], "max_new_tokens": 20, "max_new_tokens": 4}')
    _one_line_error(p, "'max_new_tokens' appears twice")


# -- hostile scripts and flags: refused before the model loads, one line each -------------------

def _run_cli(tmp_path, capsys, script_text: str, *extra: str, out: str | None = None):
    from kvinspect.cli import main

    p = tmp_path / "s.json"
    p.write_text(script_text, encoding="utf-8")
    rc = main(["run", "--model", "tiny-llama", "--script", str(p), "--out", out if out is not None
               else str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


@pytest.mark.parametrize("text, needle", [
    ('{"turns": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"turns": ["hi \\ud800 there"]}', "lone surrogate"),
    ('{"system": "\\udfff", "turns": ["hi"]}', "lone surrogate"),
    (json.dumps({"turns": ["word " * 300_000]}), "no context window holds that much"),
    ('{"turns": ["hi"], "max_new_tokens": ' + "9" * 5000 + "}", "s.json"),
])
def test_hostile_scripts_are_refused_before_the_model_loads(tmp_path, capsys, text, needle):
    rc, err = _run_cli(tmp_path, capsys, text)
    assert rc == 2 and len(err) == 1 and err[0].startswith("kvinspect: error: ") and needle in err[0], err
    assert not (tmp_path / "out").exists()  # no 0-byte script.json, no empty folder


@pytest.mark.parametrize("extra, needle", [
    (["--system", "\udc80"], "--system holds a lone surrogate"),
    (["--generation-config", "x=" + "[" * 100_000 + "]" * 100_000], "not a usable JSON value"),
])
def test_hostile_flags_are_refused_before_the_model_loads(tmp_path, capsys, extra, needle):
    rc, err = _run_cli(tmp_path, capsys, '{"turns": ["hi"]}', *extra)
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_an_empty_out_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, err = _run_cli(tmp_path, capsys, '{"turns": ["hi"]}', out="")
    assert rc == 2 and err == ["kvinspect: error: --out is empty; give a folder"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_a_fifo_is_not_read_as_a_script_or_template(tmp_path, capsys):
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ScriptError, match="not a regular file"):
        load_script(fifo)
    rc, err = _run_cli(tmp_path, capsys, '{"turns": ["hi"]}', "--chat-template", str(fifo))
    assert rc == 2 and len(err) == 1 and "not a regular file" in err[0], err


def test_overwrite_keeps_the_earlier_run_when_the_new_one_cannot_start(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for name, body in (("trace.jsonl", "old trace\n"), ("summary.json", "{}"), ("script.json", "{}")):
        (out / name).write_text(body)
    from kvinspect.cli import main

    p = tmp_path / "s.json"
    p.write_text('{"turns": ["hi"]}')
    bad = tmp_path / "model"  # resolves (a folder with a config), fails to load: after --out was claimed
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": "four"}))
    rc = main(["run", "--model", str(bad), "--script", str(p), "--out", str(out), "--overwrite"])
    assert rc == 2
    assert "num_hidden_layers" in capsys.readouterr().err
    assert (out / "trace.jsonl").read_text() == "old trace\n" and (out / "summary.json").exists()
    assert [q.name for q in tmp_path.iterdir() if q.name.startswith(".")] == []  # nothing set aside is left


def test_compare_refuses_a_bogus_compile_mode_and_a_folder_it_does_not_own(tmp_path, capsys):
    from kvinspect.cli import main

    p = tmp_path / "s.json"
    p.write_text('{"turns": ["hi"]}')
    rc = main(["compare", "--model", "tiny-llama", "--script", str(p), "--out", str(tmp_path / "c"),
               "--compile-mode", "bogus"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is not a torch.compile mode" in err[0], err
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    rc = main(["compare", "--model", "tiny-llama", "--script", str(p), "--out", str(busy)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "holds no earlier comparison" in err[0], err
    assert sorted(q.name for q in busy.iterdir()) == ["mine.txt"]
