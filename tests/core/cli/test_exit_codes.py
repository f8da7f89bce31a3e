"""Exit codes of the ``kvinspect`` command: 2 for the user's mistakes, 1 for the machine's faults.

Out of memory, a full disk or quota, an I/O error while writing output: one line on stderr and
exit 1 (like a turn that failed), never 2 (which says "your input was wrong") and never a
traceback. A bug (any other exception) still shows its traceback.
"""

from __future__ import annotations

import errno
import os

import pytest

import kvinspect.cli as cli
import kvinspect.commands.report as report_cmd
from kvinspect.core.errors import RuntimeFault, ScriptError, runtime_fault
from tests.helpers import FUZZ_SEED


@pytest.fixture
def raising(monkeypatch):
    """``raising(exc)``: `kvinspect report` raises ``exc``; returns (exit code, stderr lines)."""
    monkeypatch.setattr(cli, "quiet_libraries", lambda: None)  # leave this process's environment alone

    def run(exc: BaseException) -> int:
        def main(args, argv):
            raise exc

        monkeypatch.setattr(report_cmd, "main", main)
        return cli.main(["report", "trace.jsonl", "--out", "bundle"])

    return run


def _err(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("code", ["ENOSPC", "EDQUOT", "EIO"])
def test_disk_faults_exit_1_with_one_line(raising, capsys, code):
    if not hasattr(errno, code):
        pytest.skip(f"no {code} here")
    num = getattr(errno, code)
    assert raising(OSError(num, os.strerror(num), "out/trace.jsonl")) == 1
    assert _err(capsys) == [f"kvinspect: error: out/trace.jsonl: {os.strerror(num)}"]


def test_out_of_memory_exits_1_with_one_line(raising, capsys):
    assert raising(MemoryError()) == 1
    assert _err(capsys) == ["kvinspect: error: out of memory"]
    assert raising(MemoryError("Unable to allocate 3.00 GiB for an array")) == 1
    assert _err(capsys) == ["kvinspect: error: out of memory (Unable to allocate 3.00 GiB for an array)"]
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB total capacity)\n"
                        "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF")
    assert raising(cuda) == 1
    assert _err(capsys) == ["kvinspect: error: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB "
                            "total capacity)"]
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)")
    assert raising(cpu) == 1
    (line,) = _err(capsys)
    assert line.startswith("kvinspect: error: out of memory ([enforce fail")


def test_torchs_own_out_of_memory_error_exits_1(raising, capsys):
    torch = pytest.importorskip("torch")
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    assert raising(oom("CUDA out of memory. Tried to allocate 20.00 MiB")) == 1
    assert _err(capsys) == ["kvinspect: error: CUDA out of memory. Tried to allocate 20.00 MiB"]


def test_a_runtime_fault_raised_as_such_exits_1(raising, capsys):
    assert raising(RuntimeFault("could not load the weights of m.gguf: CUDA out of memory")) == 1
    assert _err(capsys) == ["kvinspect: error: could not load the weights of m.gguf: CUDA out of memory"]


def test_the_users_mistakes_stay_2(raising, capsys):
    assert raising(ScriptError("--max-cache-len must be positive")) == 2
    assert _err(capsys) == ["kvinspect: error: --max-cache-len must be positive"]
    assert raising(FileNotFoundError(errno.ENOENT, "No such file or directory", "missing.json")) == 2
    assert _err(capsys) == ["kvinspect: error: missing.json: No such file or directory"]
    assert raising(PermissionError(errno.EACCES, "Permission denied", "/etc/out")) == 2
    assert _err(capsys) == ["kvinspect: error: /etc/out: Permission denied"]
    assert raising(IsADirectoryError(errno.EISDIR, "Is a directory", "a-folder")) == 2
    assert _err(capsys) == ["kvinspect: error: a-folder: Is a directory"]


