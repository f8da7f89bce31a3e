"""docs/architecture.md names every module of the package once, in its folder: a new or moved file that the
tree does not list fails here (a package's ``__init__.py`` is named by its folder line)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def named_in_tree() -> list[str]:
    """The paths the tree (the doc's first code block) lists: ``kvinspect/...`` lines start a top-level path,
    indented ``name/`` and ``name.py`` lines sit in the nearest folder above them with less indentation."""
    block = DOC.read_text().split("```")[1]
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    out = []
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m:
            continue
        indent, token = len(m.group(1)), m.group(2)
        if not (token.endswith("/") or token.endswith(".py")) or not re.fullmatch(r"[\w./]+", token):
            continue  # a description's continuation
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = token if token.startswith("kvinspect/") else (stack[-1][1] + token if stack else None)
        if path is None:
            continue
        if token.endswith("/"):
            stack.append((indent, path))
            out.append(path)
        else:
            out.append(path)
    return out


def test_every_module_is_named_once_in_architecture_md():
    named = named_in_tree()
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kvinspect").rglob("*.py")
                   if "__pycache__" not in p.parts)
    folders = {f.rsplit("/", 1)[0] + "/" for f in files}
    missing = [f for f in files if f not in named and not (f.endswith("/__init__.py") and f[:-len("__init__.py")]
                                                           in named and f != "kvinspect/__init__.py")]
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)
    twice = sorted({p for p in named if named.count(p) > 1})
    assert not twice, "named more than once: " + ", ".join(twice)
    stale = [p for p in named if p not in files and p not in folders]
    assert not stale, "docs/architecture.md names what no longer exists: " + ", ".join(stale)


def test_the_tree_reader_sees_nested_folders():
    named = named_in_tree()
    assert "kvinspect/gui/lanes/heatmap_lane.py" in named
    assert "kvinspect/core/observe/_trace_boot/sitecustomize.py" in named
    assert "kvinspect/cli.py" in named
