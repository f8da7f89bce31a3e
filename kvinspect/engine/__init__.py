"""The engine: the model's own process, speaking JSON lines on stdin/stdout (docs/engine-protocol.md).

``kvinspect engine`` runs :func:`.server.serve`. The window starts it (locally, or over ssh) and is
a pure view of its stream. Nothing here imports Qt; only :mod:`.server` (on the engine's side)
imports the model stack, lazily. :mod:`.protocol` and :mod:`.launch` are light and used by the window.
"""
