"""What a report writer is given to draw its images: a :class:`Renderer`, chosen by the caller.

The core never imports Qt (a test enforces it), so it does not draw and does not know who
does. :func:`kvinspect.core.report.bundle.write_report` and
:func:`kvinspect.core.compare.report.write_report` take ``renderer``: a callable
``renderer(kind, input_path, out_dir, formats) -> PlotResult`` that writes the images of
``kind`` (``"trace"``: ``cache``/``memory`` of a trace file; ``"compare"``: the figures of a
``compare.json``) into ``out_dir``. It reports what it could not draw as notes instead of
raising (e.g. Qt missing on a GPU server). The CLI and the window pass
:func:`kvinspect.child_render.render_in_child`, which runs ``python -m kvinspect.gui.report_images.child_entry``
on Qt's offscreen platform. With no renderer, a report is written without images and says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

#: The note a report carries when it was written without a renderer.
NO_RENDERER = "plots skipped: no renderer was given (kvinspect report and the window's export draw them)"


@dataclass
class PlotResult:
    """The image files a renderer wrote, and notes on what it skipped."""

    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Renderer(Protocol):
    """``renderer(kind, input_path, out_dir, formats) -> PlotResult``; see the module docstring."""

    def __call__(self, kind: str, input_path: str | os.PathLike, out_dir: str | os.PathLike,
                 formats: tuple[str, ...]) -> PlotResult: ...
