"""Process and accelerator memory counters, feature-detected.

KV bytes come from the probe (exact, per layer and device); these counters give the
context: process RSS (an upper bound on CPU: activations and allocator caching count too)
and the accelerator's allocated / reserved / peak. A CPU-only torch never raises here.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: tuple[int, int] | None = None  # (pid, fd): one open file per process


def _statm_rss() -> int:
    """RSS from one ``pread`` of /proc/<pid>/statm (Linux), 0 elsewhere.

    The step hook reads it right after a forward: psutil's reader then costs hundreds of
    microseconds of cold Python, one system call a few.
    """
    global _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:
        try:
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        except OSError:
            _statm = (pid, -1)
    fd = _statm[1]
    if fd < 0:
        return 0
    try:
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


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
        self._rss_due = -1.0
        self._torch: Any = None
        self._cuda_stats = None  # torch's own counters, read without memory_allocated()'s flattening
        self._cuda_devices: range = range(0)
        if self.kind in ("cuda", "mps"):
            import torch

            self._use(torch)
        #: The last RSS read, and until when (``perf_counter``) the step hook may reuse it without a
        #: call: on CPU only, where there is no accelerator counter to read each forward.
        self.rss = 0
        self.rss_until = -1.0

    def _use(self, torch) -> None:
        self._torch = torch
        if self.kind == "cuda":
            self._cuda_devices = range(torch.cuda.device_count())
            # ``memory_allocated()`` and ``memory_reserved()`` each flatten the allocator's whole nested
            # statistics dict in Python (hundreds of keys) to return one number, and the step hook needs
            # both for every device every forward: the nested dict is read directly where torch has it.
            self._cuda_stats = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)

    def _cuda_counters(self) -> tuple[int, int]:
        """``(allocated, reserved)`` summed over the visible devices: a device_map can spread a model over several."""
        t = self._torch
        stats = self._cuda_stats
        alloc = reserved = 0
        if stats is not None:
            if not t.cuda.is_initialized():
                return 0, 0
            try:
                for d in self._cuda_devices:
                    s = stats(d)
                    alloc += s["allocated_bytes"]["all"]["current"]
                    reserved += s["reserved_bytes"]["all"]["current"]
                return alloc, reserved
            except (KeyError, TypeError, RuntimeError):
                self._cuda_stats = None  # another layout: the public functions from now on
                alloc = reserved = 0
        for d in self._cuda_devices:
            alloc += t.cuda.memory_allocated(d)
            reserved += t.cuda.memory_reserved(d)
        return alloc, reserved

    def expire(self) -> None:
        """The next sample reads RSS again (a turn begins: the last reading may be from before it)."""
        self._rss_due = self.rss_until = -1.0

    def _read_rss(self, now: float | None = None) -> int:
        if now is None:
            now = time.perf_counter()
        if now >= self._rss_due:
            self.rss = _statm_rss() or self._proc.memory_info().rss
            self._rss_due = now + self._rss_every
            if self._torch is None:
                self.rss_until = self._rss_due
        return self.rss

    def sample(self) -> MemorySample:
        return MemorySample(*self.sample_tuple())

    def sample_tuple(self, now: float | None = None) -> tuple[int, int, int]:
        """``(rss, accelerator allocated, accelerator reserved)``; what the step hook calls (``now``: its clock)."""
        rss = self._read_rss(now)
        t = self._torch
        if t is None:
            return rss, 0, 0
        alloc = reserved = 0
        if self.kind == "cuda":
            alloc, reserved = self._cuda_counters()
        elif self.kind == "mps":
            alloc = t.mps.current_allocated_memory()
            reserved = t.mps.driver_allocated_memory()
        return rss, alloc, reserved

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
        self.expire()
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
