"""The observe labs: bucket quantiles against exact percentiles, the scraper without a server, the
timeline summary on a hand-built trace, the binding-constraint rules, and a tiny CPU run of each CLI."""

from __future__ import annotations

import json
import math
import random

import pytest

from labs.observe import diagnose, scrape, series, timeline

EDGES = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12]


def _bucketed(values, edges=EDGES):
    cum = [sum(v <= e for v in values) for e in edges] + [len(values)]
    return cum


def test_quantile_interpolates_inside_the_bucket():
    # 10 at <=1, 20 more at <=2, 10 more at <=4: rank 20 is halfway through (1, 2]
    assert series.quantile(0.5, [1, 2, 4], [10, 30, 40, 40]) == pytest.approx(1.5)
    assert series.quantile(0.99, [1, 2, 4], [10, 30, 40, 40]) == pytest.approx(2 + 2 * 9.6 / 10)
    assert series.quantile(0.99, [1, 2, 4], [0, 0, 0, 5]) == 4  # in +Inf: the last finite edge, as Prometheus
    assert series.quantile(0.5, [1, 2], [0, 0, 0]) is None
    with pytest.raises(ValueError):
        series.quantile(0.5, [1, 2], [1, 2])


@pytest.mark.parametrize("seed", range(20))
def test_bucket_quantile_lands_in_the_bucket_of_the_exact_percentile(seed):
    rng = random.Random(seed)
    values = [rng.lognormvariate(math.log(0.2), rng.uniform(0.3, 1.5)) for _ in range(rng.randrange(50, 2000))]
    values = [min(v, 5.0) for v in values]
    for q in (0.5, 0.9, 0.99):
        got = series.quantile(q, EDGES, _bucketed(values))
        exact = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
        lo = max([0.0] + [e for e in EDGES if e < exact])
        hi = min(e for e in EDGES if e >= exact)
        assert lo <= got <= hi, (q, got, exact)


def _exposition(waiting, running, kv, ttfts):
    from labs.server.metrics import Metrics

    m = Metrics("m")
    for t in ttfts:
        m.observe("vllm:time_to_first_token_seconds", t)
    return m.render({"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
                     "vllm:kv_cache_usage_perc": kv})


def test_reading_round_trips_the_servers_metrics_and_windows_subtract():
    a = series.reading(_exposition(3, 8, 0.5, [0.05, 0.3]))
    assert (a["num_requests_waiting"], a["num_requests_running"], a["kv_cache_usage_perc"]) == (3, 8, 0.5)
    assert a["ttft_cum"][-1] == 2 and len(a["ttft_cum"]) == len(a["ttft_le"]) + 1
    b = series.reading(_exposition(0, 1, 0.1, [0.05, 0.3] + [1.0] * 100))
    # the window holds only the 100 new 1 s observations: p99 falls in (0.64, 1.28]
    assert 0.64 < series.window_quantile(0.99, a, b) <= 1.28
    assert series.window_quantile(0.99, b, a) is None  # a counter went down: a restart, no window
    with pytest.raises(series.ExpositionError):
        series.reading("vllm:num_requests_running 1\n")


def test_poll_keeps_failed_scrapes_as_rows_and_stops_when_idle():
    texts = iter([_exposition(2, 4, 0.3, [0.1])] * 3 + [OSError("refused")] + [_exposition(0, 0, 0, [0.1])] * 20)
    clock = iter(i * 0.5 for i in range(1000))

    def get(_url):
        t = next(texts)
        if isinstance(t, Exception):
            raise t
        return t

    rows = scrape.poll("http://x/metrics", 0.5, 60, 1.0, "s", idle_s=1.0, get=get, clock=lambda: next(clock),
                       sleep=lambda _s: None)
    assert [r["ok"] for r in rows[:5]] == [True, True, True, False, True]
    assert "refused" in rows[3]["error"]
    assert len(rows) < 10  # stopped about a second after the server went idle
    assert rows[1]["ttft_p99_window_ms"] is None  # nothing new was observed in that window


def _ev(name, cat, ts, dur, tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}


