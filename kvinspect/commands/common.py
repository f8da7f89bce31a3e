"""Flags and helpers shared by several subcommands (core only, no Qt)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
import json
import sys
from pathlib import Path


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, metavar="SPEC",
                   help="built-in name (see `kvinspect models`), .gguf file, model folder or hub id")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps, multi-gpu")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bf16/fp16 on GPUs), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow code from the model repository to run (off by default)")


def add_session_args(p: argparse.ArgumentParser) -> None:
    from ..core.session import CACHE_IMPLS, POLICIES

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


def parse_kv(items: list[str]) -> dict:
    from ..core.errors import ScriptError

    out = {}
    for item in items:
        if "=" not in item:
            raise ScriptError(f"--generation-config expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = None if v.strip().lower() in ("none", "null") else v
    return out


def read_chat_template(path: str) -> str:
    from ..core.errors import ScriptError

    p = Path(path)
    if p.is_dir():
        raise ScriptError(f"chat template {path} is a folder, not a Jinja file")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"chat template not found: {path}") from None
    except UnicodeDecodeError:
        raise ScriptError(f"chat template {path} is not UTF-8 text (a Jinja chat template was expected)") from None
    except OSError as exc:
        raise ScriptError(f"cannot read the chat template {path}: {exc.strerror or exc}") from None
    if not text.strip():
        raise ScriptError(f"chat template {path} is empty")
    return text


#: Types of the generation_config fields people set by hand (5.x defaults are all None, so the
#: defaults cannot tell them).
_GEN_TYPES = {
    **dict.fromkeys(("max_new_tokens", "min_new_tokens", "max_length", "min_length", "top_k", "num_beams",
                     "num_return_sequences", "no_repeat_ngram_size"), int),
    **dict.fromkeys(("temperature", "top_p", "min_p", "typical_p", "repetition_penalty", "length_penalty"), float),
    **dict.fromkeys(("do_sample", "use_cache", "return_dict_in_generate"), bool),
}


def check_generation_config(values: dict) -> dict:
    """Refuse --generation-config values that generate() would only reject mid-turn."""
    from ..core.errors import ScriptError

    for key, value in values.items():
        if not key:
            raise ScriptError("--generation-config: empty key")
        want = _GEN_TYPES.get(key)
        if value is None or want is None:
            continue
        if want is bool:
            ok = isinstance(value, bool)
        elif want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            raise ScriptError(f"--generation-config {key}={value!r}: expected {'a number' if want is float else want.__name__}")
        if want is int and value < 0:
            raise ScriptError(f"--generation-config {key}={value}: must not be negative")
    impl = values.get("cache_implementation")
    if impl is not None:
        known = _cache_implementations()
        if known and impl not in known:
            raise ScriptError(f"--generation-config cache_implementation={impl!r} is not one this transformers "
                              f"knows: {', '.join(sorted(known))}")
    return values


def _cache_implementations() -> set[str]:
    try:
        from transformers.generation import configuration_utils as cu
    except ImportError:  # pragma: no cover - layout of a future transformers
        return set()
    names = getattr(cu, "ALL_CACHE_IMPLEMENTATIONS", None)
    return set(names) if names else set()


def session_options(args):
    """SessionOptions from the shared flags (the script's own settings are applied by the runner)."""
    from ..core.errors import ScriptError
    from ..core.session import SessionOptions, check_cache_impl, check_policy

    opts = SessionOptions(policy=check_policy(args.policy), cache_impl=check_cache_impl(args.cache))
    if getattr(args, "chat_template", None):
        opts.chat_template = read_chat_template(args.chat_template)
        opts.chat_template_name = str(args.chat_template)
    if args.max_cache_len is not None and args.max_cache_len < 1:
        raise ScriptError("--max-cache-len must be positive")
    opts.max_cache_len = args.max_cache_len
    opts.generation_config = check_generation_config(parse_kv(args.generation_config))
    opts.respect_generation_config = args.respect_generation_config
    if args.system is not None:
        opts.system = args.system
    return opts


def check_fixed_choice(opts) -> None:
    """For a run whose policy and cache stay fixed (``run``; the window can switch them later)."""
    from ..core.errors import ScriptError

    if opts.policy == "nocache" and opts.cache_impl != "dynamic":
        raise ScriptError(f"--policy nocache runs without a cache object, so --cache {opts.cache_impl} would be "
                          "ignored; drop one of them")
    if opts.max_cache_len is not None and opts.cache_impl != "static":
        raise ScriptError(f"--max-cache-len sizes a static cache; with --cache {opts.cache_impl} it would be "
                          "ignored (add --cache static)")


def apply_script_overrides(script, args):
    if getattr(args, "max_new_tokens", None) is not None:
        script.settings.max_new_tokens = args.max_new_tokens
    if getattr(args, "seed", None) is not None:
        script.settings.seed = args.seed
    if getattr(args, "system", None) is not None:
        script.system = args.system
    from ..core.errors import ScriptError

    try:
        script.settings.validate()
    except ScriptError as exc:
        raise ScriptError(f"command line: {exc}") from None
    return script


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
