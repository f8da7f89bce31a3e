"""kvinspect's Qt-free core: loading, probing, observing, sessions, traces, reports.

Nothing under this package imports Qt or pyqtgraph (a test enforces it), so scripts, the
CLI and GPU servers can use it without a display. Heavy imports (torch, transformers)
happen inside the functions that need them.
"""
