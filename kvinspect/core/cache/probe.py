"""Read any transformers cache object: per-layer seen / stored / capacity / window / device / bytes.

Two speeds. :meth:`CacheProbe.lengths` runs after every forward pass: attribute reads and
shapes only, no device sync (static layers on an accelerator keep a counter advanced by the
forward's query length instead of reading their 0-d ``cumulative_length`` tensor), and only one
layer per group of same-kind layers (:mod:`.layer_groups`), so its cost is flat in the layer count.
:meth:`CacheProbe.snapshot` walks every tensor and storage (≈150 µs for 30 layers) and is
meant for the end of a turn or a throttled refresh. See docs/probe.md for what each field means.

The probe is one object built from the modules that hold its jobs: :mod:`.layer_shapes` (what a
layer is), :mod:`.identity` (which cache object), :mod:`.step_read` (the per-step read),
:mod:`.snapshot` (the end-of-turn snapshot) and :mod:`.byte_counts` (bytes per row, state, storage).
Its parts are base classes rather than members so that the step read's attribute reads stay what
they were (docs/probe.md).
"""

from __future__ import annotations

from kvinspect.core.cache.snapshot import CacheSnapshot, take_snapshot
from kvinspect.core.cache.step_read import StepRead


class CacheProbe(StepRead):
    """Reads caches of one model. Keeps a stable small integer id per cache object."""

    def snapshot(self, cache) -> CacheSnapshot:
        """Everything about ``cache`` including held bytes; may sync (end of turn only)."""
        return take_snapshot(self, cache)
