"""The CUDA-graphs lab: the fused add + RMSNorm kernel, launch counting, rows, the page table.

CPU: the Triton kernel in the interpreter on ragged hidden sizes against torch, the
profile summary on fake events, rows and speedups, bad CLI arguments. GPU: the kernel
in bf16 at real sizes, and a captured decode step that matches eager.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from labs.cuda_graphs import lab, report
from labs.gpu_harness import results

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from labs.cuda_graphs.fused import fused_add_rmsnorm, rmsnorm_bytes, unfused_add_rmsnorm  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows,hidden", [(3, 100), (1, 64), (5, 257)])
def test_fused_kernel_matches_the_torch_ops(rows, hidden):
    g = torch.Generator(device=DEV).manual_seed(hidden)
    x, res, w = (torch.randn(*s, device=DEV, generator=g) for s in ((rows, hidden), (rows, hidden), (hidden,)))
    (y, h), (y0, h0) = fused_add_rmsnorm(x, res, w), unfused_add_rmsnorm(x, res, w)
    assert torch.allclose(h, h0) and (y - y0).abs().max().item() < 1e-5


def test_fused_kernel_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="weight"):
        fused_add_rmsnorm(torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(4))


def test_bytes_are_two_reads_two_writes_and_the_weight():
    assert rmsnorm_bytes(1, 2560) == 5 * 2560 * 2


def test_profile_summary_counts_launch_calls_and_kernels_per_step():
    E = lab.Event
    events = [E("cudaLaunchKernel", False, 3.0)] * 10 + [E("aten::mm", False, 9.0)] * 4 + \
        [E("cudaGraphLaunch", False, 5.0)] * 2 + [E("ampere_gemm", True, 7.0)] * 12
    s = lab.profile_summary(events, steps=2)
    assert s == {"launches": 6.0, "graph_launches": 1.0, "kernels": 6.0, "kernel_us": 42.0}
    with pytest.raises(ValueError):
        lab.profile_summary(events, 0)


def test_rows_carry_busy_fraction_and_speedup_against_eager_of_the_same_phase():
    prof = {"launches": 100, "graph_launches": 0, "kernels": 100, "kernel_us": 400.0}
    rows = lab.with_speedup([lab.row("eager", "decode", 1, 1000.0, prof), lab.row("graph", "decode", 1, 420.0,
                             {**prof, "launches": 1, "graph_launches": 1}),
                             lab.row("eager", "prefill", 4096, 9000.0, {**prof, "kernel_us": 8800.0})])
    assert rows[0]["gpu_busy"] == 0.4 and rows[1]["vs_eager"] == 2.38 and rows[2]["vs_eager"] == 1.0
    assert lab.row("graph", "decode", 1, 10.0, {**prof, "kernels": 0})["gpu_busy"] is None
    assert "decode" in lab.printed({"step": rows})["step"]


def test_the_page_table(tmp_path, monkeypatch):
    path = tmp_path / "cuda_graphs.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    assert "Not recorded yet" in report.cuda_graphs_table("step", "H200")
    prof = {"launches": 100, "graph_launches": 0, "kernels": 100, "kernel_us": 400.0}
    step = lab.with_speedup([lab.row("eager", "decode", 1, 1000.0, prof)])
    fusion = [lab.fusion_row(1, 2560, 30.0, 6.0, rmsnorm_bytes(1, 2560), 7, 1)]
    results.record(path, "cuda_graphs", {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132,
                   "compute_capability": "9.0", "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"},
                   {"copy_gb_s": 4250.0, "reps": 50, "failed": []}, {"step": step, "fusion": fusion},
                   lab.config_name, lab.printed)
    assert "| decode | `eager` | 1 | 1,000.0 | 1.00 | 100 | 100 | 400.0 | 40% |" in report.cuda_graphs_table("step", "H200")
    assert report.cuda_graphs_fusion_row(1, "H200")["speedup"] == 5.0
    assert "wall-clock" in report.cuda_graphs_env("H200")


@pytest.mark.parametrize("args", [["--reps", "0"], ["--only", "graphs"], ["--record", "--only", "step"]])
def test_bad_arguments_exit_2_with_one_line(args):
    proc = subprocess.run([sys.executable, "-m", "labs.cuda_graphs", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_gpu_fused_kernel_in_bf16_at_real_sizes():
    for rows, hidden in ((1, 2560), (3000, 4096), (7, 5120)):
        x, res = (torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        (y, h), (y0, h0) = fused_add_rmsnorm(x, res, w), unfused_add_rmsnorm(x, res, w)
        assert torch.equal(h, h0)
        assert ((y.float() - y0.float()).norm() / y0.float().norm()).item() < 1e-2


@pytest.mark.gpu
def test_gpu_captured_decode_step_matches_eager_and_follows_new_inputs():
    from labs.cuda_graphs.stack import Captured, Shapes, Stack

    stack = Stack(Shapes(512, 8, 2, 64, 1024, 2), context=64, batch=2, fused=True)
    x = torch.randn(2, 512, device="cuda", dtype=torch.bfloat16)
    cap = Captured(lambda inp: stack.forward(inp, True), x.clone())
    x2 = torch.randn_like(x)
    cap.input.copy_(x2)  # a new step writes its inputs into the captured tensor
    out = cap.replay().float()
    ref = stack.forward(x2, True).float()
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2


def test_prose_waits_for_a_complete_run(tmp_path, monkeypatch):
    """A run whose graph rows failed fills the table but not the lesson's quoted sentences."""
    path = tmp_path / "cuda_graphs.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    assert not report.cuda_graphs_complete("H200")
    prof = {"launches": 100, "graph_launches": 0, "kernels": 100, "kernel_us": 400.0}
    env = {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132, "compute_capability": "9.0",
           "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"}
    eager_only = lab.with_speedup([lab.row("eager", p, 1, 1000.0, prof) for p in ("decode", "prefill")])
    results.record(path, "cuda_graphs", env, {"copy_gb_s": 4250.0, "reps": 10, "failed": []}, {"step": eager_only},
                   lab.config_name, lab.printed)
    assert report.cuda_graphs_recorded("H200") and not report.cuda_graphs_complete("H200")
    full = lab.with_speedup([lab.row(v, p, 1, 1000.0, prof) for p in ("decode", "prefill") for v in ("eager", "graph")])
    results.record(path, "cuda_graphs", env, {"copy_gb_s": 4250.0, "reps": 10, "failed": []}, {"step": full},
                   lab.config_name, lab.printed)
    assert report.cuda_graphs_complete("H200")
