"""The inspector window (PySide6 + pyqtgraph). A thin view over kvinspect.core; never imported by core."""
