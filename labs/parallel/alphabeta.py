"""The alpha-beta model of a collective, and the interconnects it is fitted to (no torch).

One formula prices every collective the parallel lab talks about, so the
planner, the MoE comparison, the TP-speedup prediction and the pages agree:

    t(op, S, n) = alpha + f(op, n) * S / beta      (+ eager_launch when not in a CUDA graph)

S is the message in bytes as nccl-tests counts it (the buffer each rank holds
for all-reduce; the full gathered output for all-gather; the full input for
reduce-scatter; the whole send buffer for all-to-all). f is nccl-tests' bus
factor, the share of S that crosses each rank's busiest link in the best
algorithm: a ring all-reduce sends and receives 2(n-1)/n of S per rank, the
others (n-1)/n. beta is therefore the bus bandwidth, the number nccl-tests
prints as `busbw`, and it does not change with n on a flat topology.

Why alpha is one constant and not 2(n-1) hops: for the small messages of
decode, NCCL uses low-latency protocols and (on NVLink Switch systems) NVLS or
trees, not a plain ring, so the latency grows far slower than the ring's hop
count. The model holds it at the two-GPU anchor and says so; the multi-GPU
run measures it at n = 4 and 8.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

LINKS_FILE = Path(__file__).resolve().parent.parent / "data" / "interconnects.yaml"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
PROVENANCE = ("measured", "datasheet", "derived", "assumed")
LINK_FIELDS = ("display_name", "kind", "source", "peak_gbps_per_direction", "bus_bandwidth_gbps",
               "alpha_us", "eager_launch_us", "provenance", "note")


class ModelError(ValueError):
    """A link, collective or size the model cannot price; the message says which."""


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio: the share of the message each rank moves per link."""
    if op not in COLLECTIVES and op != "send_recv":
        raise ModelError(f"collective must be one of {COLLECTIVES + ('send_recv',)}, got {op!r}")
    if n < 1:
        raise ModelError(f"rank count must be at least 1, got {n}")
    if op == "send_recv":
        return 1.0
    return (2 * (n - 1) / n) if op == "all_reduce" else (n - 1) / n


def bus_bandwidth(op: str, n: int, size_bytes: float, seconds: float) -> float:
    """busbw in bytes/s from one timing, as nccl-tests computes it: algbw x bus factor."""
    return size_bytes / seconds * bus_factor(op, n)


@dataclass(frozen=True)
class Link:
    name: str
    display_name: str
    kind: str
    source: str
    peak_gbps_per_direction: float
    bus_bandwidth_gbps: float
    alpha_us: float
    eager_launch_us: float
    provenance: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self):
        for name in ("peak_gbps_per_direction", "bus_bandwidth_gbps", "alpha_us", "eager_launch_us"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ModelError(f"{self.name}: {name} must be a finite non-negative number, got {value!r}")
        if self.bus_bandwidth_gbps <= 0:
            raise ModelError(f"{self.name}: bus_bandwidth_gbps must be positive")
        if self.bus_bandwidth_gbps > self.peak_gbps_per_direction:
            raise ModelError(f"{self.name}: bus bandwidth exceeds the link's peak per direction")
        bad = {k: v for k, v in self.provenance.items() if v not in PROVENANCE}
        missing = {"bus_bandwidth_gbps", "alpha_us"} - set(self.provenance)
        if bad or missing:
            raise ModelError(f"{self.name}: provenance needs bus_bandwidth_gbps and alpha_us, values in "
                             f"{PROVENANCE}; got {self.provenance}")

    @property
    def beta(self) -> float:
        """Bus bandwidth in bytes/s."""
        return self.bus_bandwidth_gbps * 1e9

    @property
    def alpha(self) -> float:
        return self.alpha_us * 1e-6

    def with_(self, **changes) -> "Link":
        values = {k: getattr(self, k) for k in self.__dataclass_fields__}
        values.update(changes)
        return Link(**values)


@functools.lru_cache(maxsize=None)
def links(path: str = str(LINKS_FILE)) -> dict[str, Link]:
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    out = {}
    for name, entry in (raw.get("links") or {}).items():
        unknown = set(entry) - set(LINK_FIELDS)
        absent = set(LINK_FIELDS) - set(entry) - {"note"}
        if unknown or absent:
            raise ModelError(f"{Path(path).name}:{name}: unknown fields {sorted(unknown)}, missing {sorted(absent)}")
        out[name] = Link(name=name, **entry)
    return out


def get_link(name: str) -> Link:
    found = links().get(name)
    if found is None:
        raise ModelError(f"unknown link {name!r}; known: {', '.join(links())}")
    return found


def collective_time(op: str, size_bytes: float, n: int, link: Link, graph: bool = True) -> float:
    """Seconds for one collective of `size_bytes` over `n` ranks on `link` (0 when n == 1)."""
    if not math.isfinite(size_bytes) or size_bytes < 0:
        raise ModelError(f"message size must be a finite non-negative number of bytes, got {size_bytes}")
    if n == 1:
        return 0.0
    f = bus_factor(op, n)
    t = link.alpha + f * size_bytes / link.beta
    return t if graph else t + link.eager_launch_us * 1e-6


def send_time(size_bytes: float, link: Link, graph: bool = True) -> float:
    """Point-to-point: one stage handing its activations to the next (pipeline parallelism)."""
    return collective_time("send_recv", size_bytes, 2, link, graph)


@dataclass(frozen=True)
class Fit:
    """alpha (s) and beta (bytes/s) fitted to timings of one collective at one rank count."""

    op: str
    n: int
    alpha: float
    beta: float
    points: int
    max_rel_error: float

    def predict(self, size_bytes: float) -> float:
        return self.alpha + bus_factor(self.op, self.n) * size_bytes / self.beta


def fit(op: str, n: int, sizes: list[float], seconds: list[float]) -> Fit:
    """Least-squares alpha and beta for t = alpha + f*S/beta, weighted by 1/t.

    Weighting by the time keeps the microsecond points from being ignored next
    to the millisecond ones: the fit minimises relative, not absolute, error.
    """
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ModelError("fit needs at least two (size, time) points")
    f = bus_factor(op, n)
    xs = [f * s for s in sizes]
    ws = [1.0 / (t * t) for t in seconds]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs))
    sy = sum(w * t for w, t in zip(ws, seconds))
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sxy = sum(w * x * t for w, x, t in zip(ws, xs, seconds))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise ModelError("fit needs at least two distinct message sizes")
    slope = (sw * sxy - sx * sy) / det
    alpha = (sy - slope * sx) / sw
    if slope <= 0:
        raise ModelError("timings do not grow with message size: no bandwidth to fit")
    alpha = max(alpha, 0.0)
    result = Fit(op, n, alpha, 1.0 / slope, len(sizes), 0.0)
    err = max(abs(result.predict(s) - t) / t for s, t in zip(sizes, seconds))
    return Fit(op, n, alpha, 1.0 / slope, len(sizes), err)


def anchors(path: str = str(LINKS_FILE)) -> dict:
    """The measured 2 x H200 figures the model's constants come from (interconnects.yaml `anchors`)."""
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return dict(raw.get("anchors") or {})
