"""``layers_disagree``: the end-of-turn check of the per-step grouping, on real caches corrupted here.

Each test generates with a real model into a real transformers cache, then breaks one layer the way
a transformers bug would (a layer that kept fewer rows, or a sliding layer whose counter ran off),
and runs the turn's detectors on the probe's snapshot. The untouched cache is the control.
"""

from __future__ import annotations

import pytest
import torch

from kvinspect.core import compat
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.detect.detectors import TurnContext, detect_turn
from kvinspect.core.detect.events import LAYERS_DISAGREE
from kvinspect.core.detect.layers import layers_disagree
from tests.conftest import load_cached

PROMPT_LEN = 80  # past tiny-mistral's 64-token window, so its sliding layers are capped


def _filled_cache(name: str):
    loaded = load_cached(name)
    cache = compat.new_dynamic_cache(loaded.model.config)
    ids = torch.randint(10, 90, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        loaded.model(input_ids=ids, use_cache=True, **{compat.cache_kwarg(loaded.model): cache})
    probe = CacheProbe(loaded.model.config)
    probe.lengths(cache, PROMPT_LEN)  # the prefill's read, as the observer makes it: the groups form here
    return loaded, cache, probe


def _events(loaded, cache, probe):
    seen, *_ = probe.lengths(cache, 1)  # a later forward's read: one layer per group
    ctx = TurnContext(turn_index=0, policy="reuse", cache_impl="dynamic", cached_before=0,
                      prompt=list(range(PROMPT_LEN)), prev_cache_id=None, new_ids=[1],
                      snapshot=probe.snapshot(cache))
    return seen, [e for e in detect_turn(ctx, None) if e.kind == LAYERS_DISAGREE], ctx


@pytest.fixture(scope="module")
def llama():
    return _filled_cache("tiny-llama")


def test_silent_on_an_intact_cache(llama):
    loaded, cache, probe = llama
    seen, events, ctx = _events(loaded, cache, probe)
    assert events == []
    assert ctx.snapshot.groups == [list(range(len(cache.layers)))]  # one group: the check had work to do
    assert (seen == PROMPT_LEN).all()


def test_a_layer_that_kept_fewer_rows_is_named_with_both_numbers():
    loaded, cache, probe = _filled_cache("tiny-llama")
    layer = cache.layers[2]
    row = 2 * layer.keys[0, :, 0].numel() * layer.keys.element_size()  # K and V bytes of one token
    layer.keys, layer.values = layer.keys[:, :, :-5], layer.values[:, :, :-5]
    _, events, _ = _events(loaded, cache, probe)
    assert len(events) == 1
    ev = events[0]
    assert ev.severity == "error" and ev.layers == [2] and ev.layer == 2
    assert ev.data["layers"] == [{"layer": 2, "seen": PROMPT_LEN - 5, "stored": PROMPT_LEN - 5,
                                  "bytes": (PROMPT_LEN - 5) * row, "group": 0}]
    group = ev.data["groups"][0]
    assert (group["seen"], group["stored"], group["bytes"]) == (PROMPT_LEN, PROMPT_LEN, PROMPT_LEN * row)
    assert group["layers"] == list(range(len(cache.layers)))
    assert f"layer 2 holds {PROMPT_LEN - 5} rows of {PROMPT_LEN - 5} tokens seen" in ev.message
    assert f"hold {PROMPT_LEN} rows of {PROMPT_LEN} tokens seen" in ev.message


def test_a_sliding_layer_whose_counter_ran_off_is_caught_and_full_layers_stay_quiet():
    loaded, cache, probe = _filled_cache("tiny-mistral")
    sliding = [i for i, lay in enumerate(cache.layers) if getattr(lay, "is_sliding", False)]
    assert len(sliding) >= 2
    bad = sliding[-1]
    cache.layers[bad].cumulative_length += 7  # a wrong update at the window: seen runs ahead of the others
    seen, events, _ = _events(loaded, cache, probe)
    assert [e.layers for e in events] == [[bad]]
    assert events[0].data["layers"][0]["seen"] == PROMPT_LEN + 7
    assert events[0].data["groups"][0]["seen"] == PROMPT_LEN
    # The steps read the group's first layer, so the series showed the group's number for every layer.
    assert seen[bad] == PROMPT_LEN


def test_a_cache_grouped_like_an_earlier_one_is_checked_as_well():
    loaded, _, probe = _filled_cache("tiny-llama")
    cache = compat.new_dynamic_cache(loaded.model.config)
    ids = torch.randint(10, 90, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        loaded.model(input_ids=ids, use_cache=True, **{compat.cache_kwarg(loaded.model): cache})
    groups, _ = probe.read(cache, PROMPT_LEN)
    assert groups is not None, "grouped from its first read, by the earlier cache's shapes"
    cache.layers[3].keys, cache.layers[3].values = cache.layers[3].keys[:, :, :-4], cache.layers[3].values[:, :, :-4]
    seen, events, _ = _events(loaded, cache, probe)
    assert [e.layers for e in events] == [[3]] and seen[3] == PROMPT_LEN


def test_the_first_layer_of_a_group_can_be_the_odd_one():
    loaded, cache, probe = _filled_cache("tiny-llama")
    layer = cache.layers[0]
    layer.keys, layer.values = layer.keys[:, :, :-1], layer.values[:, :, :-1]
    events = layers_disagree(_events(loaded, cache, probe)[2])
    assert [e.layers for e in events] == [[0]]
    assert "read layer 0 for its whole group" in events[0].message


def test_a_failed_turn_is_not_checked():
    loaded, cache, probe = _filled_cache("tiny-llama")
    cache.layers[1].keys = cache.layers[1].keys[:, :, :-2]
    ctx = _events(loaded, cache, probe)[2]
    ctx.status = "failed"  # a forward that raised part-way leaves its first layers one update ahead
    assert layers_disagree(ctx) == []
