"""The per-step rows: what the hook keeps, and the blocks in which the pipeline appends them to the record.

The hook keeps a grouped read's few numbers and the record takes forwards in blocks
(:func:`kvinspect.core.cache.observer.block`, ``TurnPipeline.commit``). These tests run real
generations on tiny built-ins and compare every recorded row with a full read of every layer taken
at the same forward by a second, ungrouped probe.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.observer import StepObserver, StepSample, block
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.compat import cache_from_generate_output
from kvinspect.core.detect.detectors import TurnContext
from kvinspect.core.session import pipeline as pipeline_mod
from kvinspect.core.session.pipeline import TurnPipeline
from kvinspect.core.trace.record import TraceRecord, TurnRecord
from tests.conftest import load_cached

NEW = 40


def _observed_generation(name: str, flush_every_s: float = 3600.0, probe: CacheProbe | None = None):
    """Generate ``NEW`` tokens with the real observer feeding a pipeline; also a full read at each forward."""
    lm = load_cached(name)
    probe = probe or CacheProbe(lm.model.config)
    full = CacheProbe(lm.model.config)
    full.group_layers = False
    record = TraceRecord(probe.n_layers)
    memory = MemorySampler("cpu")
    pipe = TurnPipeline(record, probe, memory, flush_every_s=flush_every_s)
    turn = TurnRecord(index=0)
    pipe.begin(turn)
    truth, samples, in_record = [], [], []

    def sink(s):
        truth.append(full.lengths(s.cache, s.q_len))
        pipe.last_cache = s.cache  # the generation's cache, for the test (the pipeline drops it)
        samples.append(s)
        pipe.step(s)
        in_record.append(record.n_steps)

    ids = torch.tensor([list(range(5, 75))])  # 70 tokens: past tiny-mistral's and tiny-gemma3's windows
    with StepObserver(lm.model, probe, sink, memory), torch.inference_mode():
        lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                          min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return pipe, turn, record, truth, samples, in_record


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-mistral", "tiny-llama"])
def test_recorded_rows_equal_a_full_read_of_every_layer(name):
    pipe, turn, record, truth, samples, _ = _observed_generation(name)
    assert samples[0].groups is None and all(s.groups is not None for s in samples[1:]), \
        "the first forward reads every layer, later ones one layer per group"
    pipe.commit()
    assert record.n_steps == len(truth) == NEW
    for col, k in (("seen", 0), ("stored", 1), ("dev", 2), ("nbytes", 3)):
        want = np.stack([t[k] for t in truth])
        assert np.array_equal(record.col(col), want), col
        # One sample's own arrays (what the detectors read) and a block's rows are the same numbers.
        assert np.array_equal(np.stack([s.arrays[k] for s in samples]), want), col
    assert list(record.q_len) == [70] + [1] * (NEW - 1)
    assert set(record.cache_id) == {samples[0].cache_id} and record.use_cache.min() == 1
    assert (record.rss > 0).all() and (np.diff(record.t) >= 0).all()


def test_the_hook_fills_every_field_of_a_grouped_sample():
    """The hook sets a grouped sample's fields itself (no __init__): every slot, as the constructor would."""
    _, _, _, _, samples, _ = _observed_generation("tiny-gemma3")
    s = samples[-1]
    assert s.groups is not None
    made = StepSample(s.t, s.cache_id, s.new_cache, s.q_len, s.use_cache, rss=s.rss, accel_allocated=s.accel_allocated,
                      accel_reserved=s.accel_reserved, input_ids=s.input_ids, cache=s.cache, groups=s.groups,
                      reps=s.reps)
    assert {k: getattr(s, k) for k in StepSample.__slots__} == {k: getattr(made, k) for k in StepSample.__slots__}


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama"])
def test_a_second_cache_built_the_same_way_is_read_by_group_from_its_first_forward(name):
    first = _observed_generation(name)
    probe, first_samples = first[0].probe, first[4]
    pipe, _, record, truth, samples, _ = _observed_generation(name, probe=probe)
    assert samples[0].cache_id != first_samples[0].cache_id and samples[0].new_cache
    assert all(s.groups is first_samples[1].groups for s in samples), "no full read of the second cache"
    pipe.commit()
    for col, k in (("seen", 0), ("stored", 1), ("dev", 2), ("nbytes", 3)):
        assert np.array_equal(record.col(col), np.stack([t[k] for t in truth])), col
    # Its shapes are what a probe that never saw a cache finds in it, at the end-of-turn snapshot too.
    fresh = CacheProbe(load_cached(name).model.config)
    assert probe.shapes(pipe.last_cache) == fresh.shapes(pipe.last_cache)
    assert probe.snapshot(pipe.last_cache).to_dict()["layers"] == fresh.snapshot(pipe.last_cache).to_dict()["layers"]


# Groups in slices (gemma3), in index lists (gemma2), layers without a read (gemma3n's shared ones).
@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama", "tiny-gemma2", "tiny-gemma3n"])
def test_a_block_mixes_full_reads_and_groupings(name):
    """One block of a full read, two groupings' runs and a sample whose own arrays were built, in any order."""
    _, _, _, truth, samples, _ = _observed_generation(name)
    later = _observed_generation(name)  # a second cache: a grouping of its own
    samples, truth = samples + later[4], truth + later[3]
    samples[5].arrays  # noqa: B018 - built by a reader before the block: the block takes its arrays
    order = [0, *range(20, len(samples)), 1, 2, 3, 4, 5, *range(6, 20)]
    record = TraceRecord(len(truth[0][0]))
    for chunk in (order[:7], order[7:]):
        t, cols, parts = block([samples[i] for i in chunk])
        record.append_steps(t, {**cols, "turn": 3}, parts)
    for k, col in enumerate(("seen", "stored", "dev", "nbytes")):
        assert np.array_equal(record.col(col), np.stack([truth[i][k] for i in order])), col
    assert list(record.q_len) == [samples[i].q_len for i in order] and set(record.turn) == {3}
    assert np.array_equal(record.t, np.array([samples[i].t for i in order]) - samples[order[0]].t)


