"""GET /metrics: Prometheus text exposition under vLLM 0.33's metric names, written by hand.

The GPU machine has no prometheus_client, and the format is simple: `# HELP`, `# TYPE`,
then one line per sample. A counter `x` is exposed as `x_total`, a histogram as
`x_bucket{le=...}`, `x_sum` and `x_count`, as prometheus_client does, so a dashboard built
for `vllm serve` reads this server unchanged. Every name is looked up in
labs/data/vllm.yaml when this module is imported: a metric vLLM does not have (or has
with another type) fails at start, not on a dashboard.

Only metrics whose meaning is the same here are exported. Gauges are read at scrape time
from the scheduler and block manager; counters and histograms are fed by the engine
thread as requests finish, under one lock (scrapes come from the event loop's thread).
"""

from __future__ import annotations

import math
import threading

from labs import vllm_facts

# Bucket edges in seconds (latencies) or tokens; our own choice, not vLLM's lists.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                   20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prompt_tokens_cached",
            "vllm:request_success", "vllm:admission_rejections")
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": LATENCY_BUCKETS,
    "vllm:inter_token_latency_seconds": LATENCY_BUCKETS,
    "vllm:request_time_per_output_token_seconds": LATENCY_BUCKETS,
    "vllm:e2e_request_latency_seconds": LATENCY_BUCKETS,
    "vllm:request_queue_time_seconds": LATENCY_BUCKETS,
    "vllm:request_prompt_tokens": TOKEN_BUCKETS,
    "vllm:request_generation_tokens": TOKEN_BUCKETS,
    "vllm:iteration_tokens_total": TOKEN_BUCKETS,
}


def _checked() -> dict[str, dict]:
    """name -> facts entry, for every metric above; refuses a name or type the facts file lacks."""
    kinds = {**{g: "gauge" for g in GAUGES}, **{c: "counter" for c in COUNTERS}, **{h: "histogram" for h in HISTOGRAMS}}
    out = {}
    for name, kind in kinds.items():
        base, entry = vllm_facts.metric(name)
        if base != name or entry["type"] != kind:
            raise vllm_facts.FactError(f"{name}: labs/data/vllm.yaml says {entry['type']} {base}, not {kind} {name}")
        out[name] = entry
    return out


FACTS = _checked()


def _labels(d: dict[str, str]) -> str:
    if not d:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in d.items())
    return "{" + body + "}"


def _escape(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Histogram:
    __slots__ = ("edges", "counts", "total", "n")

    def __init__(self, edges):
        self.edges = edges
        self.counts = [0] * len(edges)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        for i, edge in enumerate(self.edges):
            if v <= edge:
                self.counts[i] += 1
                break
        self.total += v
        self.n += 1


class Metrics:
    """The server's metrics; `render(gauges)` gives the exposition text."""

    def __init__(self, model_name: str, engine: str = "0"):
        self.base = {"model_name": model_name, "engine": engine}
        self.lock = threading.Lock()
        self.counters: dict[tuple[str, tuple], float] = {}
        self.hists = {name: _Histogram(edges) for name, edges in HISTOGRAMS.items()}
        for reason in ("stop", "length", "abort", "error"):
            self.counters[("vllm:request_success", (("finished_reason", reason),))] = 0
        for reason in ("max_num_queued_reqs",):
            self.counters[("vllm:admission_rejections", (("reason", reason),))] = 0
        for name in ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
                     "vllm:prompt_tokens_cached"):
            self.counters[(name, ())] = 0

    def inc(self, name: str, by: float = 1, **labels) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self.lock:
            self.counters[key] = self.counters.get(key, 0) + by

    def observe(self, name: str, value: float) -> None:
        with self.lock:
            self.hists[name].observe(value)

    def _label_set(self, name: str, extra: tuple) -> dict:
        wanted = FACTS[name].get("labels") or []
        d = {k: v for k, v in self.base.items() if k in wanted}
        d.update(extra)
        return d

    def render(self, gauges: dict[str, float]) -> str:
        lines: list[str] = []

        def head(name: str, kind: str) -> None:
            lines.append(f"# HELP {name} {' '.join(str(FACTS[name]['meaning']).split())}")
            lines.append(f"# TYPE {name} {kind}")

        for name in GAUGES:
            head(name, "gauge")
            lines.append(f"{name}{_labels(self._label_set(name, ()))} {_num(gauges[name])}")
        with self.lock:
            for name in COUNTERS:
                head(name, "counter")
                for (n, extra), v in sorted(self.counters.items()):
                    if n == name:
                        lines.append(f"{name}_total{_labels(self._label_set(name, extra))} {_num(v)}")
            for name, h in self.hists.items():
                head(name, "histogram")
                labels = self._label_set(name, ())
                running = 0
                for edge, c in zip(h.edges, h.counts):
                    running += c
                    lines.append(f"{name}_bucket{_labels({**labels, 'le': _num(float(edge))})} {running}")
                lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {h.n}")
                lines.append(f"{name}_sum{_labels(labels)} {_num(float(h.total))}")
                lines.append(f"{name}_count{_labels(labels)} {h.n}")
        return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, float]:
    """Exposition text -> {'name{labels}': value}; what the tests and the load generator read back."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out
