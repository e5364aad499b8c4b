"""The roofline lab and the cost model's single-operator costs (GEMM, attention forward).

CPU: the formulas against brute-force counts, the ridge solved both ways, the rows
and the measured ridge from fake timings, the page table and plot data, bad CLI
arguments. GPU: the bf16 and fp8 GEMMs and the paged kernel at the lab's shapes.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from conftest import ROOT
from labs import roofline
from labs.gpu_harness import results
from labs.roofline_lab import lab, report

ENV = {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132, "compute_capability": "9.0",
       "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"}


@pytest.mark.parametrize("m,n,k,dtype", [(1, 28672, 4096, "bf16"), (512, 4096, 14336, "bf16"), (7, 96, 48, "fp8")])
def test_gemm_counts_two_flops_per_product_and_each_matrix_once(m, n, k, dtype):
    c = roofline.gemm("h200", m, n, k, dtype)
    a = {"bf16": 2, "fp8": 1}[dtype]
    assert c.flops == 2 * m * n * k
    assert c.bytes == a * m * k + a * k * n + 2 * m * n
    assert c.floor_s == max(c.flops / 1979e12 if dtype == "fp8" else c.flops / 989.5e12, c.bytes / 4.8e12)


@pytest.mark.parametrize("dtype,tflops,tb_s", [("bf16", None, None), ("bf16", 684.0, 4.25), ("fp8", None, None)])
def test_the_ridge_m_is_where_intensity_meets_peak_over_bandwidth(dtype, tflops, tb_s):
    n, k = lab.gemm_shape()
    m = roofline.gemm_ridge_m("h200", n, k, dtype, tflops, tb_s)
    c = roofline.gemm("h200", max(1, round(m)), n, k, dtype, tflops, tb_s)
    ridge = c.flops_per_s / c.bytes_per_s
    assert abs(roofline.gemm("h200", m, n, k, dtype, tflops, tb_s).intensity - ridge) < 1e-6 * ridge
    assert roofline.gemm("h200", math.floor(m), n, k, dtype, tflops, tb_s).bound == "memory"
    assert roofline.gemm("h200", math.ceil(m) + 1, n, k, dtype, tflops, tb_s).bound == "compute"


def test_a_gemm_too_thin_to_reach_the_ridge_has_an_infinite_ridge_m():
    assert roofline.gemm_ridge_m("h200", 64, 64) == math.inf


@pytest.mark.parametrize("bad", [dict(m=0, n=1, k=1), dict(m=1, n=1, k=1, dtype="int4")])
def test_gemm_refuses_bad_sizes_and_dtypes(bad):
    with pytest.raises(roofline.CostModelError):
        roofline.gemm("h200", **bad)


def _rows(peak_m_tflops=684.0, bw=4.25e3):
    """Fake timings on a perfect two-roof GPU: time = max(flops / peak, bytes / bw)."""
    n, k = lab.gemm_shape()
    rows = []
    for dtype in lab.GEMM_DTYPES:
        scale = 2 if dtype == "fp8" else 1
        for m in lab.M_VALUES:
            c = roofline.gemm("h200", m, n, k, dtype)
            t_us = max(c.flops / (peak_m_tflops * scale * 1e12), c.bytes / (bw * 1e9)) * 1e6
            rows.append(lab.gemm_row(dtype, m, n, k, t_us, 1e-3))
    return rows


def test_the_measured_ridge_comes_from_the_measured_roofs():
    ridges = {r["dtype"]: r for r in lab.ridges(_rows())}
    bf = ridges["bf16"]
    assert abs(bf["peak_tflop_s"] - 684.0) < 1 and abs(bf["bandwidth_tb_s"] - 4.25) < 0.01
    n, k = lab.gemm_shape()
    assert abs(bf["ridge_m"] - roofline.gemm_ridge_m("h200", n, k, "bf16", 684.0, 4.25)) < 2
    assert 150 < bf["ridge_m"] < 200 < bf["model_ridge_m"] < 230  # measured roofs sit below the datasheet's
    assert ridges["fp8"]["ridge_m"] > bf["ridge_m"]


def test_decode_attention_intensity_does_not_depend_on_batch_or_context():
    rows = [lab.attention_row(b, L, 32, 8, 128, 10.0, 0.0) for b in lab.ATTN_BATCHES for L in lab.ATTN_CONTEXTS]
    ref = roofline.deployment("llama-3.1-8b", "h200").attention_flop_per_byte()
    assert all(abs(r["intensity"] - ref) < 0.01 * ref for r in rows)  # q and out are under 1% of the bytes


def test_printed_tables_and_config_names_are_unique():
    rows = _rows()
    sections = {"gemm": rows, "ridge": lab.ridges(rows), "attention": [lab.attention_row(1, 1024, 32, 8, 128, 5.0, 0.0)]}
    text = lab.printed(sections)
    assert set(text) == {"gemm", "ridge", "attention"} and "8192" in text["gemm"]
    names = [lab.config_name(e, r) for e, rs in sections.items() for r in rs]
    assert len(set(names)) == len(names)


def test_the_page_renders_recorded_rows_or_says_not_recorded(tmp_path, monkeypatch):
    path = tmp_path / "roofline_lab.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    assert "Not recorded yet" in report.roofline_lab_table("gemm", "H200")
    rows = _rows()
    results.record(path, "roofline_lab", ENV, {"copy_gb_s": 4250.0, "reps": 10, "failed": []},
                   {"gemm": rows, "ridge": lab.ridges(rows)}, lab.config_name, lab.printed)
    md = report.roofline_lab_table("ridge", "H200")
    assert "2030-01-02" in md and "| bf16 | 684 |" in md
    assert report.roofline_lab_gemm("bf16", 8192, "H200")["tflop_s"] > 600
    series, marks = report.plot_series(report.RESULTS.entry("H200"))
    assert "bf16 GEMM, measured" in series and marks[0][0] == "x"


@pytest.mark.parametrize("args", [["--reps", "0"], ["--only", "conv"], ["--record", "--only", "gemm"]])
def test_bad_arguments_exit_2_with_one_line(args):
    proc = subprocess.run([sys.executable, "-m", "labs.roofline_lab", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_gpu_gemms_match_fp32_at_the_lab_shape(dtype):
    torch = pytest.importorskip("torch")
    n, k = lab.gemm_shape()
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * k**-0.5
    for m in (1, 200, 4096):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fn, xr, wr = lab._gemm_fn(torch, dtype, x, w)
        assert lab._rel_err(fn(), xr @ wr) <= lab.MATCH_REL_ERR[dtype]
