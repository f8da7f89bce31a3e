"""Tests of kvinspect.core.model: the catalogue, loading, fetching, the conversion cache, real models."""
