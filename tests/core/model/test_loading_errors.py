"""Bad model specs: a typed exception from core and one line + exit 2 from the CLI, never a traceback."""

import json

import pytest

from kvinspect.core.errors import KvInspectError, ModelLoadError, ModelSpecError
from kvinspect.core.model.loading import load_model
from tests.helpers import run_cli


def _cli(*args, cwd=None):
    r = run_cli(args, cwd=cwd, timeout=240)
    return r.returncode, r.stdout, r.stderr


def _bert_dir(tmp_path):
    d = tmp_path / "bert"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 100,
    }))
    return d


def _corrupt_config_dir(tmp_path):
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    return d


def _truncated_gguf(tmp_path):
    from kvinspect.core.model.fetch import fetched_path, is_fetched

    p = tmp_path / "truncated.gguf"
    if is_fetched("smollm2"):
        with fetched_path("smollm2").open("rb") as f:
            p.write_bytes(f.read(3_000_000))
    else:
        p.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    return p


CASES = {
    "missing path": (lambda tmp: str(tmp / "no" / "such" / "model"), ModelSpecError, "no such file"),
    "missing gguf": (lambda tmp: str(tmp / "nope.gguf"), ModelSpecError, "not found"),
    "unknown built-in": (lambda tmp: "tiny-nonexistent", ModelSpecError, "unknown built-in"),
    "bert folder": (lambda tmp: str(_bert_dir(tmp)), ModelLoadError, "not a causal language model"),
    "truncated gguf": (lambda tmp: str(_truncated_gguf(tmp)), ModelLoadError, "truncated"),
    "corrupt config.json": (lambda tmp: str(_corrupt_config_dir(tmp)), ModelLoadError, "not valid JSON"),
    "offline hub id": (lambda tmp: "nobody-xyz/does-not-exist-42", ModelSpecError, "not found"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_spec_raises_typed_error(case, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    make, exc_type, words = CASES[case]
    spec = make(tmp_path)
    with pytest.raises(exc_type) as info:
        load_model(spec, device="cpu")
    msg = str(info.value)
    assert isinstance(info.value, KvInspectError)
    assert "\n" not in msg and words in msg, msg


@pytest.mark.parametrize("case", ["missing path", "unknown built-in", "bert folder", "truncated gguf",
                                  "corrupt config.json"])
def test_bad_spec_cli_one_line_exit_2(case, tmp_path):
    make, _exc, words = CASES[case]
    spec = make(tmp_path)
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": ["hi"], "max_new_tokens": 2}))
    rc, out, err = _cli("run", "--model", spec, "--script", str(script), "--out", str(tmp_path / "out"))
    lines = [ln for ln in err.splitlines() if ln.strip() and "loading" not in ln]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("kvinspect: error:") and words in lines[0], err
    assert "Traceback" not in err


def test_bad_flags_one_line(tmp_path):
    rc, out, err = _cli("run", "--model", "tiny-llama")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "required" in err
    rc, out, err = _cli("run", "--model", "tiny-llama", "--script", str(tmp_path / "missing.json"), "--out", "x")
    assert rc == 2 and err.strip() == f"kvinspect: error: script not found: {tmp_path / 'missing.json'}"


def test_device_choice_on_cpu_only_machine():
    import torch

    from kvinspect.core.model.devices import resolve_device, resolve_dtype

    label, _ = resolve_device("auto")
    assert label in ("cpu", "cuda", "mps")
    if label == "cpu":
        assert resolve_dtype("auto", "cpu") == torch.float32
    if not torch.cuda.is_available():
        with pytest.raises(ModelSpecError, match="no CUDA"):
            resolve_device("cuda")
        with pytest.raises(ModelSpecError, match="needs CUDA"):
            resolve_device("multi-gpu")
    with pytest.raises(ModelSpecError, match="unknown device"):
        resolve_device("tpu")


# -- damaged and hostile model folders: one line each, before anything big is built ---------------

_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
          "max_position_embeddings": 512}


def _folder(tmp_path, name, config, files=None):
    from kvinspect.core.model.tiny import build_tokenizer

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**_LLAMA, **config}))
    build_tokenizer().save_pretrained(d)  # so loading gets as far as the weights
    for fname, data in (files or {}).items():
        (d / fname).write_bytes(data)
    return d


@pytest.mark.parametrize("name, config, files, match", [
    ("truncated-st", {}, {"model.safetensors": b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":"}, "SafetensorError"),
    ("random-st", {}, {"model.safetensors": bytes(range(256)) * 4}, "could not load the weights"),
    ("pickle-bin", {}, {"pytorch_model.bin": b"\x80\x04\x95garbage, not a pickle"}, "could not load the weights"),
    ("layers-four", {"num_hidden_layers": "four"}, {}, "num_hidden_layers"),
    ("layers-1e9", {"num_hidden_layers": 10**9}, {}, "num_hidden_layers is 1000000000"),
    ("too-big", {"num_hidden_layers": 9000, "hidden_size": 65536, "intermediate_size": 200000}, {},
     "more than this machine's"),
])
def test_damaged_model_folder_is_one_line(tmp_path, name, config, files, match):
    d = _folder(tmp_path, name, config, files)
    with pytest.raises(ModelLoadError, match=match) as exc:
        load_model(str(d), device="cpu")
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 500
