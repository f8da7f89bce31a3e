"""Tests of kvinspect.core.cache: the probe, the layer kinds and groups, the observer, memory."""
