"""The windows: the main window with its menus and trace modes (view, follow, replay), Compare, the script driver."""
