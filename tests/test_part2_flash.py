"""The FlashAttention lab: our Triton kernel against an fp32 reference, and the byte model.

CPU: the kernel in the Triton interpreter on tiny ragged shapes (full and causal,
GQA, decode), its refusals, the cost model's counts, rows and the page table.
GPU: the kernel at real sizes against fp32 and SDPA.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from labs import roofline
from labs.flash_attention import lab, report
from labs.gpu_harness import results

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from labs.flash_attention.kernel import flash_attention, naive_attention, reference_attention  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("b,hq,hkv,q_len,kv_len,d,causal", [
    (1, 2, 2, 33, 33, 16, False),  # ragged last tile of queries and of keys
    (2, 4, 2, 17, 40, 32, True),  # a chunk after 23 cached tokens, GQA 2
    (1, 4, 1, 1, 50, 16, True),  # decode: one query sees every key
    (1, 2, 2, 40, 40, 16, True),
])
def test_kernel_matches_fp32_reference(b, hq, hkv, q_len, kv_len, d, causal):
    g = torch.Generator(device=DEV).manual_seed(q_len * 31 + kv_len)
    q = torch.randn(b, hq, q_len, d, device=DEV, generator=g)
    k, v = (torch.randn(b, hkv, kv_len, d, device=DEV, generator=g) for _ in range(2))
    ref = reference_attention(q, k, v, causal)
    out = flash_attention(q, k, v, causal)
    assert (out - ref).abs().max().item() < 1e-4
    assert (naive_attention(q, k, v, causal) - ref).abs().max().item() < 1e-4


def test_large_scores_do_not_overflow_the_online_softmax():
    q = 30 * torch.randn(1, 1, 20, 16, device=DEV)
    k, v = 30 * torch.randn(1, 1, 20, 16, device=DEV), torch.randn(1, 1, 20, 16, device=DEV)
    out = flash_attention(q, k, v, causal=True)
    assert torch.isfinite(out).all() and (out - reference_attention(q, k, v, True)).abs().max().item() < 1e-4


@pytest.mark.parametrize("shapes,message", [
    (((1, 2, 8, 24), (1, 2, 8, 24)), "power of two"),
    (((1, 3, 8, 16), (1, 2, 8, 16)), "multiple of KV heads"),
    (((1, 2, 9, 16), (1, 2, 8, 16)), "q_len <= kv_len"),
])
def test_bad_shapes_are_refused_before_any_launch(shapes, message):
    q, k = torch.zeros(shapes[0]), torch.zeros(shapes[1])
    with pytest.raises(ValueError, match=message):
        flash_attention(q, k, k.clone())


def test_flops_are_equal_and_only_the_bytes_differ():
    for causal in (False, True):
        args = ("h200", 1, 32, 8, 4096, 4096, 128, causal)
        naive, flash, least = (roofline.attention_forward(*args, io=io) for io in roofline.ATTENTION_IO)
        assert naive.flops == flash.flops == least.flops
        assert least.bytes < flash.bytes < naive.bytes
    pairs = sum(range(1, 4097))
    assert roofline.attention_forward("h200", 1, 32, 8, 4096, 4096, 128, True, "naive").flops == 4 * 32 * 128 * pairs


def test_decode_gains_nothing_from_tiling_the_scores():
    """With one query row the score matrix is as small as K: naive moves about as much as flash."""
    args = ("h200", 32, 32, 8, 1, 16384, 128, True)
    naive = roofline.attention_forward(*args, io="naive")
    least = roofline.attention_forward(*args, io="flash_min")
    assert naive.bytes / least.bytes < 1.7


def test_rows_and_the_page_table(tmp_path, monkeypatch):
    path = tmp_path / "flash_attention.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    assert "Not recorded yet" in report.flash_attention_table("prefill", "H200")
    case = lab.CASES[3]
    r = lab.row(case, lab.costs(case, 32, 8, 128, 128), 9000.0, 1000.0, 800.0, 3e-3)
    assert r["naive_vs_flash"] == 9.0 and r["case"] == "prefill-b1-q16384-kv16384-full"
    results.record(path, "flash_attention", {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132,
                   "compute_capability": "9.0", "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"},
                   {"copy_gb_s": 4250.0, "reps": 10, "failed": []}, {"prefill": [r]}, lab.config_name, lab.printed)
    md = report.flash_attention_table("prefill", "H200")
    assert "`prefill-b1-q16384-kv16384-full`" in md and "| 9.00 |" in md
    assert report.flash_attention_row(r["case"], "H200")["flash_us"] == 1000.0
    assert len({c.name for c in lab.CASES}) == len(lab.CASES)


@pytest.mark.parametrize("args", [["--reps", "0"], ["--only", "decoder"], ["--record", "--only", "decode"]])
def test_bad_arguments_exit_2_with_one_line(args):
    proc = subprocess.run([sys.executable, "-m", "labs.flash_attention", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("q_len,kv_len,causal", [(1000, 1000, False), (777, 2049, True), (1, 8191, True),
                                                 (4096, 4096, True)])
def test_gpu_kernel_matches_fp32_at_real_sizes(q_len, kv_len, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 32, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, 8, kv_len, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    ref = reference_attention(q, k, v, causal)
    err = ((flash_attention(q, k, v, causal).float() - ref).norm() / ref.norm()).item()
    assert err <= lab.MATCH_REL_ERR / 2, err


def test_prose_waits_for_the_naive_times_it_quotes(tmp_path, monkeypatch):
    path = tmp_path / "flash_attention.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    env = {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132, "compute_capability": "9.0",
           "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"}
    cases = {c.name: c for c in lab.CASES}
    rows = [lab.row(cases[n], lab.costs(cases[n], 32, 8, 128, 128), None if "16384" in n else 50.0, 10.0, 9.0, 1e-3)
            for n in report.QUOTED]
    results.record(path, "flash_attention", env, {"copy_gb_s": 4250.0, "reps": 10, "failed": []}, {"prefill": rows},
                   lab.config_name, lab.printed)
    assert report.flash_attention_recorded("H200") and not report.flash_attention_complete("H200")
