"""The headless commands end to end: exit codes, kvinspect trace, --overwrite."""
