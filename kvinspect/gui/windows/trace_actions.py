"""The window's trace actions: open, follow, save, export, copy as Markdown, compare (a MainWindow mixin).

Thin: each one resolves what the user asked for (a dialog when no path is given) and hands it
to :mod:`kvinspect.gui.windows.trace_modes` (view and follow modes), :mod:`kvinspect.gui.base.save_export_copy` (save, export, clipboard) or
:mod:`kvinspect.gui.windows.compare_window`. A user's mistake is one line in a non-modal dialog.
"""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtWidgets

from kvinspect.core.errors import KvInspectError
from kvinspect.gui.base import save_export_copy


class TraceActions:
    """Mixed into :class:`~kvinspect.gui.windows.main_window.MainWindow` (needs ``viewer``, ``errors``, ``statusBar()``)."""

    def open_trace(self, path: str | None = None):
        """Show a saved trace read-only with a replay slider (File → Open trace…, drag-and-drop)."""
        if path is None:
            path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Open a kvinspect trace", "",
                                                            "kvinspect traces (*.jsonl);;All files (*)")
            if not path:
                return None
        return self.viewer.open(path)

    def follow_trace(self, path: str | None = None, source=None):
        """Follow a trace file (or the newest in a folder) that another process is writing."""
        if path is None:
            from kvinspect.gui.dialogs.follow_dialog import FollowDialog

            if self.follow_dialog is None:
                self.follow_dialog = FollowDialog(self)
                self.follow_dialog.followRequested.connect(self.follow_trace)
            self.follow_dialog.show()
            self.follow_dialog.raise_()
            return None
        try:
            return self.viewer.follow(path, source)
        except KvInspectError as exc:
            self.errors.report("Cannot follow the trace", str(exc))
            return None

    def back_to_live(self) -> None:
        self.viewer.back_to_live()

    def save_trace(self, path: str | None = None):
        """Write the trace on screen (File → Save trace…): a job; ``done(Path)`` when written."""
        try:
            src = save_export_copy.current_source(self)
        except KvInspectError as exc:
            self.errors.report("Save trace", str(exc))
            return None
        if path is None:
            path, _ = QtWidgets.QFileDialog.getSaveFileName(self, "Save trace", f"{src.name}-trace.jsonl",
                                                            "kvinspect traces (*.jsonl)")
            if not path:
                return None
        task = save_export_copy.save_trace(self, path)
        task.done.connect(lambda p: self.statusBar().showMessage(f"trace saved to {p}", 8000))
        task.failed.connect(lambda msg: self.errors.report("Save trace", msg))
        return task

    def export_report_dialog(self):
        """File → Export report… (Ctrl+E): the non-modal export dialog, prepared for what is on screen."""
        from kvinspect.gui.dialogs.export_dialog import ExportDialog

        if self.export_dialog is None:
            self.export_dialog = ExportDialog(self)
        if not self.export_dialog.prepare():
            return None
        self.export_dialog.show()
        self.export_dialog.raise_()
        return self.export_dialog

    def _copy(self, fn, *args) -> str | None:
        try:
            return fn(self, *args)
        except KvInspectError as exc:
            self.errors.report("Copy as Markdown", str(exc))
            return None

    def copy_turns(self) -> str | None:
        return self._copy(save_export_copy.copy_turns)

    def copy_layers(self) -> str | None:
        return self._copy(save_export_copy.copy_layers)

    def copy_event(self, index: int | None = None) -> str | None:
        return self._copy(save_export_copy.copy_event, index)

    def open_compare(self):
        """Tools → Compare configurations… (Ctrl+K) for the loaded model."""
        from kvinspect.gui.windows.compare_window import CompareWindow

        if self.compare_window is None:
            self.compare_window = CompareWindow(self)
        self.compare_window.open_for_model()
        return self.compare_window


def is_trace_path(path: str) -> bool:
    """A dropped path that is a trace: a ``.jsonl`` file, or a folder holding ``trace.jsonl``."""
    p = Path(path)
    return (p.is_file() and p.suffix.lower() == ".jsonl") or (p.is_dir() and (p / "trace.jsonl").is_file())
