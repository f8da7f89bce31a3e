"""Not imported by kvinspect: this folder goes first on the PYTHONPATH of a program run by
``kvinspect trace``, so that its ``sitecustomize`` arms the tracer (see kvinspect.core.observe.tracer).
It is a package only so that wheels ship it."""
