"""A sweep point's metrics with `vllm bench serve`'s definitions, the knee, and Little's law.

Definitions, as vLLM 0.33's `calculate_metrics` (vllm/benchmarks/serve.py) computes them
over the successful requests of one run of duration `dur` (first send to last finish):

* TTFT per request; ITL pooled over all requests' gaps; E2E latency per request.
* TPOT per request = (E2E - TTFT) / (output_tokens - 1), for requests with more than one
  output token; for goodput a one-token request counts TPOT 0.
* request throughput = completed / dur; output throughput = output tokens / dur;
  total token throughput = (prompt + output tokens) / dur.
* goodput = requests meeting every SLO given (TTFT, TPOT, E2E, in ms) / dur.
* percentiles by numpy's default (linear) interpolation, in ms.

Little's law, L = lambda * W: the time-averaged number of requests in flight equals the
completion rate times the mean time each spends in the system. The client measures L as
the exact time average of its own in-flight count, and lambda * W from completions and E2E
latencies; the two differ only by what E2E leaves out (the stream's close after the last
token) and by failed requests, so a point where they part by more than LITTLE_TOLERANCE is
a broken measurement. The server's own L (its running + waiting gauges, scraped from
/metrics) is the independent one: below the client's, it shows time a request spends
outside the engine (HTTP, tokenization, SSE). Past the knee the law explains the runaway: lambda is
capped at the server's capacity mu, so in a closed loop of C clients W = C / mu grows
linearly with C; in an open loop offered above mu, L grows for as long as the run lasts.

The knee: on a log-log plot of throughput against load (concurrency, or offered rate),
the slope is 1 while the server has spare capacity (twice the load, twice the
throughput) and falls towards 0 once it saturates. The knee is the last load before the
slope between neighbouring points first falls below KNEE_SLOPE: past it, doubling the
load buys less than half as much extra throughput, and all the rest turns into latency.
"""

from __future__ import annotations

import math

import numpy as np

KNEE_SLOPE = 0.5
LITTLE_TOLERANCE = 0.10  # |L / (lambda W) - 1| above this flags the point


def percentiles(values: list[float], ps: tuple[float, ...]) -> dict[str, float]:
    """{'p50': ms, ...}; 0 where there are no values, as vLLM reports it."""
    arr = np.asarray(values or [0.0], dtype=float) * 1000
    return {f"p{p:g}": float(np.percentile(arr, p)) for p in ps}


def summarize(results, dur: float, ps: tuple[float, ...], slo_ms: dict[str, float], mean_in_flight: float) -> dict:
    """One point's figures from its Results (labs.loadgen.client) over `dur` seconds."""
    ok = [r for r in results if r.success]
    ttft = [r.ttft for r in ok]
    e2el = [r.latency for r in ok]
    itl = [g for r in ok for g in r.itl]
    out_lens = [r.output_tokens or 1 for r in ok]  # vLLM counts 1 when the server sent no usage
    tpot, all_tpot = [], []
    for r, n in zip(ok, out_lens):
        t = (r.latency - r.ttft) / (n - 1) if n > 1 else 0.0
        if n > 1:
            tpot.append(t)
        all_tpot.append(t)
    good = 0
    for i in range(len(ok)):
        checks = {"ttft": ttft[i], "tpot": all_tpot[i], "e2el": e2el[i]}
        if all(checks[k] <= v / 1000 for k, v in slo_ms.items()):
            good += 1
    completed = len(ok)
    lam = completed / dur if dur > 0 else 0.0
    w = float(np.mean(e2el)) if e2el else 0.0
    row = {
        "completed": completed,
        "failed": len(results) - completed,
        "duration_s": dur,
        "total_input": sum(r.prompt_len for r in ok),
        "total_output": sum(out_lens),
        "request_throughput": lam,
        "request_goodput": good / dur if dur > 0 else 0.0,
        "output_throughput": sum(out_lens) / dur if dur > 0 else 0.0,
        "total_token_throughput": (sum(r.prompt_len for r in ok) + sum(out_lens)) / dur if dur > 0 else 0.0,
        "little_L": mean_in_flight,
        "little_lambda_W": lam * w,
    }
    row["little_ratio"] = mean_in_flight / (lam * w) if lam * w > 0 else None
    row["little_ok"] = row["little_ratio"] is not None and abs(row["little_ratio"] - 1) <= LITTLE_TOLERANCE
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        row[f"mean_{name}_ms"] = float(np.mean(values)) * 1000 if values else 0.0
        for k, v in percentiles(values, ps).items():
            row[f"{k}_{name}_ms"] = v
    errors: dict[str, int] = {}
    for r in results:
        if not r.success:
            key = r.error.split(":", 1)[0][:60]
            errors[key] = errors.get(key, 0) + 1
    row["errors"] = errors
    return row


def knee(loads: list[float], throughputs: list[float], slope: float = KNEE_SLOPE) -> int | None:
    """Index of the knee (see the module docstring), or None when the sweep never saturates."""
    for i in range(len(loads) - 1):
        x0, x1, y0, y1 = loads[i], loads[i + 1], throughputs[i], throughputs[i + 1]
        if x0 <= 0 or x1 <= x0 or y0 <= 0:
            continue
        s = math.log(max(y1, 1e-12) / y0) / math.log(x1 / x0)
        if s < slope:
            return i
    return None


def slopes(loads: list[float], throughputs: list[float]) -> list[float | None]:
    """Log-log slope from each point to the next (None for the last point, or where undefined)."""
    out: list[float | None] = []
    for i in range(len(loads)):
        if i + 1 >= len(loads) or loads[i] <= 0 or loads[i + 1] <= loads[i] or throughputs[i] <= 0 \
                or throughputs[i + 1] <= 0:
            out.append(None)
            continue
        out.append(math.log(throughputs[i + 1] / throughputs[i]) / math.log(loads[i + 1] / loads[i]))
    return out
