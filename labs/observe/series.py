"""Prometheus exposition text read back as the few series an on-call watches, and p99 from buckets.

A dashboard never sees a latency: it sees a histogram's cumulative bucket counters and
works a percentile out of the difference between two scrapes, as PromQL's
`histogram_quantile(0.99, rate(x_bucket[1m]))` does. `quantile` does that interpolation
here (linear inside the bucket the rank falls in), so the lab's p99 is the one a Grafana
panel would draw, bucket error included.
"""

from __future__ import annotations

import math
import re

WATCHED_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
WATCHED_COUNTERS = ("vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total")
TTFT = "vllm:time_to_first_token_seconds"
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class ExpositionError(ValueError):
    """The text is not Prometheus exposition, or lacks a series the lab reads."""


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line as (name, labels, value); comments and blank lines skipped."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        m = _SAMPLE.match(head)
        if not m:
            raise ExpositionError(f"line {n}: not a sample: {line[:80]!r}")
        try:
            v = float(value)
        except ValueError:
            raise ExpositionError(f"line {n}: value {value!r} is not a number") from None
        out.append((m.group(1), dict(_LABEL.findall(m.group(3) or "")), v))
    return out


def _one(found: list[tuple[str, dict, float]], name: str) -> float:
    """Sum over label sets: one engine gives one series; several engines add up, as sum() would."""
    vals = [v for n, _, v in found if n == name]
    if not vals:
        raise ExpositionError(f"no {name} in the scrape")
    return sum(vals)


def buckets(found, name: str = TTFT) -> list[tuple[float, float]]:
    """A histogram's cumulative (le, count) pairs in edge order, +Inf last (summed over label sets)."""
    acc: dict[float, float] = {}
    for n, labels, v in found:
        if n == name + "_bucket":
            le = labels.get("le")
            if le is None:
                raise ExpositionError(f"{name}_bucket without an le label")
            edge = math.inf if le == "+Inf" else float(le)
            acc[edge] = acc.get(edge, 0.0) + v
    if not acc or math.inf not in acc:
        raise ExpositionError(f"no {name}_bucket series ending in le=\"+Inf\"")
    return sorted(acc.items())


def reading(text: str) -> dict:
    """One scrape as the on-call's row: the gauges, the counters and the TTFT buckets."""
    found = samples(text)
    row = {name.split(":", 1)[1]: _one(found, name) for name in WATCHED_GAUGES + WATCHED_COUNTERS}
    b = buckets(found)
    row["ttft_le"] = [le for le, _ in b[:-1]]
    row["ttft_cum"] = [c for _, c in b]
    return row


def quantile(q: float, edges: list[float], cum: list[float]) -> float | None:
    """`histogram_quantile(q, ...)` on cumulative counts `cum` (len(edges) + 1, +Inf last); None if empty.

    The rank q * total falls in the first bucket whose cumulative count reaches it; the value
    is interpolated linearly between that bucket's lower and upper edge (0 below the first).
    A rank in the +Inf bucket returns the last finite edge, as Prometheus does.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    if len(cum) != len(edges) + 1:
        raise ValueError(f"{len(cum)} counts for {len(edges)} finite edges; need one more (+Inf)")
    total = cum[-1]
    if total <= 0:
        return None
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge, count in zip(edges, cum):
        if count >= rank:
            inside = count - prev_count
            frac = (rank - prev_count) / inside if inside > 0 else 1.0
            return prev_edge + (edge - prev_edge) * frac
        prev_edge, prev_count = edge, count
    return edges[-1] if edges else None


def window_quantile(q: float, before: dict, after: dict) -> float | None:
    """The quantile of the observations made between two readings (the `rate(...[w])` part)."""
    if before["ttft_le"] != after["ttft_le"]:
        raise ExpositionError("the TTFT bucket edges changed between scrapes")
    delta = [a - b for a, b in zip(after["ttft_cum"], before["ttft_cum"])]
    if any(d < 0 for d in delta):
        return None  # a counter reset (the server restarted): no window
    return quantile(q, after["ttft_le"], delta)
