"""Report images from a real trace: right size, right data, legible, and SVG while Qt allows it.

The SVG test is the canary for the PySide6 pin: pyqtgraph 0.14's SVGExporter breaks on
Qt >= 6.11 (qt-and-ci.md §1.2); when the pin is lifted, it fails here first.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6 import QtGui

from kvinspect.child_render import render_in_child
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.trace.tracefile import read_trace
from kvinspect.gui.base.theme import KIND_COLORS
from kvinspect.gui.report_images.trace_figures import EXPORT_WIDTH, cache_figure, memory_figure, render
from tests.conftest import load_cached


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    script = ChatScript(["hello there, cache", "tell me more about windows", "and memory?"],
                        settings=GenerationSettings(max_new_tokens=40))
    return run_script(load_cached("tiny-gemma3"), script, out).trace


def _colors(img: QtGui.QImage, step: int = 3) -> set[tuple[int, int, int]]:
    out = set()
    for y in range(0, img.height(), step):
        for x in range(0, img.width(), step):
            c = img.pixelColor(x, y)
            out.add((c.red(), c.green(), c.blue()))
    return out


def _near(colors, rgb, tol=12) -> bool:
    return any(all(abs(a - b) <= tol for a, b in zip(c, rgb)) for c in colors)


def test_png_and_svg_from_a_trace(qapp, trace, tmp_path):
    files, notes = render(trace, tmp_path, ("png", "svg"))
    assert notes == []
    assert sorted(f.name for f in files) == ["cache.png", "cache.svg", "memory.png", "memory.svg"]
    for name in ("cache", "memory"):
        img = QtGui.QImage(str(tmp_path / f"{name}.png"))
        assert img.width() == EXPORT_WIDTH and 800 < img.height() < 1400
        colors = _colors(img)
        assert len(colors) > 200
        assert (255, 255, 255) in colors  # white background: readable on GitHub light and dark pages
    cache = _colors(QtGui.QImage(str(tmp_path / "cache.png")), step=2)
    assert _near(cache, (253, 231, 37))  # viridis top: the full layer at the last step
    # The kind band, in the window's colours.
    assert _near(cache, QtGui.QColor(KIND_COLORS["sliding"]).getRgb()[:3], tol=4)
    assert _near(cache, QtGui.QColor(KIND_COLORS["full"]).getRgb()[:3], tol=4)
    svg = (tmp_path / "cache.svg").read_text(encoding="utf-8")
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}path")) > 10
    assert "window_reached" in svg and "turn 3" in svg


def test_figures_plot_the_trace_data(qapp, trace):
    rec = read_trace(trace)
    win = cache_figure(rec)
    images = [it for it in win.scene().items() if isinstance(it, pg.ImageItem)]
    heat = next(it for it in images if it.image.ndim == 2)
    assert heat.image.shape == (rec.n_layers, rec.n_steps)
    assert np.array_equal(heat.image, rec.stored.T.astype(np.float32))
    curves = [it for it in win.scene().items() if isinstance(it, pg.PlotDataItem)]
    totals = {float(c.yData[-1]) for c in curves if c.yData is not None and len(c.yData) == rec.n_steps}
    assert {float(rec.seen[-1].sum()), float(rec.stored[-1].sum())} <= totals
    mem = memory_figure(rec)
    kv_plot, proc_plot = mem.ci.getItem(2, 0), mem.ci.getItem(3, 0)
    kv = [c for c in kv_plot.listDataItems() if c.yData is not None and len(c.yData) == rec.n_steps]
    assert max(float(c.yData[-1]) for c in kv) == pytest.approx(rec.nbytes[-1].sum() / 1024)  # KiB: tiny model
    rss = [c for c in proc_plot.listDataItems() if c.yData is not None and len(c.yData) == rec.n_steps]
    div = rec.rss.max() / float(rss[0].yData.max())  # the unit follows the size (MiB alone, GiB in a big process)
    unit = {1 << 20: "MiB", 1 << 30: "GiB"}[int(round(div))]
    assert f"process memory ({unit})" in proc_plot.getAxis("left").labelText
    win.close()
    mem.close()


def test_damaged_and_empty_traces_still_render(qapp, trace, tmp_path):
    lines = trace.read_bytes().split(b"\n")
    i = next(k for k, ln in enumerate(lines) if ln.startswith(b'{"type":"steps"'))
    lines[i] = lines[i][:50] + b"##" + lines[i][80:]
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"\n".join(lines))
    files, notes = render(damaged, tmp_path / "d", ("png",))
    assert [f.name for f in files] == ["cache.png", "memory.png"] and notes == []
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(lines[0] + b"\n")
    files, _ = render(empty, tmp_path / "e", ("png",))
    assert len(files) == 2 and QtGui.QImage(str(files[0])).width() == EXPORT_WIDTH


def test_rendering_in_process_leaves_pyqtgraphs_options_as_they_were(qapp, trace, tmp_path):
    """A window in the same process draws with its own options afterwards (antialiased window lines
    once failed a pixel test that ran after a render on the same pytest worker)."""
    keys = ("background", "foreground", "antialias", "imageAxisOrder")
    before = {k: pg.getConfigOption(k) for k in keys}
    render(trace, tmp_path, ("png",))
    assert {k: pg.getConfigOption(k) for k in keys} == before


def test_child_process_route_used_by_the_cli(trace, tmp_path):
    res = render_in_child("trace", trace, tmp_path)
    assert res.notes == [] and sorted(p.name for p in res.files) == ["cache.png", "cache.svg", "memory.png",
                                                                     "memory.svg"]


def test_svg_export_canary(qapp, tmp_path):
    """pyqtgraph's SVGExporter on the pinned PySide6 (< 6.11); fails first the day the pin is lifted."""
    w = pg.PlotWidget()
    w.plot([0, 1, 2, 3], [0, 1, 0, 1])
    w.resize(400, 300)
    w.show()
    qapp.processEvents()
    pg.exporters.SVGExporter(w.plotItem).export(str(tmp_path / "canary.svg"))
    assert ET.parse(tmp_path / "canary.svg").getroot().tag.endswith("svg")
    w.close()


def test_missing_trace_is_a_clean_error(qapp, tmp_path):
    from kvinspect.core.errors import TraceError

    with pytest.raises(TraceError):
        render(tmp_path / "nope.jsonl", tmp_path, ("png",))
    shutil.rmtree(tmp_path, ignore_errors=True)
