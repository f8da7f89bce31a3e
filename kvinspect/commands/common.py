"""Flags and helpers shared by several subcommands (core only, no Qt).

The parsed session flags become SessionOptions in :mod:`kvinspect.core.session.options`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, metavar="SPEC",
                   help="built-in name (see `kvinspect models`), .gguf file, model folder or hub id")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps, multi-gpu")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bf16/fp16 on GPUs), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow code from the model repository to run (off by default)")


def add_session_args(p: argparse.ArgumentParser) -> None:
    from ..core.session.chat import CACHE_IMPLS, POLICIES

    p.add_argument("--policy", default="reuse", metavar="POLICY",
                   help="how the cache is handled across turns: " + ", ".join(POLICIES))
    p.add_argument("--cache", default="dynamic", metavar="IMPL", help="cache implementation: " + ", ".join(CACHE_IMPLS))
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the script's max_new_tokens")
    p.add_argument("--seed", type=int, default=None, help="override the script's seed")
    p.add_argument("--system", default=None, help="override the script's system prompt")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template replacing the tokenizer's (e.g. resources/templates/qwen3-think.jinja)")
    p.add_argument("--max-cache-len", type=int, default=None, help="rows of a static cache (default min(max positions, 2048))")
    p.add_argument("--generation-config", action="append", default=[], metavar="KEY=VALUE",
                   help="set a model.generation_config field first, e.g. cache_implementation=static (repeatable)")
    p.add_argument("--respect-generation-config", action="store_true",
                   help="do not clear a colliding generation_config.cache_implementation (reproduces the ValueError)")


def claim_out_dir(out: Path, earlier: Callable[[Path], list[Path]], what: str, overwrite: bool,
                  error: type[Exception] | None = None) -> bool:
    """Make ``--out`` ready for a command's output, before any model loads; returns whether it was created.

    It must be a folder (created if missing) that can be written, holding no earlier output
    (``earlier(out)`` lists it: files or folders) unless ``overwrite``; that output is then removed
    up front, so an interrupted rerun never leaves a stale summary next to a new trace.
    """
    import os
    import shutil

    from ..core.errors import ScriptError

    err = error or ScriptError
    if out.exists() and not out.is_dir():
        raise err(f"--out {out} is a file, not a folder")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise err(f"cannot create the output folder {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK):
        raise err(f"cannot write to the output folder {out}: permission denied")
    found = earlier(out)
    if found and not overwrite:
        raise err(f"{out} already holds {what} ({found[0].name}); choose another --out or pass --overwrite")
    for old in found:
        try:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        except OSError as exc:
            raise err(f"cannot replace {old}: {exc.strerror or exc}") from None
    return created


def progress_printer(label: str):
    last = {"stage": None}

    def progress(stage: str, frac):
        if stage != last["stage"]:
            last["stage"] = stage
            done = stage in ("ready", "done") or (frac is not None and frac >= 1.0)
            print(f"{label}: {stage}{'' if done else '…'}", file=sys.stderr, flush=True)

    return progress
