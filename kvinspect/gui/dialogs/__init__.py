"""The window's dialogs: model picker, export, follow, about, reuse policies."""
