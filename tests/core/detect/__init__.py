"""Tests of kvinspect.core.detect: the detectors and the diagnoses."""
