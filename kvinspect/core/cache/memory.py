"""Process and accelerator memory counters, feature-detected.

KV bytes come from the probe (exact, per layer and device); these counters give the
context: process RSS (an upper bound on CPU: activations and allocator caching count too)
and the accelerator's allocated / reserved / peak. A CPU-only torch never raises here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass
class MemorySample:
    rss: int = 0
    accel_allocated: int = 0
    accel_reserved: int = 0

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.rss, self.accel_allocated, self.accel_reserved)


class MemorySampler:
    """Cheap enough to call after every forward: RSS is refreshed at most every ``rss_every_s``."""

    def __init__(self, device: str = "cpu", rss_every_s: float = 0.02):
        import psutil

        self._proc = psutil.Process()
        self.device = device
        self.kind = "cuda" if device.startswith("cuda") or device == "multi-gpu" else device
        self._rss_every = rss_every_s
        self._rss_t = 0.0
        self._rss = 0
        self._torch = None
        if self.kind in ("cuda", "mps"):
            import torch

            self._torch = torch

    def _read_rss(self) -> int:
        now = time.perf_counter()
        if now - self._rss_t >= self._rss_every:
            self._rss = self._proc.memory_info().rss
            self._rss_t = now
        return self._rss

    def sample(self) -> MemorySample:
        rss = self._read_rss()
        alloc = reserved = 0
        t = self._torch
        if t is not None:
            if self.kind == "cuda":
                # Summed over visible devices: a device_map can spread the model over several.
                for d in range(t.cuda.device_count()):
                    alloc += t.cuda.memory_allocated(d)
                    reserved += t.cuda.memory_reserved(d)
            elif self.kind == "mps":
                alloc = t.mps.current_allocated_memory()
                reserved = t.mps.driver_allocated_memory()
        return MemorySample(rss, alloc, reserved)

    def reset_peak(self) -> None:
        t = self._torch
        if t is not None and self.kind == "cuda":
            for d in range(t.cuda.device_count()):
                t.cuda.reset_peak_memory_stats(d)

    def peak(self) -> int:
        """Peak accelerator bytes since :meth:`reset_peak` (0 where no counter exists)."""
        t = self._torch
        if t is not None and self.kind == "cuda":
            return sum(t.cuda.max_memory_allocated(d) for d in range(t.cuda.device_count()))
        return 0

    def rss_now(self) -> int:
        self._rss_t = 0.0
        return self._read_rss()

    def describe(self) -> dict:
        """Static facts for the trace header."""
        out: dict[str, Any] = {"kind": self.kind}
        t = self._torch
        if t is not None and self.kind == "cuda":
            try:
                out["devices"] = [
                    {"name": t.cuda.get_device_name(d), "total": t.cuda.get_device_properties(d).total_memory}
                    for d in range(t.cuda.device_count())
                ]
            except Exception:  # noqa: BLE001 - informational only
                pass
        elif t is not None and self.kind == "mps":
            rec = getattr(t.mps, "recommended_max_memory", None)
            if rec:
                out["recommended_max"] = rec()
        return out
