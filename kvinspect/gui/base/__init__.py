"""The window's base: theme and palette, icons, accessible names, error dialogs and logs, background jobs."""
