"""labs.loadgen: its metrics against vLLM's own calculate_metrics, the knee rule, argument checks, and a
short sweep against labs.server on 127.0.0.1 (JSON, CSV and the recorded file)."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys

import pytest

from labs.loadgen import stats
from labs.loadgen.client import Result


def _results(n: int, seed: int = 0) -> list[Result]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(1, 12)
        itl = [rng.uniform(0.005, 0.05) for _ in range(k - 1)]
        ttft = rng.uniform(0.02, 0.8)
        out.append(Result(start=i * 0.1, ttft=ttft, latency=ttft + sum(itl), itl=itl, prompt_len=rng.randint(4, 64),
                          output_tokens=k, success=rng.random() > 0.1, error=""))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_metrics_match_vllm_bench_serve(seed):
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    results = _results(40 + 7 * seed, seed)
    slo = {"ttft": 400.0, "tpot": 30.0} if seed % 2 else {"e2el": 500.0}
    ps = (50.0, 90.0, 99.0)
    ours = stats.summarize(results, 9.5, ps, slo, mean_in_flight=1.0)
    outs = [RequestFuncOutput(success=r.success, latency=r.latency, output_tokens=r.output_tokens, ttft=r.ttft,
                              itl=list(r.itl), prompt_len=r.prompt_len, start_time=r.start) for r in results]
    ref, _ = serve.calculate_metrics([], outs, 9.5, None, list(ps), slo)
    assert ours["completed"] == ref.completed and ours["total_output"] == ref.total_output
    for name in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput"):
        assert ours[name] == pytest.approx(getattr(ref, name), rel=1e-12)
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert ours[f"mean_{m}_ms"] == pytest.approx(getattr(ref, f"mean_{m}_ms"), rel=1e-12)
        for p, v in getattr(ref, f"percentiles_{m}_ms"):
            assert ours[f"p{p:g}_{m}_ms"] == pytest.approx(v, rel=1e-12)


def test_knee_is_where_the_log_log_slope_drops_below_one_half():
    loads = [1, 2, 4, 8, 16, 32]
    assert stats.knee(loads, [10, 20, 40, 80, 160, 320]) is None  # linear all the way
    assert stats.knee(loads, [10, 20, 39, 60, 66, 67]) == 3  # 4 -> 8 gains 1.54x: slope 0.62; 8 -> 16: 0.14
    assert loads[stats.knee(loads, [10, 19, 36, 44, 45, 45])] == 4
    assert stats.knee([1], [5]) is None


def test_little_ratio_flags_a_mismatch():
    results = _results(30)
    row = stats.summarize(results, 5.0, (50,), {}, mean_in_flight=0.0)
    assert row["little_ok"] is False and row["little_ratio"] == 0
    lam_w = row["little_lambda_W"]
    assert stats.summarize(results, 5.0, (50,), {}, mean_in_flight=lam_w * 1.05)["little_ok"] is True


@pytest.mark.parametrize("args, word", [
    (["--concurrency", "0", "--out", "{out}"], "--concurrency"),
    (["--concurrency", "1,1", "--out", "{out}"], "--concurrency"),
    (["--request-rate", "nan", "--out", "{out}"], "--request-rate"),
    (["--request-rate", "-2", "--out", "{out}"], "--request-rate"),
    (["--concurrency", "4", "--num-prompts", "1000000", "--out", "{out}"], "--num-prompts"),
    (["--concurrency", "4", "--goodput", "ttfb:3", "--out", "{out}"], "--goodput"),
    (["--concurrency", "4", "--max-duration", "inf", "--out", "{out}"], "--max-duration"),
    (["--out", "{out}"], "--concurrency"),
    (["--concurrency", "4", "--record", "--out", "{out}"], "--machine"),
    (["--concurrency", "4", "--base-url", "ftp://x", "--out", "{out}"], "--base-url"),
])
def test_cli_refuses_bad_arguments(tmp_path, capsys, args, word):
    from labs.loadgen.__main__ import main

    args = [a.replace("{out}", str(tmp_path / "o")) for a in args]
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert word in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_no_server_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "labs.loadgen", "--base-url", "http://127.0.0.1:9", "--concurrency",
                        "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_sweep_against_our_server(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    pytest.importorskip("aiohttp")
    from labs.loadgen import __main__ as lg
    from labs.server.app import build_app
    from tests.server_helpers import running, tiny_llm

    results_file = tmp_path / "server_sweep.json"
    monkeypatch.setattr(lg, "RESULTS_FILE", results_file)
    with running(build_app(tiny_llm())) as url:
        rc = lg.main(["--base-url", url, "--concurrency", "1,4", "--request-rate", "50", "--num-prompts", "8",
                      "--input-len", "8", "--output-len", "4", "--ignore-eos", "--warmup", "1", "--max-duration",
                      "20", "--goodput", "ttft:10000", "--out", str(tmp_path / "out"), "--progress", "off",
                      "--record", "--machine", "CPU test", "--system", "tiny"])
    assert rc == 0
    doc = json.loads((tmp_path / "out" / "loadgen.json").read_text())
    pts = doc["points"]
    assert [(p["mode"], p["load"]) for p in pts] == [("concurrency", 1.0), ("concurrency", 4.0), ("rate", 50.0)]
    for p in pts:
        assert p["ok"] and p["completed"] == 8 and p["total_output"] == 32
        assert p["request_goodput"] == pytest.approx(p["request_throughput"])  # a 10 s TTFT SLO: all good
        assert p["little_ok"], p
        assert p["p99_ttft_ms"] >= p["p50_ttft_ms"] > 0
    assert pts[0]["little_L"] == pytest.approx(1.0, abs=0.1)  # one client: one request in flight
    rows = list(csv.DictReader((tmp_path / "out" / "loadgen.csv").open()))
    assert len(rows) == 3 and rows[2]["mode"] == "rate"
    rec = json.loads(results_file.read_text())
    assert rec["lab"] == "loadgen" and len(rec["machines"]["CPU test"]["rows"]) == 3