def test_timeline_splits_a_step_into_busy_and_idle():
    trace = {"traceEvents": [
        _ev("engine_step_0", "user_annotation", 0, 100),
        _ev("void gemm<float, 128>(float*)", "kernel", 20, 30),  # 20 us of host work before the first kernel
        _ev("attn_kernel", "kernel", 55, 10),  # 5 us gap
        _ev("gemm<half>", "kernel", 65, 20),  # back to back
        _ev("cudaLaunchKernel", "cuda_runtime", 18, 2),
        _ev("cuLaunchKernel", "cuda_driver", 52, 2),  # a Triton kernel's launch: the driver API
        _ev("cuModuleGetFunction", "cuda_driver", 53, 1),  # not a launch
        _ev("engine_step_1", "user_annotation", 100, 50),
        _ev("attn_kernel", "kernel", 110, 30),
    ]}
    s = timeline.summarise(trace)
    assert s["steps"] == 2 and s["step_us"] == 75
    assert s["gpu_busy_us"] == pytest.approx((60 + 30) / 2)
    assert s["idle_before_first_kernel_us"] == pytest.approx((20 + 10) / 2)
    assert s["idle_between_kernels_us"] == pytest.approx(5 / 2)
    assert s["idle_after_last_kernel_us"] == pytest.approx((15 + 10) / 2)
    assert s["largest_gap_us"] == 5 and s["largest_gap_between"] == ["gemm", "attn_kernel"]
    assert s["gaps_per_step"] == 0.5 and s["kernels_per_step"] == 2
    assert s["launch_calls_per_step"] == 0.5 and s["driver_launch_calls_per_step"] == 0.5  # counted apart
    top = {k["name"]: k for k in s["top"]}
    assert top["gemm"]["us_per_step"] == 25 and top["attn_kernel"]["calls_per_step"] == 1
    with pytest.raises(timeline.TraceError):
        timeline.summarise({"traceEvents": []})


def test_self_times_subtract_children_per_thread():
    ops = [_ev("outer", "cpu_op", 0, 100), _ev("inner", "cpu_op", 10, 30), _ev("inner", "cpu_op", 50, 20),
           _ev("other_thread", "cpu_op", 5, 50, tid=2)]
    assert timeline.self_times(ops) == {"outer": 50, "inner": 50, "other_thread": 50}


BASE = dict(ttft_p99_ms=100.0, tpot_p99_ms=10.0, queue_p99_ms=10.0, preemptions=0, seats_full_share=0.0,
            budget_full_share=0.0, kv_full_share=0.0, mixed_step_ms=12.0, decode_step_ms=10.0)
SLO = diagnose.SLO(ttft_ms=200, tpot_ms=30)


@pytest.mark.parametrize("changes, binding, cause_word, met", [
    ({}, "prefill", "chunks", True),  # both met: TTFT has the least headroom
    ({"ttft_p99_ms": 900, "queue_p99_ms": 800, "seats_full_share": 0.6}, "queue", "seats", False),
    ({"ttft_p99_ms": 900, "queue_p99_ms": 800, "budget_full_share": 0.5}, "prefill", "budget", False),
    ({"ttft_p99_ms": 900, "queue_p99_ms": 100}, "prefill", "chunks", False),
    ({"tpot_p99_ms": 90, "mixed_step_ms": 40}, "decode", "prefill chunks", False),
    ({"tpot_p99_ms": 90}, "decode", "batch", False),
    ({"tpot_p99_ms": 90, "preemptions": 3}, "kv", "preemptions", False),
    ({"ttft_p99_ms": 900, "queue_p99_ms": 800, "kv_full_share": 0.3, "seats_full_share": 0.6}, "kv", "KV", False),
])
def test_binding_constraint_rules(changes, binding, cause_word, met):
    d = diagnose.binding({**BASE, **changes}, SLO)
    assert d["binding"] == binding and cause_word in d["cause"] and d["slo_met"] is met


def test_tune_replay_on_the_tiny_cpu_engine_names_a_constraint(tmp_path):
    from labs.observe import tune

    from server_helpers import tiny_llm

    trace = tune.load_trace(6, rate_scale=50, length_scale=0.02)
    llm = tiny_llm(**tune.engine_args({"max_num_seqs": 2}, trace))
    raw = tune.replay(llm, trace, max_run_s=30)
    row = tune.summarise(raw, llm.config, diagnose.SLO(1e6, 1e6), offered=len(trace))
    assert row["completed"] == 6 and row["good"] == 6 and not row["cut"] and row["slo_met"]
    assert row["running_mean"] <= 2 and row["waiting_max"] >= 1  # two seats, six requests at once
    assert row["binding"] in diagnose.CONSTRAINTS
    json.dumps(row, allow_nan=False)


