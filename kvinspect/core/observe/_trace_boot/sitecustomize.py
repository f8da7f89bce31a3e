"""Runs first in a program started by ``kvinspect trace`` (this folder leads its PYTHONPATH).

It takes its folder off ``sys.path`` (the program sees the path it would have had), arms
kvinspect's tracer when ``KVINSPECT_TRACE_DIR`` is set, and runs the ``sitecustomize`` it
shadows, if there is one. It imports nothing heavy and prints nothing unless tracing cannot
start; the program's own behaviour, output and exit code are untouched.
"""

import os
import sys


def _kvinspect_boot() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    out = os.environ.get("KVINSPECT_TRACE_DIR")
    if out:
        try:
            from kvinspect.core.observe.tracer import arm
        except ImportError:
            # A Python without kvinspect installed: use the copy `kvinspect trace` came from.
            pkg = os.environ.get("KVINSPECT_TRACE_PKG")
            if not pkg or pkg in sys.path:
                return
            sys.path.append(pkg)
            try:
                from kvinspect.core.observe.tracer import arm
            except ImportError as exc:
                print(f"kvinspect: cannot trace this Python ({sys.executable}): {exc}", file=sys.stderr)
                return
        arm(out)


def _chain() -> None:
    """Run the sitecustomize this one shadows, as site.py would have."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - what site.py does with a broken sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)


# Called here, not from _kvinspect_boot: a function must not use a global the next line deletes.
_kvinspect_boot()
_chain()
del _kvinspect_boot, _chain
