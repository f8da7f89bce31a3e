"""Hypothesis profiles: ``ci`` (seeded, small, part of ``make test``) and ``fuzz`` (``make fuzz``: longer)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"derandomize": True, "database": None, "deadline": None,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.data_too_large]}
settings.register_profile("ci", max_examples=1, **_COMMON)  # each test scales it (see SCALE)
settings.register_profile("fuzz", max_examples=1, **_COMMON)
settings.load_profile(os.environ.get("KVINSPECT_FUZZ", "ci"))
#: How many times more examples ``make fuzz`` (KVINSPECT_FUZZ=fuzz) draws than the CI run.
SCALE = 20 if os.environ.get("KVINSPECT_FUZZ") == "fuzz" else 1
