"""Flags and helpers shared by several subcommands (core only, no Qt).

The parsed session flags become SessionOptions in :mod:`kvinspect.core.session.options`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ..core.text_safety import terminal_text


def echo(text: object = "", *, file=None, end: str = "\n", flush: bool = False) -> None:
    """``print`` for text that holds anything from a trace, a script or a model: controls shown escaped.

    Newlines and tabs stay (tables, multi-line output); ESC, C1, NUL, bidi overrides and the rest
    cannot drive the terminal (docs/errors.md, "Hostile text").
    """
    print(terminal_text(text, keep="\n\t"), file=sys.stdout if file is None else file, end=end, flush=flush)



def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, metavar="SPEC",
                   help="built-in name (see `kvinspect models`), .gguf file, model folder or hub id")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps, multi-gpu")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bf16/fp16 on GPUs), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow code from the model repository to run (off by default)")


def add_session_args(p: argparse.ArgumentParser) -> None:
    from ..core.session.policies import CACHE_IMPLS, POLICIES

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


def out_arg(value: str, flag: str = "--out", error: type[Exception] | None = None) -> Path:
    """The path a flag names; an empty one is refused (``Path("")`` is the current folder, never meant)."""
    from ..core.errors import ScriptError

    if not value.strip():
        raise (error or ScriptError)(f"{flag} is empty; give a folder")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise (error or ScriptError)(f"{flag} holds a lone surrogate, not a path") from None
    return Path(value)


class SetAside:
    """An earlier output's files, moved to a hidden sibling folder until the new output is on disk.

    ``--overwrite`` must not lose the earlier output to a rerun that cannot start (a bad model, a bad
    template, a missing program): :meth:`restore` puts it back, :meth:`drop` deletes it once the new
    output is written. A rename: same filesystem, nothing copied, nothing half-moved on a full disk.
    """

    def __init__(self, out: Path, found: list[Path], error: type[Exception]):
        import os

        self.out = out
        self.folder = out.parent / f".{out.name}.kvinspect-previous-{os.getpid()}"
        self.names: list[str] = []
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for old in found:
                old.rename(self.folder / old.name)
                self.names.append(old.name)
        except OSError as exc:
            self.restore()
            raise error(f"cannot set the earlier run in {out} aside: {exc.strerror or exc}") from None

    def restore(self) -> None:
        """Put the earlier files back, replacing what the failed rerun wrote under their names."""
        import shutil

        for name in self.names:
            dst = self.out / name
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst, ignore_errors=True)
            else:
                dst.unlink(missing_ok=True)
            (self.folder / name).rename(dst)
        self.names = []
        self.drop()

    def drop(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)
        self.names = []


class ClaimedOut:
    """``--out`` claimed by :func:`claim_out_dir`, with the earlier output it held (if any) set aside.

    One protocol for ``run``, ``compare`` and ``trace``: the command calls :meth:`replaced` once its
    own output is on disk (the earlier output is then deleted); any exception before that (used as
    a context manager) or an explicit :meth:`abandon` removes what the command began writing, puts the
    earlier output back, and removes the folder again if it was made for this command and is empty.
    """

    def __init__(self, path: Path, created: bool, aside: SetAside | None, owns: Callable[[str], bool] | None = None):
        import os

        self.path = path
        self.created = created
        self.aside = aside
        self.owns = owns
        self.before = set(os.listdir(path))
        self.kept = False  # the command's own output is on disk: an error later leaves it there

    def replaced(self) -> None:
        self.kept = True
        if self.aside is not None:
            self.aside.drop()
            self.aside = None

    def abandon(self) -> None:
        import os
        import shutil

        if self.kept:
            return
        # What the command began writing (a script.json, a trace's header) goes: it belongs to no run.
        owns = self.owns or (lambda name: False)
        for name in set(os.listdir(self.path)) - self.before:
            p = self.path / name
            if not owns(name):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if self.aside is not None:
            self.aside.restore()
            self.aside = None
        if self.created:
            try:
                self.path.rmdir()  # only when empty: nothing ran, leave no folder behind
            except OSError:
                pass

    def __enter__(self) -> ClaimedOut:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abandon()


def claim_out_dir(out: Path, earlier: Callable[[Path], list[Path]], what: str, overwrite: bool,
                  error: type[Exception] | None = None, owns: Callable[[str], bool] | None = None) -> ClaimedOut:
    """Make ``--out`` ready for a command's output, before any model loads.

    It must be a folder (created if missing) that can be written, holding no earlier output
    (``earlier(out)`` lists it: files or folders) unless ``overwrite``. That output is never
    deleted up front: it is moved to a hidden sibling (:class:`SetAside`) and comes back unless the
    command reports its own output on disk (:meth:`ClaimedOut.replaced`), so a rerun that cannot
    start loses nothing, and an interrupted one never leaves a stale summary next to a new trace.
    ``owns(name)``: the names the command writes; those it began writing are removed if it is abandoned.
    """
    import os

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
    return ClaimedOut(out, created, SetAside(out, found, err) if found else None, owns)


def progress_printer(label: str):
    last = {"stage": None}

    def progress(stage: str, frac):
        if stage != last["stage"]:
            last["stage"] = stage
            done = stage in ("ready", "done") or (frac is not None and frac >= 1.0)
            print(f"{label}: {stage}{'' if done else '…'}", file=sys.stderr, flush=True)

    return progress
