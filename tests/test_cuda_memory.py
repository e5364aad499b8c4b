"""The memory lab: its CUDA source, the sector and bank models, rows, CLI and page; kernels on a GPU.

The models are what the page sets beside each measurement, so they are pinned to the
counts a warp really makes; the index functions are the kernels' own, so they must be
permutations (every element read once). GPU tests check the transposes exactly and the
kernels' indices against these Python functions.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from labs.cuda_memory import lab, model, report
from labs.gpu_harness import cuda_build, results
from labs.gpu_harness.timing import Summary


def _t(us: float) -> Summary:
    return Summary(median_us=us, min_us=us, spread=0.02, samples=20)


def test_the_cuda_file_defines_every_launcher_and_kernel_the_lab_binds():
    cuda_build.check_source(lab.SOURCE)
    assert lab.SOURCE.functions == ["launch_read", "launch_index", "launch_transpose", "launch_smem_stride"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernels_compile_for_sm90_with_the_padded_tile_one_row_larger(tmp_path):
    proc = cuda_build.nvcc_compile(lab.SOURCE, tmp_path)
    assert proc.returncode == 0, proc.stderr
    log = proc.stdout + proc.stderr
    assert "4096 bytes smem" in log and "4224 bytes smem" in log  # 32 x 32 and 32 x 33 floats


@pytest.mark.parametrize("stride,sectors", [(0, 1), (1, 4), (2, 8), (4, 16), (8, 32), (16, 32), (32, 32)])
def test_a_warp_of_floats_touches_the_sectors_its_addresses_span(stride, sectors):
    assert model.sectors_per_warp(stride) == sectors
    assert model.sector_efficiency(stride) == pytest.approx((128 if stride else 4) / (32 * sectors))


def test_wider_elements_coalesce_into_more_sectors():
    assert model.sectors_per_warp(1, elem_bytes=16) == 16  # float4: 512 bytes per warp, all used
    assert model.sector_efficiency(1, elem_bytes=16) == 1.0
    assert model.sector_efficiency(1, elem_bytes=2) == 1.0  # bf16: 64 bytes, two sectors


@pytest.mark.parametrize("stride", [1, 2, 3, 4, 8, 12, 16, 31, 32, 33, 64, 65])
def test_strided_shared_memory_access_conflicts_gcd_ways(stride):
    assert model.strided_bank_ways(stride) == math.gcd(stride, 32)


def test_padding_the_tile_by_one_column_removes_the_conflict():
    assert model.tile_column_ways(pad=0) == 32 and model.tile_column_ways(pad=1) == 1
    assert model.bank_ways([0] * 32) == 1  # every lane the same word: a broadcast, one pass


@pytest.mark.parametrize("log2n", [4, 5, 10, 13])
def test_every_read_pattern_reads_each_element_once(log2n):
    n = 1 << log2n
    assert sorted(model.scatter_index(i, log2n) for i in range(n)) == list(range(n))
    for stride in (2, 8, 16):
        idx = [model.strided_index(i, n, stride) for i in range(n)]
        assert sorted(idx) == list(range(n))
        if n // stride > 1:
            assert idx[1] - idx[0] == stride  # neighbouring lanes are `stride` floats apart


def test_read_rows_report_useful_bandwidth_and_the_model_beside_it():
    times = {name: _t(250.0 * (1 if name == "coalesced" else 4)) for name, _, _ in lab.READS}
    rows = {r["pattern"]: r for r in lab.read_rows(times, copy_gb_s=4000.0)}
    assert rows["coalesced"]["gb_s"] == round(2**30 / 250.0 / 1e3, 1)
    assert rows["coalesced"]["of_copy"] == round(rows["coalesced"]["gb_s"] / 4000, 3)
    assert rows["stride-2"]["sector_efficiency"] == 0.5 and rows["scattered"]["sector_efficiency"] == 0.125
    assert rows["scattered"]["stride_floats"] is None


def test_transpose_rows_count_one_read_and_one_write():
    times = {"copy (tiles)": _t(140.0), "naive": _t(700.0), "tiled": _t(300.0), "tiled + pad": _t(150.0)}
    rows = {r["variant"]: r for r in lab.transpose_rows(times, copy_gb_s=4000.0)}
    assert rows["naive"]["gb_s"] == round(2 * 4 * 8192**2 / 700.0 / 1e3, 1)
    assert rows["naive"]["time_vs_copy_tiles"] == 5.0
    assert (rows["tiled"]["smem_bank_ways"], rows["tiled + pad"]["smem_bank_ways"]) == (32, 1)
    assert rows["naive"]["smem_bank_ways"] is None


def test_bank_rows_put_the_measured_slowdown_beside_the_model():
    rows = lab.smem_rows({s: _t(100.0 * math.gcd(s, 32)) for s in lab.SMEM_STRIDES})
    assert [(r["stride_words"], r["bank_ways"], r["slowdown"]) for r in rows] == \
        [(s, math.gcd(s, 32), float(math.gcd(s, 32))) for s in lab.SMEM_STRIDES]


@pytest.mark.parametrize("args,needle", [
    (["--reps", "1001"], "--reps"), (["--only", "writes"], "--only"), (["--record", "--only", "reads"], "--record"),
])
def test_bad_arguments_exit_2_with_one_line(args, needle):
    proc = subprocess.run([sys.executable, "-m", "labs.cuda_memory", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def test_the_page_table_renders_recorded_rows_or_says_not_recorded(tmp_path, monkeypatch):
    path = tmp_path / "cuda_memory.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    assert "Not recorded yet" in report.cuda_memory_table("transpose", "H200")
    times = {"copy (tiles)": _t(140.0), "naive": _t(700.0), "tiled": _t(300.0), "tiled + pad": _t(150.0)}
    env = {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132, "compute_capability": "9.0",
           "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"}
    results.record(path, "cuda_memory", env, {"copy_gb_s": 4000.0, "reps": 20}, {"transpose": lab.transpose_rows(times, 4000.0)},
                   lab.config_name, lab.printed)
    md = report.cuda_memory_table("transpose", "H200")
    assert "2030-01-02" in md and "| `tiled` | 8,192 | 300.0 | 1,790 | 0.447 | 2.14 | 32 |" in md
    assert "| `naive` | 8,192 | 700.0 | 767 | 0.192 | 5.00 | — |" in md


# ------------------------------------------------------------------ GPU


@pytest.fixture(scope="module")
def built():
    torch = pytest.importorskip("torch")
    return torch, cuda_build.build(lab.SOURCE, "labs_cuda_memory")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [32, 96, 1024, 4096])
def test_gpu_every_transpose_variant_is_exact(built, n):
    torch, module = built
    x = torch.randn(n, n, device="cuda")
    for name, variant in lab.TRANSPOSES.items():
        out = torch.full_like(x, float("nan"))
        cuda_build.checked(module, "launch_transpose", variant, x.data_ptr(), out.data_ptr(), n)
        assert torch.equal(out, x if variant == 0 else x.t().contiguous()), name


@pytest.mark.gpu
def test_gpu_read_patterns_use_the_indices_the_model_describes(built):
    torch, module = built
    log2n = 12
    n = 1 << log2n
    for name, pattern, stride in lab.READS:
        idx = torch.empty(n, device="cuda", dtype=torch.int32)
        cuda_build.checked(module, "launch_index", pattern, idx.data_ptr(), n, log2n, stride.bit_length() - 1)
        if name == "scattered":
            want = [model.scatter_index(i, log2n) for i in range(n)]
        else:
            want = [model.strided_index(i, n, stride) for i in range(n)]
        assert idx.tolist() == want, name
    lab.check_indices(torch, module)