def test_tune_cut_run_counts_unfinished_requests_as_missed():
    from labs.observe import tune

    from server_helpers import tiny_llm

    trace = tune.load_trace(3, rate_scale=50, length_scale=0.02)
    trace = [(a, p, 200) for a, p, _ in trace]
    llm = tiny_llm(**tune.engine_args({}, trace))
    raw = tune.replay(llm, trace, max_run_s=0.05)
    row = tune.summarise(raw, llm.config, diagnose.SLO(1e6, 1e6), offered=3)
    assert raw["cut"] and row["unfinished"] == 3 and row["good"] == 0 and row["tpot_p99_ms"] is None
    assert not row["slo_met"]
    json.dumps(row, allow_nan=False)


def test_profile_cli_on_the_cpu_writes_a_small_summary(tmp_path):
    from labs.observe import profile

    rc = profile.main(["--tiny", "--device", "cpu", "--batch", "2", "--context", "8", "--chunk", "16", "--steps", "1",
                       "--out", str(tmp_path)])
    assert rc == 0
    out = json.loads((tmp_path / "profile.json").read_text())
    cases = {r["case"]: r for r in out["rows"]}
    assert set(cases) == {"decode, eager", "mixed: prefill chunk + decodes"}  # no CUDA graphs on a CPU
    eager = cases["decode, eager"]
    assert eager["top"] and eager["top"][0]["name"].startswith("aten::")
    assert eager["trace_bytes_with_stack_and_shapes"] > eager["trace_bytes"]
    assert len(json.dumps(out)) < 20_000


@pytest.mark.gpu
def test_profile_on_the_gpu_sees_kernels_and_graphs_cut_launches(tmp_path):
    from labs.observe import profile

    rc = profile.main(["--layers", "2", "--batch", "8", "--context", "128", "--chunk", "256", "--steps", "2",
                       "--out", str(tmp_path)])
    assert rc == 0
    rows = {r["case"]: r for r in json.loads((tmp_path / "profile.json").read_text())["rows"]}
    graphs, eager = rows["decode, CUDA graphs"], rows["decode, eager"]
    assert graphs["kernels_per_step"] > 0 and eager["kernels_per_step"] > 0
    assert graphs["launch_calls_per_step"] < eager["launch_calls_per_step"]
    assert graphs["gpu_busy_share"] > eager["gpu_busy_share"]


@pytest.mark.gpu
def test_tune_on_the_gpu_runs_one_setting(tmp_path):
    from labs.observe import tune

    rc = tune.main(["--layers", "2", "--requests", "16", "--length-scale", "0.25", "--rate-scale", "4",
                    "--only", "base", "--max-run-s", "20", "--out", str(tmp_path)])
    assert rc == 0
    (row,) = json.loads((tmp_path / "tune.json").read_text())["rows"]
    assert row["completed"] == 16 and row["binding"] in diagnose.CONSTRAINTS


def test_report_reads_the_recorded_h200_rows():
    from labs.observe import report

    s = report.observe_scrape_summary("H200")
    assert s["scrapes"] > 10 and s["running_max"] > 0
    lo, hi = s["p99_bucket_lo_ms"], s["p99_bucket_hi_ms"]
    assert hi is None or lo <= s["ttft_p99_ms"] <= hi  # the bucket p99 lies in the bucket it names
    table = report.observe_profile_table("H200")
    assert table.count("\n") == 4  # header, rule, three cases
    g = report.observe_profile_row("decode, CUDA graphs")
    assert 0 < g["gpu_busy_share"] <= 1
    assert g["head_ms"] + g["between_ms"] + g["tail_ms"] + g["gpu_busy_ms"] == pytest.approx(g["step_ms"], rel=0.05)
    assert report.observe_relief_table().count("\n") == len(diagnose.RELIEF) + 1
    with pytest.raises(report.ReportError):
        report.observe_profile_row("no such case")
