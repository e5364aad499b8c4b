"""Latency and throughput summaries of a run, and the Markdown tables the CLI prints.

The metric names follow `vllm bench serve` (vllm/benchmarks/serve.py): TTFT
from arrival to first token, TPOT per request as (e2e - TTFT) / (output - 1),
ITL as every gap between consecutive tokens of one request. Tables are
Markdown pipe tables, so the same text reads in a terminal and renders on the
site.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from labs.engine.sequence import Sequence
from labs.serving_sim.driver import RunResult


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def ttfts(reqs: Iterable[Sequence]) -> list[float]:
    return [r.first_token_time - r.arrival for r in reqs if r.first_token_time is not None]


def tpots(reqs: Iterable[Sequence]) -> list[float]:
    return [(r.finish_time - r.first_token_time) / (r.num_output - 1)
            for r in reqs if r.finish_time is not None and r.num_output > 1]


def itls(reqs: Iterable[Sequence], start: float = -math.inf, end: float = math.inf) -> list[float]:
    """Gaps between consecutive tokens whose later token lands in [start, end]."""
    out = []
    for r in reqs:
        t = r.token_times
        out.extend(b - a for a, b in zip(t, t[1:]) if start <= b <= end)
    return out


def summary(res: RunResult) -> dict:
    """The numbers a serving benchmark reports, in seconds and tokens/s."""
    done = res.finished
    start = min((r.arrival for r in res.requests), default=0.0)
    span = (max(r.finish_time for r in done) - start) if done else math.nan
    out_tokens = sum(r.num_output for r in res.requests)
    t, p, i = ttfts(done), tpots(done), itls(done)
    return {
        "policy": res.policy,
        "requests_finished": len(done),
        "output_tokens": out_tokens,
        "duration_s": span,
        "output_tok_per_s": out_tokens / span if span and span > 0 else math.nan,
        "requests_per_s": len(done) / span if span and span > 0 else math.nan,
        "ttft_mean_s": mean(t),
        "ttft_p99_s": percentile(t, 99),
        "tpot_mean_s": mean(p),
        "itl_p50_s": percentile(i, 50),
        "itl_p99_s": percentile(i, 99),
        "itl_max_s": max(i) if i else math.nan,
        "steps": res.steps,
        "computed_tokens": res.computed_tokens,
        "wasted_token_fraction": 1 - res.useful_tokens / res.computed_tokens if res.computed_tokens else math.nan,
        "preemptions": res.preemptions,
        "recomputed_tokens": res.recomputed_tokens,
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A Markdown pipe table, columns padded so it also reads as plain text.

    `align` is one letter per column: 'l' or 'r' (default: first left, rest right).
    """
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(headers))]

    def fmt(row):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else (":" + "-" * (w + 1)) for w, a in zip(widths, align)) + "|"
    return "\n".join([fmt(cells[0]), rule, *[fmt(r) for r in cells[1:]]])


def ms(x: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(x) else f"{x * 1e3:,.{digits}f}"


def fixed(x: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(x) else f"{x:,.{digits}f}"
