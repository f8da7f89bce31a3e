"""What each layer is, as the window shows it: the core's one reading (:mod:`kvinspect.core.cache.layer_kinds`),
what the cache did at the last finished turn, else (before any turn) what the config asks for. For the
heatmap's layer axis, the layer picker, the tokens lane's window lines and the toolbar, as for the report."""

from __future__ import annotations

from kvinspect.core.cache.layer_kinds import kinds_runs as kinds_summary
from kvinspect.core.cache.layer_kinds import layer_kinds, layer_windows
from kvinspect.core.cache.layer_kinds import turn_layers as cache_layers

__all__ = ["cache_layers", "kinds_summary", "layer_kinds", "layer_windows"]
