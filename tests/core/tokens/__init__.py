"""Tests of kvinspect.core.tokens: the token view."""
