"""``kvinspect tokens TRACE [--turn N] [--step K]``: the token view in a terminal.

The same cells as the window's Tokens panel, from the trace alone (no model, no Qt): the
states as colours on a TTY, as brackets and markers when piped or with ``NO_COLOR`` set.
"""

from __future__ import annotations

import os
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("tokens", help="print which tokens of the conversation each layer still holds, at a step",
                       description="Print the conversation as its tokens at one step of a trace, each marked "
                                   "with where it stands: held by every layer, evicted from the sliding/chunked "
                                   "layers, fed twice, cropped at a divergence, never cached. Default: the last "
                                   "step. Colours only on a terminal and never with NO_COLOR.")
    p.add_argument("trace", metavar="TRACE", help="a trace.jsonl, or the folder holding one")
    p.add_argument("--turn", type=int, metavar="N", help="turn N (from 1): its last step, or with --step, "
                                                          "step K of that turn")
    p.add_argument("--step", type=int, metavar="K", help="step K of the trace (from 0), or of --turn's turn")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="auto: only on a terminal and without NO_COLOR (default)")


def pick_step(record, turn: int | None, step: int | None) -> int:
    """The step the options name; ScriptError (exit 2) when it is not in the trace."""
    from ..core.errors import ScriptError

    n = record.n_steps
    if not n:
        raise ScriptError("the trace has no forward pass to show")
    if turn is None:
        if step is None:
            return n - 1
        if not 0 <= step < n:
            raise ScriptError(f"--step {step} is not in the trace (steps 0–{n - 1})")
        return step
    if not 1 <= turn <= len(record.turns):
        raise ScriptError(f"--turn {turn} is not in the trace (turns 1–{len(record.turns)})")
    t = record.turns[turn - 1]
    first = t.first_step
    end = t.end_step if t.end_step > first else n
    if end <= first:
        raise ScriptError(f"turn {turn} made no forward pass")
    if step is None:
        return end - 1
    if not 0 <= step < end - first:
        raise ScriptError(f"--step {step} is not in turn {turn} (its steps are 0–{end - first - 1})")
    return first + step


def use_color(mode: str, stream=None) -> bool:
    stream = sys.stdout if stream is None else stream
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    if mode == "always":
        return True
    return bool(getattr(stream, "isatty", lambda: False)())


def main(args, argv) -> int:
    from ..core.text_safety import terminal_text
    from ..core.tokens.states import token_view
    from ..core.tokens.text import header_lines, legend, token_text
    from ..core.trace.tracefile import read_trace

    record = read_trace(args.trace)  # TraceError: one line, exit 2
    step = pick_step(record, args.turn, args.step)
    view = token_view(record, step)
    color = use_color(args.color)
    out = sys.stdout
    try:
        for line in header_lines(view, len(record.turns)):
            out.write(terminal_text(line) + "\n")
        if len(view):
            out.write(legend(color) + "\n\n")
            out.write(token_text(view, color=color) + "\n")
        out.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
