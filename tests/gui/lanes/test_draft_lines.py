"""Rejected drafts in the lanes: where generate() cropped a verification forward's drafts off the cache
(prompt-lookup decoding, traced from an unmodified user program), a line on every lane, a legend entry
and the heatmap's readout say "draft rejected", so the stored dip is not read as an eviction."""

from __future__ import annotations

import sys

import pytest

from kvinspect.core.trace.record import TurnRecord
from kvinspect.core.trace.tracefile import read_trace
from kvinspect.gui.lanes.lanes_widget import draft_crops
from tests.gui.helpers import plots_showing, run_cli


@pytest.fixture(scope="module")
def lookup_trace(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lookup")
    out = tmp / "trace"
    r = run_cli(["trace", "--out", str(out), "-q", "--", sys.executable, "resources/examples/library_prompt_lookup_refeed.py",
                 "--model", "tiny-mistral", "--max-new-tokens", "12"], tmp)
    assert r.returncode == 0, r.stderr
    return read_trace(out)


def test_each_crop_is_a_line_on_every_lane_with_its_legend_and_readout(qtbot, lookup_trace):
    rec = lookup_trace
    crops = sorted((s, n) for t in rec.turns for s, n in t.settings["draft"]["crops"])
    assert crops, "prompt lookup on a repetitive chat rejects some drafts"
    w = plots_showing(qtbot, rec)
    assert w.draft_lines.positions() == [float(s) for s, _ in crops]
    for item in w.draft_lines.curves:  # the same lines on the heatmap, the tokens and the memory lane
        x, _ = item.getData()
        assert sorted(set(x.tolist())) == [float(s) for s, _ in crops]
    assert "draft rejected" in w.legend.text()
    step, n = crops[0]
    text = w.describe_cell(step, 0)
    assert f"draft rejected: {n:,} token" in text
    plain = next(s for s in range(rec.n_steps) if s not in dict(crops))
    assert "draft rejected" not in w.describe_cell(plain, 0)
    # Replaying to before the first crop shows none of them.
    w.render(rec, step=step - 1, force=True)
    assert w.draft_lines.positions() == []
    assert "draft rejected" not in w.legend.text()


def test_a_record_without_drafts_has_no_lines_and_no_legend_entry(qtbot, tmp_path):
    r = run_cli(["run", "--model", "tiny-llama", "--script", "resources/scripts/demo.json", "--out", str(tmp_path / "run"),
                 "--max-new-tokens", "4"], tmp_path)
    assert r.returncode == 0, r.stderr
    w = plots_showing(qtbot, read_trace(tmp_path / "run"))
    assert w.draft_lines.positions() == []
    assert "draft rejected" not in w.legend.text()


def test_crops_from_a_hostile_trace_are_ignored_not_drawn():
    bad = TurnRecord(index=0, settings={"draft": {"crops": [[3, 2], ["4", 1], [5], [-1, 2], [6, 0], [True, 1], None]}})
    worse = TurnRecord(index=1, settings={"draft": "crops"})
    assert bad.rejected_drafts() == [(3, 2)]
    assert worse.rejected_drafts() == []
    assert draft_crops([bad, worse]) == {3: 2}
    assert draft_crops([bad], step=2) == {}


def test_cache_png_draws_the_crops_with_a_legend_entry(qtbot, lookup_trace):
    import pyqtgraph as pg

    from kvinspect.gui.report_images.trace_figures import cache_figure

    rec = lookup_trace
    win = cache_figure(rec)
    qtbot.addWidget(win)
    legend = next(i for i in win.ci.items if isinstance(i, pg.LegendItem))
    entries = {label.text: sample.item for sample, label in legend.items}
    name = next(k for k in entries if k.startswith("draft rejected"))
    total = sum(n for t in rec.turns for _s, n in t.rejected_drafts())
    assert f"{total:,} draft tokens" in name
    x, _ = entries[name].getData()
    assert sorted(set(x.tolist())) == sorted({float(s) for t in rec.turns for s, _n in t.rejected_drafts()})
