"""Tests of kvinspect.core.observe: the user's own loop, observed."""
