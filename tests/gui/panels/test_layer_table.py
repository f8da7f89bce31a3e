"""The Layers table shows a cache's batch dimension (beams, batched prompts) where there is one, from the
turn's own snapshot, and leaves the column out where every layer holds one row."""

from __future__ import annotations

import pytest
import torch

import kvinspect
from kvinspect.gui.panels.layer_table import COLUMNS, LayerTable
from tests.conftest import load_cached

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def _observed(num_beams: int):
    lm = load_cached("tiny-llama")
    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi there, who are you?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.model.config)
    with kvinspect.observe(lm.model, lm.tokenizer) as rec:
        lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                          do_sample=False, max_new_tokens=4, num_beams=num_beams)
    return rec.record, cache


@pytest.mark.parametrize("beams", [1, 3])
def test_the_rows_column_shows_the_cache_s_own_batch_only_when_there_is_one(qtbot, beams):
    record, cache = _observed(beams)
    table = LayerTable()
    qtbot.addWidget(table)
    table.render(record)
    col = [c[0] for c in COLUMNS].index("batch")
    want = [int(layer.keys.shape[0]) for layer in cache.layers]
    assert [r["batch"] for r in table.model.rows] == want
    assert table.view.isColumnHidden(col) == (beams == 1)
    if beams > 1:
        assert table.proxy.index(0, col).data() == f"{beams}"
