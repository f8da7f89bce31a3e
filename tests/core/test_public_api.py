"""The public ``kvinspect`` package: a light import, a typed ``observe()``, the types it hands out."""

from __future__ import annotations

import inspect
import subprocess
import sys
import tomllib

import kvinspect
from tests.helpers import ROOT


def test_import_kvinspect_stays_light():
    code = ("import sys, kvinspect\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'transformers'))\n"
            "assert not heavy, heavy\n"
            "kvinspect.observe, kvinspect.__version__, dir(kvinspect)\n"
            "assert 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_observe_has_the_full_signature_of_the_core_one():
    from kvinspect.core.observe import api

    public, core = inspect.signature(kvinspect.observe), inspect.signature(api.observe)
    assert list(public.parameters) == list(core.parameters)
    assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in public.parameters.values())
    for name, p in public.parameters.items():
        assert p.default == core.parameters[name].default, name
        assert p.annotation != inspect.Parameter.empty, name
    assert public.parameters["trace"].kind is inspect.Parameter.KEYWORD_ONLY  # README and docs pass trace=...
    assert public.parameters["on_event"].annotation == "Callable[[Event], None] | None"
    assert public.return_annotation == "Observation"


def test_types_are_exported_lazily():
    from kvinspect.core.detect.events import Event
    from kvinspect.core.observe.api import Observation
    from kvinspect.core.trace.record import TraceRecord, TurnRecord

    assert (kvinspect.Observation, kvinspect.TraceRecord, kvinspect.TurnRecord, kvinspect.Event) == (
        Observation, TraceRecord, TurnRecord, Event)
    assert {"Observation", "TraceRecord", "TurnRecord", "Event", "observe"} <= set(kvinspect.__all__)
    assert set(kvinspect.__all__) <= set(dir(kvinspect))
    try:
        kvinspect.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_the_package_says_it_is_typed():
    assert (ROOT / "kvinspect" / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["kvinspect"]
