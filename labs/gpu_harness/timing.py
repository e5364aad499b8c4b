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


def event_samples_us(torch, fn, reps: int, before=None) -> list[float]:
    """`reps` CUDA-event timings of fn in µs, queued back to back and read after one synchronize;
    `before` (a flush, say) runs ahead of each sample, outside its events."""
    pairs = []
    for _ in range(reps):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [1e3 * s.elapsed_time(e) for s, e in pairs]


def event_timer(torch, reps: int = 20, warmup: int = 3):
    """Returns time(fn) -> Summary: `reps` CUDA-event timings of fn, each after an L2 flush."""
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def time(fn) -> Summary:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        return summarize(event_samples_us(torch, fn, reps, before=flush.zero_))

    return time


def copy_bandwidth_gb_s(torch, time, nbytes: int = 2**30) -> float:
    """Device-to-device `copy_` of `nbytes`, GB/s counting bytes read plus bytes written."""
    src = torch.rand(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    t = time(lambda: dst.copy_(src))
    del src, dst
    return gb_per_s(2 * nbytes, t.median_us)


# A decode step runs attention once per layer, each layer on its own KV cache, from one CUDA
# graph. `layers_timer` times a call that way: the graph holds the call on `layer_count`
# copies of its inputs, back to back, and its replays run back to back with no flush. What
# the flush did, the other copies do: between two calls on one copy they read several times
# the L2. And the graph's own launch, paid once per step in a served model, is shared by all
# the calls instead of charged to each.
# The fewest calls a timed graph holds: the H200 took about 4 µs to replay a graph of one
# empty kernel (NOTES.md of the paged-attention lab, v7), so each call then carries 0.5 µs of it.
MIN_LAYERS = 8
# ... and enough of them that the other copies read this many times the L2 between two calls
# on one copy, so no call finds its inputs in L2.
L2_MULTIPLE = 4
# The most copies: the smallest input that needs more is under 4 MiB at a 60 MB L2.
MAX_LAYERS = 64


def layer_count(nbytes: int, l2_bytes: int) -> int:
    """Copies of a call's inputs that `layers_timer` rotates: at least MIN_LAYERS, and enough
    that the other copies hold L2_MULTIPLE x the L2's bytes, up to MAX_LAYERS."""
    if nbytes <= 0 or l2_bytes <= 0:
        raise ValueError(f"need positive byte counts, got nbytes={nbytes}, l2_bytes={l2_bytes}")
    return min(MAX_LAYERS, max(MIN_LAYERS, 1 + -(-L2_MULTIPLE * l2_bytes // nbytes)))


def layers_timer(torch, rep_ms: float = 100.0, warmup_ms: float = 25.0):
    """Returns time(calls) -> µs per call: `calls` (one per copy of the inputs) captured in one
    CUDA graph, its replays timed back to back with CUDA events, the median replay divided by
    the number of calls. Each call runs once before the capture, to compile and allocate."""

    def time(calls) -> float:
        if not calls:
            raise ValueError("no calls to time")
        for call in calls:
            call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        graph.replay()
        torch.cuda.synchronize()
        estimate_ms = max(statistics.median(event_samples_us(torch, graph.replay, 5)) / 1e3, 1e-3)
        for _ in range(max(1, int(warmup_ms / estimate_ms))):
            graph.replay()
        samples = event_samples_us(torch, graph.replay, max(5, int(rep_ms / estimate_ms)))
        del graph
        return statistics.median(samples) / len(calls)

    return time
