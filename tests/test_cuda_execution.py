"""The execution-model lab: its CUDA source, occupancy arithmetic, rows, CLI and page; kernels on a GPU.

CPU tests check the parts that decide what the page says: that kernels.cu defines what
the lab binds, that the occupancy model follows the CUDA calculator's rules, and that
rows computed from fake timings carry the right numbers. GPU tests build the kernels,
check their output against torch, and check the model against the occupancy API.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from labs.cuda_execution import lab, report
from labs.cuda_execution import occupancy as occ
from labs.gpu_harness import cuda_build, results
from labs.gpu_harness.timing import Summary


def _t(us: float) -> Summary:
    return Summary(median_us=us, min_us=us * 0.98, spread=0.01, samples=20)


def test_the_cuda_file_defines_every_launcher_and_kernel_the_lab_binds():
    cuda_build.check_source(lab.SOURCE)
    assert lab.SOURCE.functions == ["launch_divergence", "occupancy", "device_limits", "launch_occupancy_kernel"]


def test_every_kernel_id_is_dispatched_in_the_cuda_file():
    text = lab.SOURCE.text
    for k in lab.KERNELS.values():
        kind = "stream_read_kernel" if k.bound == "memory" else "fma_chain_kernel"
        assert f"case {k.id}: return (const void*){kind}<{k.ilp}>;" in text, k
        assert f"case {k.id}: {kind}<{k.ilp}><<<grid, block, smem>>>" in text, k


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernels_compile_for_sm90_and_registers_grow_with_the_chains(tmp_path):
    proc = cuda_build.nvcc_compile(lab.SOURCE, tmp_path)
    assert proc.returncode == 0, proc.stderr
    regs = cuda_build.ptxas_registers(proc.stdout + proc.stderr)
    fma = [regs[f"_Z16fma_chain_kernelILi{ilp}EEvPfi"] for ilp in (1, 4, 16, 64, 128)]
    assert fma == sorted(fma) and fma[-1] > 128  # 128 chains: over 128 registers, so one block of 256 per SM


@pytest.mark.parametrize("block,regs,smem,blocks,limiter", [
    (256, 32, 0, 8, "threads"),  # 2048 threads / 256
    (32, 8, 0, 32, "blocks"),  # the 32-block cap: only 32 warps, 50%
    (1024, 32, 0, 2, "threads"),
    (256, 64, 0, 4, "registers"),  # 64 x 32 = 2048 regs per warp: 8 warps per partition, 32 per SM
    (256, 95, 0, 2, "registers"),  # 95 -> 3072 per warp: 5 warps per partition, 20 per SM, 2 blocks of 8
    (256, 134, 0, 1, "registers"),
    (256, 255, 0, 1, "registers"),
    (1024, 65, 0, 0, "registers"),  # 65 x 32 rounds to 2304; x 32 warps > 65536: cannot launch
    (256, 8, 45824, 4, "shared memory"),
    (128, 8, 115840, 1, "shared memory"),
], ids=lambda v: str(v))
def test_blocks_per_sm_follows_the_occupancy_rules(block, regs, smem, blocks, limiter):
    o = occ.blocks_per_sm(block, regs, smem)
    assert (o.blocks_per_sm, o.limiter) == (blocks, limiter)
    assert o.occupancy == o.warps_per_sm / 64


@pytest.mark.parametrize("target", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("block", [64, 128, 256])
def test_unused_shared_memory_sets_the_blocks_per_sm_it_was_asked_for(target, block):
    smem = occ.smem_for_blocks(target, block)
    got = occ.blocks_per_sm(block, 8, smem).blocks_per_sm
    assert got == min(target, 2048 // block), (block, target, smem)


def test_bad_occupancy_inputs_are_refused():
    for args in [(0, 8), (2048, 8), (256, 256), (256, 8, 10**6)]:
        with pytest.raises(ValueError):
            occ.blocks_per_sm(*args)


def test_the_plan_covers_every_experiment_and_the_occupancy_targets():
    configs = lab.plan()
    occupancy = [occ.blocks_per_sm(c.block, 16, c.smem).blocks_per_sm for c in configs if c.experiment == "occupancy"]
    assert occupancy == lab.OCCUPANCY_TARGETS * len(lab.OCCUPANCY_KERNELS)
    assert {c.block for c in configs if c.experiment == "block-size"} == set(lab.BLOCK_SIZES)
    assert [c.kernel for c in configs if c.experiment == "registers"] == lab.REGISTER_KERNELS
    assert all(c.iters * c.spec.ilp == lab.FMA_PER_THREAD for c in configs)


def test_divergence_rows_report_the_slowdown_against_the_uniform_branch():
    rows = lab.divergence_rows({"uniform": _t(100.0), "warp-split": _t(101.0), "lane-split": _t(199.0)})
    by = {r["mode"]: r for r in rows}
    assert by["lane-split"]["slowdown"] == 1.99 and by["warp-split"]["slowdown"] == 1.01
    assert by["uniform"]["useful_gflop_s"] == round(2 * lab.DIVERGENCE_N * lab.DIVERGENCE_K / 100.0 / 1e3, 1)
    assert "lane-split" in lab.format_divergence(by["lane-split"])


def test_occupancy_rows_turn_times_into_bandwidth_and_flops():
    read = lab.Config("occupancy", "read-ilp1", 256, 0)
    r = lab.occupancy_row(read, regs=32, api_blocks=8, sm_count=132, t=_t(268.4), copy_gb_s=4000.0)
    assert r["gb_s"] == round(2**30 / 268.4 / 1e3, 1) and r["of_copy"] == round(r["gb_s"] / 4000, 3)
    assert r["occupancy"] == 1.0 and r["model_blocks_per_sm"] == 8 and r["grid"] == 8 * 132
    fma = lab.Config("registers", "fma-ilp64", 256, 0)
    r = lab.occupancy_row(fma, regs=95, api_blocks=2, sm_count=132, t=_t(50.0), copy_gb_s=4000.0)
    assert r["occupancy"] == 0.25 and r["limiter"] == "registers" and "gb_s" not in r
    assert r["gflop_s"] == round(2 * 2 * 132 * 256 * lab.FMA_PER_THREAD / 50.0 / 1e3, 1)
    assert "GFLOP/s" in lab.format_occupancy(r)


def _run(*args):
    return subprocess.run([sys.executable, "-m", "labs.cuda_execution", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


@pytest.mark.parametrize("args,needle", [
    (["--reps", "0"], "--reps"), (["--reps", "x"], "--reps"), (["--only", "nope"], "--only"),
    (["--record", "--only", "divergence"], "--record"), (["--out", "pyproject.toml"], "--out"),
])
def test_bad_arguments_exit_2_with_one_line(args, needle):
    proc = _run(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


def test_help_lists_the_flags():
    proc = _run("--help")
    assert proc.returncode == 0 and all(f in proc.stdout for f in ("--out", "--record", "--reps", "--only"))


def test_the_page_table_renders_recorded_rows_or_says_not_recorded(tmp_path, monkeypatch):
    path = tmp_path / "cuda_execution.json"
    monkeypatch.setattr(report.RESULTS, "path", path)
    assert "Not recorded yet" in report.cuda_execution_table("divergence", "H200")
    rows = lab.divergence_rows({"uniform": _t(100.0), "warp-split": _t(100.5), "lane-split": _t(198.0)})
    occ_row = lab.occupancy_row(lab.Config("occupancy", "read-ilp1", 256, 0), 32, 8, 132, _t(300.0), 4000.0)
    env = {"gpu": "NVIDIA H200", "date": "2030-01-02", "sm_count": 132, "compute_capability": "9.0",
           "driver": "1", "cuda": "13.0", "torch": "2", "triton": "3"}
    results.record(path, "cuda_execution", env, {"copy_gb_s": 4000.0, "reps": 20}, {"divergence": rows, "occupancy": [occ_row]},
                   lab.config_name, lab.printed)
    md = report.cuda_execution_table("divergence", "H200")
    assert "NVIDIA H200" in md and "2030-01-02" in md and "| `lane-split` | 4,194,304 | 1,024 | 198.0 |" in md
    assert "1.98×" in md
    md = report.cuda_execution_table("occupancy", "H200", kernel="read-ilp1")
    assert "| `read-ilp1` | memory | 256 | 0 | 32 | 8 | 8 | 100.0% | 300.0 | 3,579 | 0.90 | — |" in md
    assert report.cuda_execution_occupancy_row("occupancy", "read-ilp1", occupancy=1.0, gpu="H200")["time_us"] == 300.0


# ------------------------------------------------------------------ GPU


@pytest.fixture(scope="module")
def built():
    torch = pytest.importorskip("torch")
    return torch, cuda_build.build(lab.SOURCE, "labs_cuda_execution")


@pytest.mark.gpu
def test_gpu_divergent_and_uniform_kernels_compute_what_torch_computes(built):
    torch, module = built
    x = torch.rand(lab.DIVERGENCE_N, device="cuda")
    want = lab.divergence_reference(torch, x)
    for mode, code in lab.DIVERGENCE_MODES.items():
        out = torch.empty_like(x)
        cuda_build.checked(module, "launch_divergence", x.data_ptr(), out.data_ptr(), x.numel(), lab.DIVERGENCE_K,
                           code, lab.DIVERGENCE_BLOCK)
        torch.testing.assert_close(out, want[mode], rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_gpu_occupancy_model_matches_the_cuda_occupancy_api(built):
    torch, module = built
    limits = module.device_limits()
    assert limits[1:6] == [occ.HOPPER.regs_per_sm, occ.HOPPER.max_threads_per_sm, occ.HOPPER.max_blocks_per_sm,
                           occ.HOPPER.smem_per_sm, occ.HOPPER.reserved_smem_per_block]
    for cfg in lab.plan():
        regs, blocks = module.occupancy(cfg.spec.id, cfg.block, cfg.smem)
        assert blocks == occ.blocks_per_sm(cfg.block, regs, cfg.smem).blocks_per_sm, (cfg, regs)


@pytest.mark.gpu
def test_gpu_every_occupancy_kernel_launches(built):
    torch, module = built
    src = torch.rand(1 << 20, device="cuda")
    sink = torch.zeros(1, device="cuda")
    for cfg in lab.plan():
        _, blocks = module.occupancy(cfg.spec.id, cfg.block, cfg.smem)
        cuda_build.checked(module, "launch_occupancy_kernel", cfg.spec.id, src.data_ptr(), sink.data_ptr(),
                           src.numel() // 4, 16, blocks * 4, cfg.block, cfg.smem)
    torch.cuda.synchronize()
    assert sink.item() == 0.0


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton

        from pathlib import Path

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(bundled) if bundled.exists() else None
    except ImportError:
        return None


@pytest.mark.skipif(shutil.which("nvcc") is None or _cuobjdump() is None, reason="nvcc or cuobjdump not installed")
def test_nvcc_unrolls_the_one_load_read_loop_as_the_lab_page_says(tmp_path):
    """The page explains read-ilp1 = read-ilp4 by nvcc's unrolling: both have several 16-byte loads in SASS."""
    proc = cuda_build.nvcc_compile(lab.SOURCE, tmp_path)
    assert proc.returncode == 0, proc.stderr
    counts = {}
    for ilp in (1, 4):
        name = f"_Z18stream_read_kernelILi{ilp}EEvPK6float4Pfx"
        sass = subprocess.run([_cuobjdump(), "-sass", "-fun", name, str(tmp_path / "kernels.o")],
                              capture_output=True, text=True, timeout=120).stdout
        counts[ilp] = sass.count("LDG.E.128")
    assert counts[1] >= 4 and counts[4] >= 4, counts
