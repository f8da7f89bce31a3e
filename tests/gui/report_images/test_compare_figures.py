"""Compare plots: the figures hold one curve per configuration, and the headless export writes real images."""

from __future__ import annotations

import json

import pyqtgraph as pg
import pytest
from PySide6 import QtGui

from kvinspect.core.compare.configs import parse_configs
from kvinspect.core.compare.report import build_report, write_report
from kvinspect.core.compare.run import ComparePlan, run_compare
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.gui.report_images import compare_figures
from tests.conftest import load_cached


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    script = ChatScript(turns=["hello there", "second turn", "third"], settings=GenerationSettings(max_new_tokens=4))
    plan = ComparePlan(configs=parse_configs("dynamic,static,nocache,offloaded"), script=script, repeat=2,
                       turns_until_failure=6, prompt_lengths=[24, 48], conversation=True, max_cache_len=90)
    result = run_compare(load_cached("tiny-llama"), plan, out)
    write_report(result, out, plots=False)
    return out, build_report(result)


def _curves(plot: pg.PlotItem) -> list[str]:
    return [item.name() for item in plot.listDataItems() if item.name()]


def test_figures_have_one_curve_per_configuration(qtbot, compare_dir):
    _, data = compare_dir
    figs = dict(compare_figures.build_figures(data))
    assert list(figs) == ["latency_per_turn", "memory_per_turn", "stress", "prompt_lengths"]
    for name, w in figs.items():
        qtbot.addWidget(w)
    ran = ["dynamic", "static", "nocache"]  # offloaded is skipped on this CPU machine: no curve for it
    lat = figs["latency_per_turn"].ci
    ttft, total = lat.getItem(0, 0), lat.getItem(0, 1)
    assert _curves(ttft) == ran and _curves(total) == ran
    # static's KV line is flat at its capacity; dynamic's grows turn after turn
    mem = figs["memory_per_turn"].ci.getItem(0, 0)
    ys = {item.name(): item.getData()[1] for item in mem.listDataItems()}
    assert len(set(ys["static"].tolist())) == 1
    assert list(ys["dynamic"]) == sorted(ys["dynamic"]) and ys["dynamic"][0] < ys["dynamic"][-1]
    assert not ys["nocache"].any()
    # stress: the static run ends in a failure marker at the failing turn
    stress = figs["stress"].ci.getItem(0, 0)
    marks = [i for i in stress.items if isinstance(i, pg.ScatterPlotItem)]
    st = next(c for c in data["stress"]["configs"] if c["name"] == "static")
    assert st["failed_at_turn"] and len(marks) == 1
    assert marks[0].getData()[0][0] == st["failed_at_turn"]
    lengths = figs["prompt_lengths"].ci.getItem(0, 0)
    assert _curves(lengths) == ran
    ticks = lengths.getAxis("bottom")._tickLevels[0]
    assert [label for _, label in ticks] == ["24", "48"]


def test_window_colours_are_not_changed_for_everyone_else(qtbot, compare_dir):
    _, data = compare_dir
    before = (pg.getConfigOption("background"), pg.getConfigOption("foreground"))
    figs = compare_figures.build_figures(data, background="#202124", foreground="#E8EAED")
    for _, w in figs:
        qtbot.addWidget(w)
    assert (pg.getConfigOption("background"), pg.getConfigOption("foreground")) == before
    assert figs[0][1].backgroundBrush().color().name() == "#202124"


def test_render_writes_png_and_svg(qtbot, compare_dir, tmp_path):
    out, data = compare_dir
    files, notes = compare_figures.render(out / "compare.json", tmp_path, ("png", "svg"))
    names = sorted(f.name for f in files)
    assert names == sorted(f"{n}.{ext}" for n in ("latency_per_turn", "memory_per_turn", "stress", "prompt_lengths")
                           for ext in ("png", "svg")), notes
    for f in files:
        if f.suffix == ".png":
            img = QtGui.QImage(str(f))
            assert img.width() == compare_figures.SIZE[0] and img.height() > 400
            # not a blank canvas: many distinct colours (curves, text, grid)
            colours = {img.pixel(x, y) for x in range(0, img.width(), 7) for y in range(0, img.height(), 7)}
            assert len(colours) > 20, f.name
        else:
            assert "<svg" in f.read_text(encoding="utf-8")[:2000]


def test_headless_render_through_the_child_process(compare_dir, tmp_path):
    from kvinspect.child_render import render_in_child

    out, _ = compare_dir
    res = render_in_child("compare", out / "compare.json", tmp_path, formats=("png",))
    assert sorted(p.name for p in res.files) == sorted(
        f"{n}.png" for n in ("latency_per_turn", "memory_per_turn", "stress", "prompt_lengths")), res.notes


def test_nothing_measured_gives_a_note_not_an_error(qtbot, compare_dir, tmp_path):
    _, data = compare_dir
    empty = dict(data, configs=[dict(c, per_turn=[], status="skipped") for c in data["configs"]], stress=None,
                 lengths=None)
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(empty), encoding="utf-8")
    files, notes = compare_figures.render(path, tmp_path / "plots", ("png",))
    assert files == [] and notes and "no plots" in notes[0]


def test_cache_figure_overlays_both_sides_per_layer_kind(qtbot, tmp_path):
    # Two configurations of one environment get a diff section too: cache.png overlays their stored rows.
    script = ChatScript(turns=["hello there", "second turn"], settings=GenerationSettings(max_new_tokens=4))
    plan = ComparePlan(configs=parse_configs("dynamic,static"), script=script, repeat=1, max_cache_len=120)
    result = run_compare(load_cached("tiny-gemma3"), plan, tmp_path)
    data = build_report(result)
    (d,) = data["diff"]
    assert [s["kind"] for s in d["series"]] == ["sliding", "full"]
    figs = dict(compare_figures.build_figures(data))
    assert list(figs) == ["latency_per_turn", "memory_per_turn", "cache"]
    w = figs["cache"]
    qtbot.addWidget(w)
    for col, s in enumerate(d["series"]):
        plot = w.ci.getItem(0, col)
        names = _curves(plot)
        assert len(names) == 2 and names[0].startswith("dynamic (transformers ") and names[1].startswith("static")
        ya, yb = (item.getData()[1] for item in plot.listDataItems())
        # The same conversation: both sides store the same rows at every step (static bills capacity, not rows).
        assert list(ya) == s["a"] == s["b"] == list(yb)
        assert max(ya) > 0
