"""The ``kvinspect`` command. Headless subcommands import only the Qt-free core.

Each subcommand lives in :mod:`kvinspect.commands` as a module with ``add_parser(sub)``
and ``main(args, argv) -> int``. With no subcommand the window opens. A user's mistake
(bad spec, bad file, bad flag) prints one line on stderr and exits 2, never a traceback. A
fault of the machine (out of memory, a full disk or an I/O error while writing) prints one
line and exits 1, like a turn that failed. (``kvinspect trace`` exits with its program's code,
and 126/127 when the program cannot be started.)
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from .core.errors import KvInspectError, runtime_fault
from .core.text_safety import terminal_text

EXIT_FAULT = 1
EXIT_USAGE = 2

#: Subcommand modules under kvinspect.commands, in the order --help lists them.
COMMANDS = ("run", "report", "view", "tokens", "compare", "diff", "trace", "models", "gui", "engine")


#: Environment variables kvinspect sets for its own process only (not for a traced program).
QUIETED: dict[str, str] = {}


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's default prints the usage too)
        self.exit(EXIT_USAGE, f"kvinspect: error: {message} (see `{self.prog} --help`)\n")


def _command_modules():
    mods = []
    for name in COMMANDS:
        try:
            mods.append((name, importlib.import_module(f".commands.{name}", __package__)))
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.commands.{name}":
                raise
    return mods


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    from . import __version__

    parser = Parser(prog="kvinspect", description="Inspect the KV cache of Hugging Face transformers models. "
                    "With no command, the inspector window opens.")
    parser.add_argument("--version", action="version", version=f"kvinspect {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more (to stderr)")
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    handlers = {}
    for name, mod in _command_modules():
        mod.add_parser(sub)
        handlers[name] = mod.main
    return parser, handlers


class InertFormatter(logging.Formatter):
    """Log lines for a terminal: controls, escape sequences and bidi characters shown escaped (newlines kept)."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_text(super().format(record), keep="\n\t")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, handlers = build_parser()
    top_flags = {"-h", "--help", "--version"}
    if not any(a in handlers for a in argv) and not top_flags & set(argv):
        # Bare `kvinspect [--model X ...]` opens the window.
        verbose = [a for a in argv if a in ("-v", "--verbose")]
        rest = [a for a in argv if a not in ("-v", "--verbose")]
        if rest and not rest[0].startswith("-"):
            print(f"kvinspect: error: unknown command {rest[0]!r}; commands: {', '.join(handlers)} "
                  "(see `kvinspect --help`)", file=sys.stderr)
            return EXIT_USAGE
        argv = [*verbose, "gui", *rest]
    args = parser.parse_args(argv)
    fmt = "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=fmt)
    for h in logging.getLogger().handlers:  # a log line can quote a trace, a model or an engine's stderr
        if type(h) is logging.StreamHandler:
            h.setFormatter(InertFormatter(fmt))
    if not args.verbose:
        quiet_libraries()
    try:
        return handlers[args.command](args, argv) or 0
    except KvInspectError as exc:
        print(f"kvinspect: error: {terminal_text(exc)}", file=sys.stderr)  # it may quote a trace or a script
        return exc.exit_code  # 2 for the user's mistakes; RuntimeFault and the trace command's own say otherwise
    except (MemoryError, RuntimeError, OSError) as exc:
        fault = runtime_fault(exc)  # out of memory, disk full, an I/O error: the machine's, not the user's
        if fault is not None:
            print(f"kvinspect: error: {fault}", file=sys.stderr)
            return EXIT_FAULT
        if not isinstance(exc, OSError):
            raise  # any other RuntimeError is a bug: its traceback helps
        # A path the user gave that cannot be read or written (commands check the usual cases
        # up front; this is the net for the rest).
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvinspect: error: {terminal_text(where)}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvinspect: interrupted", file=sys.stderr)
        return 130


def gui_main() -> int:
    """The ``kvinspect-gui`` launcher (pyproject's gui-scripts): ``kvinspect gui ARGS``.

    ``APP engine`` is the window's own engine child when the app is one executable (a PyInstaller
    bundle: :func:`kvinspect.engine.launch.engine_command`).
    """
    if sys.argv[1:2] == ["engine"]:
        return main(sys.argv[1:])
    return main(["gui", *sys.argv[1:]])


def quiet_libraries() -> None:
    # TQDM_DISABLE: transformers' GGUF loader draws its own tqdm bar, which no setting of
    # transformers turns off; we print our own loading stages instead.
    for key, value in (("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                       ("TOKENIZERS_PARALLELISM", "false"), ("TQDM_DISABLE", "1")):
        if key not in os.environ:
            os.environ[key] = QUIETED[key] = value
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="transformers")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
