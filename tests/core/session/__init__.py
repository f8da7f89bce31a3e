"""Tests of kvinspect.core.session: the chat session, the turn pipeline, policies, scripts."""
