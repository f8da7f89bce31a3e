"""Evidence for bug reports: the report bundle, plus the Markdown the GUI copies to the clipboard.

:func:`write_report` turns a trace (or a live record) into a folder that reads anywhere,
offline, without kvinspect: ``report.md`` (renders on GitHub), ``summary.json``, a copy of the
trace, ``script.json`` and the command that reproduces the session, and the plots
(``cache.png``, ``memory.png``, SVG twins) drawn by the ``renderer`` the caller passes (the CLI
and the window pass one that renders headless in a child process). With ``redact`` every
file is built from a redacted copy of the record (:mod:`.redact`), so no text of the
conversation leaves. See docs/reports.md.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kvinspect.core.errors import TraceError
from kvinspect.core.report.md_snippets import event_markdown, layer_table_markdown, turn_layers_markdown, turns_markdown
from kvinspect.core.report.renderer import NO_RENDERER, Renderer
from kvinspect.core.report.report_md import PLOTS, REPORT_NAME, SUMMARY_NAME, WINDOW_NAME, report_markdown
from kvinspect.core.report.reproduce import SCRIPT_NAME, Reproduction, reproduce
from kvinspect.core.text_safety import utf8_safe
from kvinspect.core.trace.record import TraceRecord
from kvinspect.core.trace.redact import redact_record
from kvinspect.core.trace.summary import write_summary
from kvinspect.core.trace.tracefile import TRACE_NAME, read_trace, trace_path, write_trace

__all__ = [
    "ReportResult", "event_markdown", "layer_table_markdown", "report_markdown", "turn_layers_markdown",
    "turns_markdown", "write_report",
]
#: Files a previous bundle in the same folder may have left; removed first so nothing stale
#: (such as an unredacted script.json) survives a redacted export.
_BUNDLE_FILES = (REPORT_NAME, SUMMARY_NAME, TRACE_NAME, SCRIPT_NAME, WINDOW_NAME,
                 *(f"{k}.{ext}" for k in PLOTS for ext in ("png", "svg")))


@dataclass
class ReportResult:
    """What :func:`write_report` wrote, and what it could not (plots skipped, …)."""

    out_dir: Path
    report: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reproduction: Reproduction | None = None
    trace_notes: list[str] = field(default_factory=list)


# -- the bundle --------------------------------------------------------------------------------------

def write_report(source: TraceRecord | str | os.PathLike, out_dir: str | os.PathLike, *, redact: bool = False,
                 plots_enabled: bool = True, screenshot: str | os.PathLike | bytes | None = None,
                 trace_file: str | os.PathLike | None = None,
                 formats: tuple[str, ...] = ("png", "svg"), renderer: Renderer | None = None) -> ReportResult:
    """Write a report bundle for a trace file/folder or a record.

    Parameters
    ----------
    source
        A ``trace.jsonl``, a folder holding one, or a :class:`TraceRecord` (the GUI's session).
    out_dir
        The bundle folder; created if needed. Files of an earlier bundle there are replaced.
    redact
        Replace the conversation (prompts, replies, system prompt, quoted excerpts) by token
        counts in every file; ``script.json`` is then left out.
    plots_enabled
        Draw the ``cache``/``memory`` images with ``renderer``; when False (``--no-plots``) the
        bundle says they were not rendered.
    screenshot
        A PNG of the window to include (the GUI's export): a file path or the PNG bytes.
    trace_file
        The file ``source`` (a record) was read from or is autosaved to: copied verbatim when
        not redacting, so the bundle holds the exact bytes, damage included.
    formats
        Image formats to render.
    renderer
        Draws the images (:class:`~kvinspect.core.report.renderer.Renderer`), e.g.
        :func:`kvinspect.child_render.render_in_child`. Without one the bundle is complete but
        for the images, and ``report.md`` says the plots were skipped.

    Returns
    -------
    ReportResult
        The files written and notes on anything skipped.
    """
    if isinstance(source, TraceRecord):
        record = source
        src_file = Path(trace_file) if trace_file else None
    else:
        src_file = trace_path(source)
        record = read_trace(source)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TraceError(f"--out {out_dir} is a file; give a folder for the report")
    if src_file is not None and src_file.exists() and (out / TRACE_NAME).exists() \
            and (out / TRACE_NAME).samefile(src_file):
        raise TraceError(f"--out {out_dir} is the trace's own folder; give another folder (the bundle copies "
                         f"the trace into it)")
    earlier = (out / REPORT_NAME).is_file()
    if out.is_dir() and not earlier and any(not p.name.startswith(".") for p in out.iterdir()):
        raise TraceError(f"--out {out_dir} is not empty and holds no earlier report; give a new or empty folder "
                         f"so nothing there is overwritten")
    out.mkdir(parents=True, exist_ok=True)
    if earlier:  # replace the earlier bundle entirely: a stale unredacted script.json must not survive
        for name in _BUNDLE_FILES:
            (out / name).unlink(missing_ok=True)
        for stale in out.glob("*.jinja"):
            stale.unlink()

    rec = redact_record(record) if redact else record
    notes: list[str] = []
    written: list[Path] = []
    dst = out / TRACE_NAME
    if not redact and src_file is not None and src_file.is_file():
        shutil.copyfile(src_file, dst)  # the exact bytes, damage included
    else:
        # A rewritten trace would read back clean: carry the reader's notes over as a note.
        write_trace(dst, _with_source_notes(rec) if rec.notes else rec)
    written.append(dst)
    written.append(write_summary(out / SUMMARY_NAME, rec))
    rep = reproduce(rec)
    if rep.script is not None and not redact:
        written.append(rep.script.save(out / SCRIPT_NAME))
    if rep.template_name and rep.template_text:
        p = out / rep.template_name
        p.write_text(utf8_safe(rep.template_text), encoding="utf-8")  # a trace's lone surrogate, written visibly
        written.append(p)

    images: dict[str, list[str]] = {}
    if plots_enabled and renderer is None:
        notes.append(NO_RENDERER)
    elif plots_enabled and renderer is not None:
        # One renderer call for every image; a redacted copy has no ids, so no tokens.png.
        res = renderer("trace" if redact else "trace+tokens", dst, out, formats)
        notes += res.notes
        for f in res.files:
            f = Path(f)
            written.append(f)
            images.setdefault(f.stem, []).append(f.name)
    else:
        notes.append("plots not rendered (--no-plots)")
    shot = None
    if screenshot is not None:
        p = out / WINDOW_NAME
        if isinstance(screenshot, bytes):
            p.write_bytes(screenshot)
        else:
            shutil.copyfile(screenshot, p)
        written.append(p)
        shot = p.name

    report = out / REPORT_NAME
    names = [REPORT_NAME] + [p.name for p in written]
    report.write_text(report_markdown(rec, reproduction=rep, images=images, screenshot=shot, image_notes=notes,
                                      files=names), encoding="utf-8")
    return ReportResult(out, report, [report, *written], notes, rep, list(record.notes))


def _with_source_notes(record: TraceRecord) -> TraceRecord:
    """A shallow stand-in for ``record`` whose header carries its notes (the original is untouched)."""
    import copy

    clone = copy.copy(record)
    clone.header = copy.deepcopy(record.header)
    clone.header.setdefault("notes", {})["source_trace_notes"] = list(record.notes)
    return clone
