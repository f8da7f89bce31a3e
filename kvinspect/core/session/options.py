"""Session options (what a chat session runs with) and making them from parsed command-line flags.

Shared by ``kvinspect run``, ``compare``, the engine and the window.

The flags themselves are declared by :mod:`kvinspect.commands.common` (``add_session_args``);
this module turns the parsed ``argparse.Namespace`` into a checked
:class:`SessionOptions` and applies the per-run overrides to a
:class:`~kvinspect.core.session.script.ChatScript`. Every mistake raises
:class:`~kvinspect.core.errors.ScriptError` with one line, before any model loads.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvinspect.core.errors import ScriptError
from kvinspect.core.session.policies import check_cache_impl, check_policy
from kvinspect.core.session.script import GenerationSettings, check_text

if TYPE_CHECKING:
    from kvinspect.core.session.script import ChatScript


@dataclass
class SessionOptions:
    policy: str = "reuse"
    cache_impl: str = "dynamic"
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    system: str | None = None
    chat_template: str | None = None  # Jinja text replacing the tokenizer's template
    chat_template_name: str | None = None
    max_cache_len: int | None = None  # static caches; default: min(max_position_embeddings, 2048)
    generation_config: dict = field(default_factory=dict)  # overrides applied to model.generation_config
    respect_generation_config: bool = False  # True: let a colliding cache_implementation break generate()


def parse_kv(items: list[str]) -> dict:
    """``["KEY=VALUE", …]`` (``--generation-config``) → a dict; values are JSON where they parse."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ScriptError(f"--generation-config expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = None if v.strip().lower() in ("none", "null") else v
        except (RecursionError, ValueError):  # nested beyond reason, an integer of thousands of digits
            raise ScriptError(f"--generation-config {k.strip()}: the value is not a usable JSON value") from None
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise ScriptError(f"--generation-config {k.strip()}: holds a lone surrogate, not text") from None
    return out


def read_chat_template(path: str) -> str:
    """The text of a ``--chat-template`` file (a Jinja chat template)."""
    p = Path(path)
    if p.is_dir():
        raise ScriptError(f"chat template {path} is a folder, not a Jinja file")
    if p.exists() and not p.is_file():
        raise ScriptError(f"chat template {path} is not a regular file (a pipe or device); pass a Jinja file")
    if p.is_file() and p.stat().st_size > 16 << 20:
        raise ScriptError(f"chat template {path} is {p.stat().st_size:,} bytes, not a chat template")
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


def session_options(args: argparse.Namespace) -> SessionOptions:
    """SessionOptions from the shared flags (the script's own settings are applied by the runner)."""
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
        opts.system = check_text(args.system, "--system")
    return opts


def check_fixed_choice(opts: SessionOptions) -> None:
    """For a run whose policy and cache stay fixed (``run``; the window can switch them later)."""
    if opts.policy == "nocache" and opts.cache_impl != "dynamic":
        raise ScriptError(f"--policy nocache runs without a cache object, so --cache {opts.cache_impl} would be "
                          "ignored; drop one of them")
    if opts.max_cache_len is not None and opts.cache_impl != "static":
        raise ScriptError(f"--max-cache-len sizes a static cache; with --cache {opts.cache_impl} it would be "
                          "ignored (add --cache static)")


def apply_script_overrides(script: ChatScript, args: argparse.Namespace) -> ChatScript:
    """``--max-new-tokens``, ``--seed`` and ``--system`` over the script's own values, then checked."""
    if getattr(args, "max_new_tokens", None) is not None:
        script.settings.max_new_tokens = args.max_new_tokens
    if getattr(args, "seed", None) is not None:
        script.settings.seed = args.seed
    if getattr(args, "system", None) is not None:
        script.system = check_text(args.system, "--system")
    try:
        script.settings.validate()
    except ScriptError as exc:
        raise ScriptError(f"command line: {exc}") from None
    return script
