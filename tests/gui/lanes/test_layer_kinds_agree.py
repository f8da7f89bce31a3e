"""One kind per layer everywhere: the window's heatmap, cache.png's kind strip and the token view agree.

Each is read from what it draws (the heatmap axis's chip colours, the strip image's pixels, the token
view's kinds, which the Tokens panel and ``kvinspect tokens`` show), on every tiny built-in after a turn,
and checked against the kinds the catalogue claims (themselves checked against transformers' cache in
tests/core/model/test_builtins.py). A Gemma 3n KV-shared layer is "shared" in all of them.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6 import QtGui

from kvinspect.core.cache.layer_kinds import base_kind
from kvinspect.core.model.catalog import BUILTINS
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.tokens.states import token_view
from kvinspect.core.tokens.text import header_lines
from kvinspect.core.trace.tracefile import read_trace
from kvinspect.gui.base import theme as th
from kvinspect.gui.lanes.heatmap_lane import HeatmapLane
from kvinspect.gui.report_images.trace_figures import cache_figure
from tests.conftest import load_cached

TINY_BUILTINS = [b.name for b in BUILTINS if b.tiny]


def _rgb(color: str) -> tuple[int, int, int]:
    c = QtGui.QColor(color)
    return c.red(), c.green(), c.blue()


def _kind_of_color(rgb: tuple[int, int, int]) -> str:
    return next(k for k in th.KIND_ORDER if _rgb(th.KIND_COLORS[k]) == tuple(rgb))


@pytest.fixture(scope="module", params=TINY_BUILTINS)
def record(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    script = ChatScript(["hello there, cache"], settings=GenerationSettings(max_new_tokens=3))
    return request.param, read_trace(run_script(load_cached(request.param), script, out).trace)


def test_heatmap_cache_png_and_tokens_agree_on_every_layer(qapp, record):
    name, rec = record
    claimed = [base_kind(k) for k in next(b for b in BUILTINS if b.name == name).layer_kinds]
    assert len(claimed) == rec.n_layers

    widget = pg.GraphicsLayoutWidget()
    heat = HeatmapLane(widget.ci, 0)
    heat.reset(rec)
    window = [_kind_of_color((c.red(), c.green(), c.blue())) for c in heat.axis.colors]

    fig = cache_figure(rec)
    strip = next(it for it in fig.scene().items()
                 if isinstance(it, pg.ImageItem) and it.image.ndim == 3 and it.image.shape[1] == 1)
    assert strip.image.shape[0] == rec.n_layers
    report = [_kind_of_color(tuple(int(v) for v in px[0][:3])) for px in np.asarray(strip.image)]

    view = token_view(rec)
    tokens = list(view.kinds)

    assert window == claimed, f"{name}: the window's heatmap"
    assert report == claimed, f"{name}: cache.png's kind strip"
    assert tokens == claimed, f"{name}: the token view"
    # `kvinspect tokens` prints the token view's bands: every band names its layers' one kind.
    text = "\n".join(header_lines(view, len(rec.turns)))
    for band in view.bands:
        assert {claimed[i] for i in band.layers} == {band.kind}
        assert band.kind in text