def test_the_record_takes_a_block_at_most_every_pending_max_forwards(monkeypatch):
    monkeypatch.setattr(pipeline_mod, "PENDING_MAX", 16)
    pipe, turn, record, truth, _, in_record = _observed_generation("tiny-llama")
    # The turn's first forward (its prefill's end) goes at once; then, without a flush (the interval is
    # an hour), the record lags by fewer than PENDING_MAX forwards.
    assert in_record[:16] == [1] * 16 and in_record[16] == 17 and in_record[32] == 33
    assert all(i + 1 - n < 16 for i, n in enumerate(in_record))
    ctx = TurnContext(turn_index=0, policy="reuse", cache_impl="dynamic", cached_before=0, prompt=[],
                      prev_cache_id=None, new_ids=[], snapshot=None)
    pipe.finish(turn, ctx, new_ids=[], snapshot=None, t_start=0.0, t_first=None, t_end=1.0,
                detect=lambda ctx, rec: [])
    assert record.n_steps == turn.end_step == NEW  # a finished turn has all its forwards in the record


def test_a_turn_s_first_forward_is_sent_at_once_and_the_next_after_the_interval():
    """A turn's prefill ends with its first token: its step block goes to the sinks then (the window
    shows both), not one flush interval later; the next block waits for the interval."""
    lm = load_cached("tiny-llama")
    probe = CacheProbe(lm.model.config)
    record = TraceRecord(probe.n_layers)
    sent = []
    pipe = TurnPipeline(record, probe, MemorySampler("cpu"), sinks=[sent.append], flush_every_s=3600.0)
    blocks = []

    def sink(s):
        pipe.step(s)
        blocks.append(sum(m.n for m in sent if m.kind == "steps"))

    ids = torch.tensor([list(range(5, 25))])
    for turn in range(2):  # the second turn's first forward too, however recently the first turn flushed
        pipe.begin(TurnRecord(index=turn))
        blocks.clear()
        with StepObserver(lm.model, probe, sink, MemorySampler("cpu")), torch.inference_mode():
            lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                              min_new_tokens=6, do_sample=False, pad_token_id=0)
        assert blocks == [6 * turn + 1] * 6, blocks  # the prefill's block at once, the rest held by the hour
        pipe.flush()


def test_a_flush_puts_every_kept_forward_in_the_record():
    pipe, _, record, truth, _, in_record = _observed_generation("tiny-llama", flush_every_s=0.0)
    assert in_record == list(range(1, NEW + 1))  # flushing at every forward: a block of one
    assert np.array_equal(record.col("seen"), np.stack([t[0] for t in truth]))


def test_no_cache_forwards_are_rows_of_not_applicable():
    lm = load_cached("tiny-llama")
    probe = CacheProbe(lm.model.config)
    groups, row = probe.read(None)
    assert groups is None and (row[0] == -1).all() and (row[2] == -1).all() and (row[3] == 0).all()


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-mistral", "tiny-llama"])
def test_dynamic_caches_are_read_inline_after_their_second_forward(name):
    pipe, _, _, _, samples, _ = _observed_generation(name)
    plain = pipe.probe._last[1].plain
    assert plain is not None and plain[0] is samples[-1].groups, "the hook read every group through the general path"


def _llama_cache():
    """A tiny-llama cache after a short generation, and a probe that has not seen it."""
    lm = load_cached("tiny-llama")
    ids = torch.tensor([list(range(5, 25))])
    with torch.inference_mode():
        out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                                pad_token_id=0, return_dict_in_generate=True)
    cache = cache_from_generate_output(out)
    return cache, CacheProbe(lm.model.config)


def test_a_representative_that_moves_is_read_in_full_after_the_next_device_check():
    cache, probe = _llama_cache()
    for _ in range(3):  # first sight, the grouped read that prepares the inline one, the inline read
        _, _, groups, row = probe.observe(cache, 1)
    assert probe._last[1].plain is not None and row[2] == probe.devices.index("cpu")
    probe.check_devices()
    assert probe._last[1].plain is not None, "nothing moved"
    rep = groups.reps[0]
    layer = cache.layers[rep]
    layer.keys, layer.values = layer.keys.to("meta"), layer.values.to("meta")
    probe.check_devices()
    _, _, groups, row = probe.observe(cache, 1)
    assert row[2] == probe.devices.index("meta")


def test_a_turn_begins_with_devices_and_rss_read_again():
    cache, probe = _llama_cache()
    memory = MemorySampler("cpu", rss_every_s=3600)
    pipe = TurnPipeline(TraceRecord(probe.n_layers), probe, memory)
    pipe.begin(TurnRecord(index=0))
    for _ in range(3):
        probe.observe(cache, 1)
    memory.sample_tuple()
    memory.rss = -5  # what a fresh read replaces
    for layer in cache.layers:  # between turns the program moves the cache (nothing is pending)
        layer.keys, layer.values = layer.keys.to("meta"), layer.values.to("meta")
    pipe.begin(TurnRecord(index=1))
    assert probe.observe(cache, 1)[3][2] == probe.devices.index("meta")
    assert memory.sample_tuple()[0] > 0
