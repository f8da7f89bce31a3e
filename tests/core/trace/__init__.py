"""Tests of kvinspect.core.trace: the trace file, the record, the stream, autosaves, damaged traces."""
