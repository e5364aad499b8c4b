"""Time a GPU call with CUDA events, the L2 flushed before each sample, and summarise the samples.

The summary and the bandwidth arithmetic are plain Python so the CPU tests can feed
them fake timings; only `event_timer` touches torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# Bigger than any L2 in labs/data/gpus.yaml (the H200's is 60 MB), so a flush evicts it all.
L2_FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Summary:
    median_us: float
    min_us: float
    spread: float  # (p90 - p10) / median: how noisy the samples were
    samples: int


def summarize(samples_us: list[float]) -> Summary:
    """Median, minimum and spread of per-call times in µs; refuses an empty or non-positive list."""
    if not samples_us:
        raise ValueError("no timing samples")
    if any(not (t > 0) for t in samples_us):
        raise ValueError(f"timing samples must be positive, got {min(samples_us)}")
    s = sorted(samples_us)
    med = statistics.median(s)
    lo, hi = s[int(0.1 * (len(s) - 1))], s[int(round(0.9 * (len(s) - 1)))]
    return Summary(median_us=med, min_us=s[0], spread=(hi - lo) / med, samples=len(s))


def gb_per_s(nbytes: float, time_us: float) -> float:
    """Decimal GB/s: bytes / time."""
    if time_us <= 0:
        raise ValueError(f"time must be positive, got {time_us}")
    return nbytes / time_us / 1e3


def event_timer(torch, reps: int = 20, warmup: int = 3):
    """Returns time(fn) -> Summary: `reps` CUDA-event timings of fn, each after an L2 flush."""
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def time(fn) -> Summary:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        pairs = []
        for _ in range(reps):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return summarize([1e3 * s.elapsed_time(e) for s, e in pairs])

    return time


def copy_bandwidth_gb_s(torch, time, nbytes: int = 2**30) -> float:
    """Device-to-device `copy_` of `nbytes`, GB/s counting bytes read plus bytes written."""
    src = torch.rand(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    t = time(lambda: dst.copy_(src))
    del src, dst
    return gb_per_s(2 * nbytes, t.median_us)
