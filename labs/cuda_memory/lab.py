"""The memory lab's experiments: what runs, the checks before timing, and the rows it reports.

* reads: 1 GiB of floats read coalesced, at strides of 2 to 32 floats, and scattered,
  as useful GB/s against the device-to-device copy bandwidth of the same run;
* transpose: an 8192 x 8192 float matrix, naive (coalesced reads, strided writes) and
  tiled through shared memory without and with a padding column, against a tiled copy;
* bank conflicts: a warp reading shared memory at word strides 1 to 33.

Everything here but `run` is plain Python: the CPU tests feed it fake timings.
"""

from __future__ import annotations

from pathlib import Path

from labs.cuda_memory import model
from labs.gpu_harness.cuda_build import CudaSource
from labs.gpu_harness.timing import Summary, gb_per_s

SOURCE = CudaSource(
    path=Path(__file__).with_name("kernels.cu"),
    declarations="""
int launch_read(int pattern, int64_t in, int64_t out, unsigned n, unsigned log2n, unsigned log2stride, int grid, int block);
int launch_index(int pattern, int64_t out, unsigned n, unsigned log2n, unsigned log2stride);
int launch_transpose(int variant, int64_t in, int64_t out, int n);
int launch_smem_stride(int64_t out, int stride, int iters, int grid, int block);
""",
    kernels=("read_kernel", "index_kernel", "copy_tiles_kernel", "transpose_naive_kernel",
             "transpose_tiled_kernel", "smem_stride_kernel"),
)

EXPERIMENTS = ("reads", "transpose", "bank-conflicts")

LOG2N = 28  # 2^28 floats: 1 GiB, far beyond the L2
READ_BLOCK = 256
READ_BLOCKS_PER_SM = 8
# (name, pattern id in kernels.cu, stride in floats)
READS = [("coalesced", 0, 1), ("stride-2", 1, 2), ("stride-4", 1, 4), ("stride-8", 1, 8),
         ("stride-16", 1, 16), ("stride-32", 1, 32), ("scattered", 2, 1)]

TRANSPOSE_N = 8192
TRANSPOSES = {"copy (tiles)": 0, "naive": 1, "tiled": 2, "tiled + pad": 3}

SMEM_STRIDES = [1, 2, 4, 8, 16, 32, 33]
SMEM_ITERS = 2048
SMEM_BLOCK = 256
SMEM_BLOCKS_PER_SM = 16


def _log2(x: int) -> int:
    if x < 1 or x & (x - 1):
        raise ValueError(f"{x} is not a power of two")
    return x.bit_length() - 1


def read_rows(times: dict[str, Summary], copy_gb_s: float) -> list[dict]:
    """One row per read pattern: useful GB/s, its fraction of copy, and the sector model's efficiency."""
    nbytes = 4 << LOG2N
    rows = []
    for name, _, stride in READS:
        t = times[name]
        gbs = gb_per_s(nbytes, t.median_us)
        eff = model.sector_efficiency(32 if name == "scattered" else stride)  # scattered: a sector per lane
        rows.append({"pattern": name, "stride_floats": None if name == "scattered" else stride,
                     "bytes": nbytes, "time_us": round(t.median_us, 1), "spread": round(t.spread, 3),
                     "gb_s": round(gbs, 1), "of_copy": round(gbs / copy_gb_s, 3),
                     "sector_efficiency": round(eff, 4)})
    return rows


def transpose_rows(times: dict[str, Summary], copy_gb_s: float) -> list[dict]:
    """One row per variant: GB/s counting the matrix read once and written once."""
    nbytes = 2 * 4 * TRANSPOSE_N * TRANSPOSE_N
    base = times["copy (tiles)"].median_us
    rows = []
    for name, variant in TRANSPOSES.items():
        t = times[name]
        gbs = gb_per_s(nbytes, t.median_us)
        ways = {2: model.tile_column_ways(pad=0), 3: model.tile_column_ways(pad=1)}.get(variant)
        rows.append({"variant": name, "n": TRANSPOSE_N, "bytes": nbytes, "time_us": round(t.median_us, 1),
                     "spread": round(t.spread, 3), "gb_s": round(gbs, 1), "of_copy": round(gbs / copy_gb_s, 3),
                     "time_vs_copy_tiles": round(t.median_us / base, 3), "smem_bank_ways": ways})
    return rows


def smem_rows(times: dict[int, Summary]) -> list[dict]:
    """One row per stride: the bank model's passes per access and the measured slowdown."""
    base = times[1].median_us
    return [{"stride_words": s, "bank_ways": model.strided_bank_ways(s), "time_us": round(times[s].median_us, 1),
             "spread": round(times[s].spread, 3), "slowdown": round(times[s].median_us / base, 2)}
            for s in SMEM_STRIDES]


READ_HEADER = f"{'pattern':<10} {'time us':>9} {'GB/s':>8} {'of copy':>8} {'sector eff':>10}"
TRANSPOSE_HEADER = f"{'variant':<13} {'time us':>9} {'GB/s':>8} {'of copy':>8} {'vs copy':>8} {'bank ways':>9}"
SMEM_HEADER = f"{'stride':>6} {'bank ways':>9} {'time us':>9} {'slowdown':>8}"


