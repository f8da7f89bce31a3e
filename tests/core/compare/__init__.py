"""Tests of kvinspect.core.compare: compare mode."""