def test_a_bug_keeps_its_traceback(raising):
    with pytest.raises(RuntimeError, match="boom"):
        raising(RuntimeError("boom"))
    with pytest.raises(ValueError):
        raising(ValueError("also a bug"))


def test_runtime_fault_names_only_the_machines_faults():
    assert runtime_fault(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"
    assert runtime_fault(OSError(errno.ENOENT, "No such file or directory", "x")) is None
    assert runtime_fault(OSError("no errno")) is None
    assert runtime_fault(RuntimeError("shape mismatch")) is None
    assert runtime_fault(ValueError("out of memory")) is None  # only MemoryError and RuntimeError say OOM


def test_out_of_memory_while_loading_weights_is_a_runtime_fault(tmp_path, monkeypatch):
    """A model folder whose weights do not fit: the same one line as before, but exit 1, not 2."""
    import transformers

    from kvinspect.core.model.loading import load_model
    from tests.conftest import load_cached

    lm = load_cached("tiny-llama")
    folder = tmp_path / "m"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)

    def no_memory(*a, **k):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_memory)
    with pytest.raises(RuntimeFault) as info:
        load_model(str(folder), device="cpu")
    assert info.value.exit_code == 1 and "could not load the weights of" in str(info.value)
    assert "CUDA out of memory" in str(info.value)

    def broken(*a, **k):
        raise OSError("unable to load weights from pytorch checkpoint file")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", broken)
    with pytest.raises(Exception) as info:
        load_model(str(folder), device="cpu")
    assert type(info.value).__name__ == "ModelLoadError" and info.value.exit_code == 2


# -- a full disk under the output: the right blame, the right code, nothing half-written -----------

SEED = FUZZ_SEED


def _full_disk_after(monkeypatch, module, name: str, calls: int):
    """``module.name`` works ``calls`` times, then raises ENOSPC as a full disk does."""
    real = getattr(module, name)
    left = [calls]

    def fake(*a, **kw):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left[0] -= 1
        return real(*a, **kw)

    monkeypatch.setattr(module, name, fake)


def test_report_on_a_full_disk_blames_the_target_and_removes_the_partial_bundle(tmp_path, capsys, monkeypatch):
    import kvinspect.core.report.bundle as bundle

    _full_disk_after(monkeypatch, bundle, "write_summary", 0)  # the trace copy landed, the summary did not
    out = tmp_path / "bundle"
    rc = cli.main(["report", str(SEED), "--out", str(out), "--no-plots"])
    err = _err(capsys)
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"kvinspect: error: cannot write the report into {out}: ") and str(SEED) not in err[0]
    assert not out.exists()


def test_trace_passes_on_the_programs_code_when_the_summary_cannot_be_written(tmp_path, capsys, monkeypatch):
    import shutil
    import sys

    import kvinspect.commands.trace as trace_cmd
    import kvinspect.core.trace.summary as summary

    out = tmp_path / "tr"

    def program(cmd, env):  # as if it had run a model: its trace is there, and it exited 0
        shutil.copyfile(SEED, out / "trace.jsonl")
        return 0

    monkeypatch.setattr(trace_cmd, "_run", program)
    _full_disk_after(monkeypatch, summary, "write_summary", 0)
    rc = cli.main(["trace", "--out", str(out), "-q", "--", sys.executable, "-c", "pass"])
    err = _err(capsys)
    assert rc == 0, err
    assert any("cannot write" in ln and "summary.json" in ln for ln in err), err
    assert not (out / "summary.json").exists()


def test_screenshot_under_a_file_is_refused_before_the_window(tmp_path, capsys):
    pytest.importorskip("PySide6")
    f = tmp_path / "a-file"
    f.write_text("x")
    rc = cli.main(["gui", "--model", "tiny-llama", "--screenshot", str(f / "shot.png"), "--exit-when-done"])
    err = _err(capsys)
    assert rc == 2 and err == [f"kvinspect: error: --screenshot {f / 'shot.png'}: {f} is a file, not a folder"]
