"""The accelerator counters the step hook reads every forward, against a stand-in for torch's CUDA API.

No GPU here: the stand-in holds what ``torch._C._cuda_memoryStats`` returns (the allocator's nested
statistics), and the public ``memory_allocated``/``memory_reserved`` that flatten it.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvinspect.core.cache.memory import MemorySampler


def _torch(per_device: list[tuple[int, int]], *, nested: bool = True, initialized: bool = True):
    def stats(d):
        a, r = per_device[d]
        return {"allocated_bytes": {"all": {"current": a, "peak": 2 * a}}, "reserved_bytes": {"all": {"current": r}}}

    calls = {"public": 0}

    def public(kind):
        def read(d):
            calls["public"] += 1
            return per_device[d][0 if kind == "a" else 1]
        return read

    cuda = SimpleNamespace(device_count=lambda: len(per_device), is_initialized=lambda: initialized,
                           memory_allocated=public("a"), memory_reserved=public("r"))
    c = SimpleNamespace(_cuda_memoryStats=stats) if nested else SimpleNamespace()
    return SimpleNamespace(cuda=cuda, _C=c), calls


def _sampler(fake) -> MemorySampler:
    m = MemorySampler("cpu")
    m.kind = "cuda"
    m._use(fake)
    return m


def test_cuda_counters_are_summed_over_devices_from_the_nested_statistics():
    fake, calls = _torch([(100, 400), (20, 60)])
    m = _sampler(fake)
    rss, alloc, reserved = m.sample_tuple()
    assert (alloc, reserved) == (120, 460) and rss > 0
    assert calls["public"] == 0, "memory_allocated() flattens every statistic: not on the step path"
    assert m.rss_until < 0, "with an accelerator every forward reads the counters"


def test_without_the_nested_statistics_the_public_functions_give_the_same_numbers():
    fake, calls = _torch([(100, 400), (20, 60)], nested=False)
    assert _sampler(fake).sample_tuple()[1:] == (120, 460) and calls["public"] == 4


def test_an_unexpected_layout_falls_back_to_the_public_functions():
    fake, calls = _torch([(7, 9)])
    fake._C._cuda_memoryStats = lambda d: {"allocated_bytes": {}}
    m = _sampler(fake)
    assert m.sample_tuple()[1:] == (7, 9) and m.sample_tuple()[1:] == (7, 9) and calls["public"] == 4


def test_cuda_not_initialised_reads_zero():
    fake, _ = _torch([(100, 400)], initialized=False)
    assert _sampler(fake).sample_tuple()[1:] == (0, 0)


def test_rss_is_reused_until_due_and_read_again_when_asked():
    m = MemorySampler("cpu", rss_every_s=3600)
    first = m.sample_tuple(10.0)[0]
    assert first > 0 and m.rss_until == 10.0 + 3600
    m.rss = -5  # what a re-read would replace
    assert m.sample_tuple(11.0)[0] == -5, "within the interval the last read is reused"
    assert m.rss_now() > 0
