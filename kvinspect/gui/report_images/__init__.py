"""Headless report figures (cache.png, memory.png, tokens.png, compare plots), drawn in a child process."""
