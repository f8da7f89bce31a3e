"""Tests of kvinspect.core.report: the report bundle and its Markdown."""
