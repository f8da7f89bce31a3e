"""``kvinspect diff TRACE_A TRACE_B``: where two traces of one conversation part (what the cache did, not timings)."""

from __future__ import annotations

from .common import echo


def add_parser(sub) -> None:
    p = sub.add_parser(
        "diff", help="where two traces of the same conversation part: caches, replies, events, classes, checklist",
        description="Compare two traces of the same script (two transformers versions, two machines, two "
                    "policies): per layer kind, the first turn and step where seen/stored/bytes differ; the first "
                    "differing generated token with 16 tokens of context; events one side raised and the other "
                    "did not; cache and layer classes; checklist items that differ. Prints \"no difference\" "
                    "when there is none. Timings are not compared.")
    p.add_argument("trace_a", metavar="TRACE_A", help="a trace .jsonl file or a folder holding trace.jsonl")
    p.add_argument("trace_b", metavar="TRACE_B", help="the other trace")
    p.add_argument("--names", default=None, metavar="A,B",
                   help="labels for the two sides (default: the transformers versions when they differ, else A,B)")
    p.add_argument("--markdown", action="store_true", help="print the section as Markdown (as compare.md has it)")
    p.add_argument("--json", action="store_true", help="print the section as JSON (as compare.json has it)")


def _names(args, a, b) -> tuple[str, str]:
    from ..core.errors import ScriptError

    if args.names is not None:
        parts = [x.strip() for x in args.names.split(",")]
        if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
            raise ScriptError(f"--names takes two different labels like old,new, got {args.names!r}")
        return parts[0], parts[1]
    va = (a.header.get("versions") or {}).get("transformers")
    vb = (b.header.get("versions") or {}).get("transformers")
    if va and vb and va != vb:
        return f"transformers {va}", f"transformers {vb}"
    return "A", "B"


def main(args, argv) -> int:
    from ..core.compare.trace_diff import diff_markdown, diff_records, diff_text
    from ..core.text_safety import json_dumps_utf8
    from ..core.trace.tracefile import read_trace, trace_path

    pa, pb = trace_path(args.trace_a), trace_path(args.trace_b)
    a, b = read_trace(pa), read_trace(pb)
    d = diff_records(a, b, _names(args, a, b), (str(pa), str(pb)))
    if args.json:
        print(json_dumps_utf8(d, indent=1))  # JSON escapes every control itself
    elif args.markdown:
        echo(diff_markdown(d))
    else:
        echo(diff_text(d))
    return 0
