"""``kvinspect engine``: the model's own process, driven by the window over stdin/stdout.

Not for typing at: the window (or ``ssh host python3 -m kvinspect engine``) starts it and speaks
JSON lines to it (docs/engine-protocol.md). The protocol owns the real stdout; everything else that
prints goes to stderr.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("engine", help="serve the window's model session over stdin/stdout (JSON lines; "
                                      "started by the window, see docs/engine-protocol.md)")
    p.add_argument("--heartbeat", type=float, default=None, help=argparse.SUPPRESS)


def main(args, argv) -> int:
    from ..engine.protocol import HEARTBEAT_S
    from ..engine.server import serve

    return serve(heartbeat_s=args.heartbeat or HEARTBEAT_S)