def format_read(r: dict) -> str:
    return f"{r['pattern']:<10} {r['time_us']:>9.1f} {r['gb_s']:>8.1f} {r['of_copy']:>8.3f} {r['sector_efficiency']:>10.3f}"


def format_transpose(r: dict) -> str:
    ways = "" if r["smem_bank_ways"] is None else r["smem_bank_ways"]
    return (f"{r['variant']:<13} {r['time_us']:>9.1f} {r['gb_s']:>8.1f} {r['of_copy']:>8.3f} "
            f"{r['time_vs_copy_tiles']:>8.3f} {ways:>9}")


def format_smem(r: dict) -> str:
    return f"{r['stride_words']:>6} {r['bank_ways']:>9} {r['time_us']:>9.1f} {r['slowdown']:>8.2f}"


def config_name(experiment: str, row: dict) -> str:
    """The recorded row key within an experiment: the pattern, the variant, or the stride."""
    return {"reads": lambda: row["pattern"], "transpose": lambda: row["variant"],
            "bank-conflicts": lambda: f"stride-{row['stride_words']}"}[experiment]()


def printed(sections: dict) -> dict[str, str]:
    """The tables run() prints, per section, as text: stored with the results for pages to show."""
    fmt = {"reads": (READ_HEADER, format_read), "transpose": (TRANSPOSE_HEADER, format_transpose),
           "bank-conflicts": (SMEM_HEADER, format_smem)}
    return {name: "\n".join([fmt[name][0], *map(fmt[name][1], rows)]) for name, rows in sections.items()}


def check_indices(torch, module, log2n: int = 20) -> None:
    """Each read pattern visits every element once: the kernel's indices, sorted, are 0..n-1."""
    from labs.gpu_harness.cuda_build import LaunchError, checked

    n = 1 << log2n
    want = torch.arange(n, device="cuda", dtype=torch.int64)
    for name, pattern, stride in READS:
        idx = torch.empty(n, device="cuda", dtype=torch.int32)
        checked(module, "launch_index", pattern, idx.data_ptr(), n, log2n, _log2(stride))
        if not torch.equal(torch.sort(idx.long()).values, want):
            raise LaunchError(f"read pattern {name}: indices are not a permutation of 0..{n - 1}")


def check_transposes(torch, module, n: int = 1024) -> None:
    from labs.gpu_harness.cuda_build import LaunchError, checked

    x = torch.rand(n, n, device="cuda")
    for name, variant in TRANSPOSES.items():
        out = torch.empty_like(x)
        checked(module, "launch_transpose", variant, x.data_ptr(), out.data_ptr(), n)
        want = x if variant == 0 else x.t()
        if not torch.equal(out, want):
            raise LaunchError(f"transpose variant {name}: output differs from torch")


def run(torch, module, time, sm_count: int, copy_gb_s: float, experiments: tuple[str, ...], log=print) -> dict:
    """Check, then time every experiment on the GPU; returns {section: rows}."""
    sections = {}
    sink = torch.zeros(1, device="cuda")
    if "reads" in experiments:
        check_indices(torch, module)
        log("reads: every pattern is a permutation")
        src = torch.rand(1 << LOG2N, device="cuda")
        grid = READ_BLOCKS_PER_SM * sm_count
        times = {name: time(lambda p=p, s=s: module.launch_read(p, src.data_ptr(), sink.data_ptr(), 1 << LOG2N,
                                                                LOG2N, _log2(s), grid, READ_BLOCK))
                 for name, p, s in READS}
        sections["reads"] = read_rows(times, copy_gb_s)
        log(READ_HEADER)
        for r in sections["reads"]:
            log(format_read(r))
        del src
    if "transpose" in experiments:
        check_transposes(torch, module)
        log("transpose: every variant matches torch")
        x = torch.rand(TRANSPOSE_N, TRANSPOSE_N, device="cuda")
        y = torch.empty_like(x)
        times = {name: time(lambda v=v: module.launch_transpose(v, x.data_ptr(), y.data_ptr(), TRANSPOSE_N))
                 for name, v in TRANSPOSES.items()}
        sections["transpose"] = transpose_rows(times, copy_gb_s)
        log(TRANSPOSE_HEADER)
        for r in sections["transpose"]:
            log(format_transpose(r))
        del x, y
    if "bank-conflicts" in experiments:
        grid = SMEM_BLOCKS_PER_SM * sm_count
        times = {s: time(lambda s=s: module.launch_smem_stride(sink.data_ptr(), s, SMEM_ITERS, grid, SMEM_BLOCK))
                 for s in SMEM_STRIDES}
        sections["bank-conflicts"] = smem_rows(times)
        log(SMEM_HEADER)
        for r in sections["bank-conflicts"]:
            log(format_smem(r))
    torch.cuda.synchronize()
    if sink.item() != 0.0:
        from labs.gpu_harness.cuda_build import LaunchError

        raise LaunchError("a kernel stored its never-taken result: the inputs hit the sentinel")
    return sections
