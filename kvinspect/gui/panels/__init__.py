"""The window's panels: chat, events, checklist, layer table, tokens, find box, viewer bar, model line."""
