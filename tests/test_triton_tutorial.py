"""The Triton tutorial lab: vector add, fused softmax and tiled matmul against torch.

Without CUDA the kernels run in Triton's CPU interpreter (conftest sets TRITON_INTERPRET=1)
on small, ragged shapes in fp16 and fp32; GPU tests repeat them at real sizes in bf16,
fp16 and fp32. Every shape is chosen to leave a partial last block, where a missing mask
would read or write past the end.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from labs.gpu_harness import results
from labs.gpu_harness.timing import Summary
from labs.triton_tutorial import lab, report

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from labs.triton_tutorial import kernels  # noqa: E402

CPU = not torch.cuda.is_available()
DEVICE = "cpu" if CPU else "cuda"
# (atol, rtol) against an fp32 torch result. fp16/bf16: the output is rounded once to the
# dtype (unit 2**-11, 2**-8); the K-sum of the matmul adds fp32 rounding of sqrt(K) terms.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _close(out, ref, dtype, scale=1.0):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol * scale, rtol=rtol)


# ------------------------------------------------------------------ CPU interpreter (and GPU)


@pytest.mark.parametrize("n", [1, 17, 1000, 4099])
@pytest.mark.parametrize("block", [16, 1024])
def test_vector_add_matches_torch_including_the_ragged_tail(n, block):
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    assert torch.equal(kernels.add(x, y, block=block), x + y)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (7, 128), (5, 1000), (2, 4097)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_matches_torch_and_survives_large_logits(shape, dtype):
    x = (torch.randn(shape, device=DEVICE) * 30).to(dtype)  # exp(30) overflows fp16 without the max subtraction
    x[0, 0] = 80.0
    out = kernels.softmax(x)
    assert out.dtype == dtype and torch.isfinite(out.float()).all()
    _close(out, torch.softmax(x.float(), dim=-1), dtype)
    torch.testing.assert_close(out.float().sum(-1), torch.ones(shape[0], device=DEVICE), atol=1e-2, rtol=0)


def test_softmax_reads_rows_through_their_stride():
    x = torch.randn(6, 40, device=DEVICE)[:, :33]  # rows of 33 values, 40 apart
    _close(kernels.softmax(x), torch.softmax(x, dim=-1), torch.float32)


@pytest.mark.parametrize("mnk", [(16, 16, 16), (33, 17, 65), (64, 48, 40), (1, 70, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul_matches_torch_on_ragged_shapes(mnk, dtype):
    m, n, k = mnk
    a, b = torch.randn(m, k, device=DEVICE).to(dtype), torch.randn(k, n, device=DEVICE).to(dtype)
    kw = dict(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=1, num_stages=1) if CPU else {}
    out = kernels.matmul(a, b, **kw)
    ref = a.float() @ b.float()
    tol = 1.0 if dtype != torch.float32 or CPU else 1000.0  # on a GPU, fp32 tl.dot uses TF32 (10-bit mantissa)
    _close(out, ref, dtype, scale=tol * max(1.0, k**0.5))


def test_matmul_reads_a_transposed_operand_through_its_strides():
    a = torch.randn(40, 24, device=DEVICE)
    b = torch.randn(36, 24, device=DEVICE).t()  # (24, 36), column-major
    kw = dict(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1) if CPU else {}
    torch.testing.assert_close(kernels.matmul(a, b, **kw), a @ b, atol=1e-2 if not CPU else 1e-4, rtol=1e-2)


@pytest.mark.parametrize("call,message", [
    (lambda: kernels.add(torch.ones(3), torch.ones(4)), "share shape"),
    (lambda: kernels.softmax(torch.ones(2, 2, 2)), "2-D"),
    (lambda: kernels.softmax(torch.ones(2, kernels.MAX_SOFTMAX_COLS + 1)), "columns"),
    (lambda: kernels.matmul(torch.ones(2, 3), torch.ones(4, 2)), r"\(M, K\) @ \(K, N\)"),
    (lambda: kernels.matmul(torch.ones(2, 3), torch.ones(3, 2).half()), "dtype"),
    (lambda: kernels.matmul(torch.ones(2, 3), torch.ones(3, 2), block_k=24), "block_k"),
])
def test_bad_inputs_are_refused_before_any_launch(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------------ rows, CLI, page


def _t(us):
    return Summary(median_us=us, min_us=us, spread=0.01, samples=20)


def test_rows_report_bandwidth_for_memory_bound_kernels_and_flops_for_matmul():
    add = lab.Case("add", (1 << 28,), "float32")
    r = lab.row(add, _t(800.0), _t(790.0), 0.0, 0.0, copy_gb_s=4000.0)
    assert r["gb_s"] == round(3 * 4 * 2**28 / 800.0 / 1e3, 1) and r["time_vs_torch"] == round(800 / 790, 3)
    mm = lab.Case("matmul", (8192, 8192, 8192), "bfloat16")
    r = lab.row(mm, _t(1500.0), _t(1400.0), 2e-3, 2e-3, copy_gb_s=4000.0)
    assert r["tflop_s"] == round(2 * 8192**3 / 1500.0 / 1e6, 1) and "gb_s" not in r
    assert "TFLOP/s" in lab.format_row(r) and r["case"] == "matmul-8192x8192x8192-bfloat16"


def test_every_case_has_a_tolerance_and_a_known_kernel():
    assert {c.kernel for c in lab.CASES} == set(lab.EXPERIMENTS)
    assert all(c.dtype in lab.MATCH_REL_ERR for c in lab.CASES)
    assert len({c.name for c in lab.CASES}) == len(lab.CASES)


@pytest.mark.parametrize("args", [["--reps", "-3"], ["--only", "conv"], ["--record", "--only", "add"]])
def test_bad_arguments_exit_2_with_one_line(args):
    proc = subprocess.run([sys.executable, "-m", "labs.triton_tutorial", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_page_table_renders_recorded_rows_or_says_not_recorded(tmp_path, monkeypatch):
    path = tmp_path / "triton_tutorial.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    assert "Not recorded yet" in report.triton_tutorial_table("matmul", "H200")
    mm = lab.Case("matmul", (4096, 4096, 4096), "bfloat16")
    env = {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132, "compute_capability": "9.0",
           "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"}
    results.record(path, "triton_tutorial", env, {"copy_gb_s": 4000.0, "reps": 20}, {"matmul": [lab.row(mm, _t(250.0), _t(200.0), 2.1e-3, 2.0e-3, 4000.0)]},
                   lab.config_name, lab.printed)
    md = report.triton_tutorial_table("matmul", "H200")
    assert "2030-01-02" in md and "| `matmul-4096x4096x4096-bfloat16` | 250.0 | 200.0 | 1.250 | 550 | 687 |" in md
    assert report.triton_tutorial_row("matmul-4096x4096x4096-bfloat16", "H200")["tflop_s"] == 549.8


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_kernels_match_torch_at_real_sizes(dtype):
    x, y = torch.randn(10_000_019, device="cuda", dtype=dtype), torch.randn(10_000_019, device="cuda", dtype=dtype)
    assert torch.equal(kernels.add(x, y), x + y)
    for shape in [(333, 1000), (64, 32768)]:
        s = 4 * torch.randn(shape, device="cuda", dtype=dtype)
        _close(kernels.softmax(s), torch.softmax(s.float(), dim=-1), dtype)
    for m, n, k in [(1000, 3000, 777), (256, 512, 128)]:
        a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
        out, ref = kernels.matmul(a, b).float(), a.float() @ b.float()
        err = ((out - ref).norm() / ref.norm()).item()
        assert err <= (1e-2 if dtype == torch.bfloat16 else 2e-3), (m, n, k, dtype, err)
