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
            src = self.current_source()
        except KvInspectError as exc:
            self.errors.report("Save trace", str(exc))
            return None
        if path is None:
            path, _ = QtWidgets.QFileDialog.getSaveFileName(self, "Save trace", f"{src.name}-trace.jsonl",
                                                            "kvinspect traces (*.jsonl)")
            if not path:
                return None
        task = save_export_copy.save_trace(src, path, jobs=self, parent=self)
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

    def export_report(self, out_dir, *, redact: bool = False, screenshot: bool = True, plots: bool = True):
        """The bug-report bundle of what is on screen (a job; raises KvInspectError when there is nothing).

        The screenshot is grabbed here, on the GUI thread, before the job starts."""
        src = self.current_source()
        png = self.screenshot_png() if screenshot else None
        return save_export_copy.export_report(src, out_dir, jobs=self, parent=self, redact=redact, screenshot=png,
                                              plots=plots)

    def current_source(self) -> save_export_copy.Source:
        """The record on screen and where it came from; raises KvInspectError when there is nothing to save."""
        v = self.viewer
        if v.mode and v.record is not None:
            return save_export_copy.Source(v.record, v.exact_file, v.path.name if v.path else "trace", False,
                                           save_export_copy.slug(((v.record.header.get("model") or {}).get("name"))
                                                                 or "trace"))
        if self.info is None or self.info.record is None:
            raise KvInspectError("nothing to save yet: load a model and chat, or open a trace (File → Open trace…)")
        if self.controller.busy == "turn":
            raise KvInspectError("a turn is running: wait for it to finish (or stop it, Esc), then save or export")
        return save_export_copy.Source(self.info.record, None, f"live session ({self.info.name})", True,
                                       save_export_copy.slug(self.info.name))

    def screenshot_png(self) -> bytes:
        """The window as PNG bytes, rendered up to date first (UI thread only)."""
        from PySide6 import QtCore

        self.refresh(force=True)
        QtWidgets.QApplication.processEvents()
        self.refresh(force=True)
        buf = QtCore.QBuffer()
        buf.open(QtCore.QIODevice.OpenModeFlag.WriteOnly)
        self.grab().toImage().save(buf, "PNG")
        return bytes(buf.data())

    # save_export_copy.EvidenceJobs: while a job reads the record, no new turn (live) / no poll (follow)
    def job_started(self, task, source) -> None:
        self.tasks.append(task)
        if source.live:
            self.evidence_jobs += 1
        else:
            self.viewer.pause(True)

    def job_ended(self, task, source) -> None:
        if source.live:
            self.evidence_jobs -= 1
        else:
            self.viewer.pause(False)
        if task in self.tasks:
            self.tasks.remove(task)

    def _copy(self, make, *args) -> str | None:
        try:
            text, what = make(*args)
        except KvInspectError as exc:
            self.errors.report("Copy as Markdown", str(exc))
            return None
        QtWidgets.QApplication.clipboard().setText(text)
        self.statusBar().showMessage(f"copied {what} as Markdown", 4000)
        return text

    def copy_turns(self) -> str | None:
        return self._copy(save_export_copy.turns_text, self.record)

    def copy_layers(self) -> str | None:
        """The per-layer table at the step shown (the replay step, or the latest)."""
        return self._copy(save_export_copy.layers_text, self.record, self.step)

    def copy_event(self, index: int | None = None) -> str | None:
        """One event's explanation (the selected one by default)."""
        return self._copy(save_export_copy.event_text, self.record,
                          self.events.selected_index() if index is None else index)

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
