"""The execution-model lab's experiments: what runs, with which knobs, and the rows it reports.

Three experiments on the kernels of kernels.cu:

* divergence: the same FMA work with the branch on the warp index (each warp takes one
  path) and on the lane's parity (every warp takes both, one after the other);
* occupancy: a memory-bound read and a latency-bound FMA chain at 100%, 50%, 25% and
  12.5% occupancy, set by shared memory the kernels request and never use;
* block size and registers: the same kernels at block sizes 32 to 1024, and the FMA
  chain with 1 to 128 independent chains per thread, so registers per thread rise and
  occupancy falls.

Everything here but `run` is plain Python: the CPU tests feed it fake timings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labs.cuda_execution import occupancy as occ
from labs.gpu_harness.cuda_build import CudaSource
from labs.gpu_harness.timing import Summary, gb_per_s

SOURCE = CudaSource(
    path=Path(__file__).with_name("kernels.cu"),
    declarations="""
int launch_divergence(int64_t in, int64_t out, int n, int k, int mode, int block);
std::vector<int64_t> occupancy(int id, int block, int smem);
std::vector<int64_t> device_limits();
int launch_occupancy_kernel(int id, int64_t in, int64_t out, long long n4, int iters, int grid, int block, int smem);
""",
    kernels=("divergence_kernel", "stream_read_kernel", "fma_chain_kernel"),
)

DIVERGENCE_MODES = {"uniform": 0, "warp-split": 1, "lane-split": 2}
DIVERGENCE_N = 1 << 22  # threads
DIVERGENCE_K = 1024  # dependent FMAs per path
DIVERGENCE_BLOCK = 256


@dataclass(frozen=True)
class Kernel:
    id: int  # the switch in kernels.cu (kernel_ptr, launch_occupancy_kernel)
    name: str
    bound: str  # "memory" or "latency"
    ilp: int  # independent loads or FMA chains in flight per thread


KERNELS = {
    k.name: k
    for k in (
        Kernel(0, "read-ilp1", "memory", 1),
        Kernel(1, "read-ilp4", "memory", 4),
        Kernel(2, "fma-ilp1", "latency", 1),
        Kernel(3, "fma-ilp4", "latency", 4),
        Kernel(4, "fma-ilp16", "latency", 16),
        Kernel(5, "fma-ilp64", "latency", 64),
        Kernel(6, "fma-ilp128", "latency", 128),
    )
}
READ_BYTES = 1 << 30  # the memory-bound kernel reads 1 GiB
FMA_PER_THREAD = 32768  # the latency-bound kernel: iterations x chains

OCCUPANCY_BLOCK = 256
OCCUPANCY_TARGETS = [8, 4, 2, 1]  # blocks of 256 per SM: 100%, 50%, 25%, 12.5%
OCCUPANCY_KERNELS = ["read-ilp1", "read-ilp4", "fma-ilp1", "fma-ilp4"]
BLOCK_SIZES = [32, 64, 128, 256, 512, 1024]
BLOCK_KERNELS = ["read-ilp1", "fma-ilp1"]
REGISTER_KERNELS = ["fma-ilp1", "fma-ilp4", "fma-ilp16", "fma-ilp64", "fma-ilp128"]

EXPERIMENTS = ("divergence", "occupancy", "block-size", "registers")


@dataclass(frozen=True)
class Config:
    """One timed launch of an occupancy-lab kernel."""

    experiment: str
    kernel: str
    block: int
    smem: int  # dynamic shared memory per block, bytes, never touched

    @property
    def spec(self) -> Kernel:
        return KERNELS[self.kernel]

    @property
    def iters(self) -> int:
        return FMA_PER_THREAD // self.spec.ilp


def plan(experiments: tuple[str, ...] = EXPERIMENTS) -> list[Config]:
    """Every occupancy-lab launch the benchmark times, in order."""
    configs = []
    if "occupancy" in experiments:
        for name in OCCUPANCY_KERNELS:
            for target in OCCUPANCY_TARGETS:
                configs.append(Config("occupancy", name, OCCUPANCY_BLOCK, occ.smem_for_blocks(target, OCCUPANCY_BLOCK)))
    if "block-size" in experiments:
        for name in BLOCK_KERNELS:
            for block in BLOCK_SIZES:
                configs.append(Config("block-size", name, block, 0))
    if "registers" in experiments:
        for name in REGISTER_KERNELS:
            configs.append(Config("registers", name, OCCUPANCY_BLOCK, 0))
    return configs


def divergence_rows(times: dict[str, Summary]) -> list[dict]:
    """One row per mode: its time and its slowdown against the uniform branch."""
    base = times["uniform"].median_us
    flops = 2 * DIVERGENCE_N * DIVERGENCE_K  # useful work: each thread runs one path
    return [{
        "mode": mode, "n_threads": DIVERGENCE_N, "fma_per_path": DIVERGENCE_K, "block": DIVERGENCE_BLOCK,
        "time_us": round(t.median_us, 2), "spread": round(t.spread, 3),
        "useful_gflop_s": round(flops / t.median_us / 1e3, 1),
        "slowdown": round(t.median_us / base, 3),
    } for mode, t in times.items()]


def occupancy_row(cfg: Config, regs: int, api_blocks: int, sm_count: int, t: Summary,
                  copy_gb_s: float) -> dict:
    """The row for one timed launch: occupancy (API and model), time, and GB/s or GFLOP/s."""
    model = occ.blocks_per_sm(cfg.block, regs, cfg.smem)
    warps_per_block = -(-cfg.block // 32)
    grid = api_blocks * sm_count
    row = {
        "experiment": cfg.experiment, "kernel": cfg.kernel, "bound": cfg.spec.bound, "ilp": cfg.spec.ilp,
        "block": cfg.block, "smem_bytes": cfg.smem, "regs": regs,
        "blocks_per_sm": api_blocks, "model_blocks_per_sm": model.blocks_per_sm, "limiter": model.limiter,
        "occupancy": round(api_blocks * warps_per_block / occ.HOPPER.max_warps_per_sm, 4),
        "grid": grid, "time_us": round(t.median_us, 2), "spread": round(t.spread, 3),
    }
    if cfg.spec.bound == "memory":
        row["gb_s"] = round(gb_per_s(READ_BYTES, t.median_us), 1)
        row["of_copy"] = round(row["gb_s"] / copy_gb_s, 3)
    else:
        flops = 2 * grid * cfg.block * cfg.iters * cfg.spec.ilp
        row["gflop_s"] = round(flops / t.median_us / 1e3, 1)
    return row


DIVERGENCE_HEADER = f"{'mode':<11} {'time us':>9} {'GFLOP/s':>9} {'slowdown':>9} {'spread':>7}"


def format_divergence(row: dict) -> str:
    return (f"{row['mode']:<11} {row['time_us']:>9.1f} {row['useful_gflop_s']:>9.1f} "
            f"{row['slowdown']:>9.3f} {row['spread']:>7.3f}")


OCCUPANCY_HEADER = (f"{'experiment':<11} {'kernel':<11} {'block':>5} {'smem B':>7} {'regs':>4} {'blk/SM':>6} "
                    f"{'model':>5} {'occup':>6} {'time us':>9} {'rate':>10} {'unit':<8} {'of copy':>7}")


def format_occupancy(row: dict) -> str:
    rate, unit = (row["gb_s"], "GB/s") if "gb_s" in row else (row["gflop_s"], "GFLOP/s")
    of_copy = f"{row['of_copy']:>7.3f}" if "of_copy" in row else f"{'':>7}"
    return (f"{row['experiment']:<11} {row['kernel']:<11} {row['block']:>5} {row['smem_bytes']:>7} {row['regs']:>4} "
            f"{row['blocks_per_sm']:>6} {row['model_blocks_per_sm']:>5} {row['occupancy']:>6.3f} "
            f"{row['time_us']:>9.1f} {rate:>10.1f} {unit:<8} {of_copy}")


def config_name(experiment: str, row: dict) -> str:
    """The recorded row key within an experiment: the mode, or kernel/block/shared memory."""
    if experiment == "divergence":
        return row["mode"]
    return f"{row['kernel']}/block-{row['block']}/smem-{row['smem_bytes']}"


def printed(sections: dict) -> dict[str, str]:
    """The tables run() prints, per section, as text: stored with the results for pages to show."""
    out = {}
    if "divergence" in sections:
        out["divergence"] = "\n".join([DIVERGENCE_HEADER, *map(format_divergence, sections["divergence"])])
    rows = [r for name in EXPERIMENTS[1:] for r in sections.get(name, [])]
    if rows:
        out["occupancy"] = "\n".join([OCCUPANCY_HEADER, *map(format_occupancy, rows)])
    return out


def run(torch, module, time, sm_count: int, copy_gb_s: float, experiments: tuple[str, ...],
        log=print) -> dict:
    """Check, then time every experiment on the GPU; returns {section: rows}."""
    from labs.gpu_harness.cuda_build import LaunchError, checked

    sections = {}
    if "divergence" in experiments:
        x = torch.rand(DIVERGENCE_N, device="cuda")
        out = {m: torch.empty_like(x) for m in DIVERGENCE_MODES}
        for mode, code in DIVERGENCE_MODES.items():
            checked(module, "launch_divergence", x.data_ptr(), out[mode].data_ptr(), DIVERGENCE_N,
                    DIVERGENCE_K, code, DIVERGENCE_BLOCK)
        expected = divergence_reference(torch, x)
        for mode in DIVERGENCE_MODES:
            want = expected["uniform"] if mode == "uniform" else expected[mode]
            if not torch.allclose(out[mode], want, rtol=1e-4, atol=1e-3):
                raise LaunchError(f"divergence kernel, mode {mode}: output differs from the torch reference")
        log("divergence: all modes match the torch reference")
        times = {}
        for mode, code in DIVERGENCE_MODES.items():
            times[mode] = time(lambda code=code, mode=mode: module.launch_divergence(
                x.data_ptr(), out[mode].data_ptr(), DIVERGENCE_N, DIVERGENCE_K, code, DIVERGENCE_BLOCK))
        rows = divergence_rows(times)
        log(DIVERGENCE_HEADER)
        for r in rows:
            log(format_divergence(r))
        sections["divergence"] = rows
        del x, out

    configs = plan(tuple(e for e in experiments if e != "divergence"))
    if configs:
        src = torch.rand(READ_BYTES // 4, device="cuda")
        sink = torch.zeros(1, device="cuda")
        log(OCCUPANCY_HEADER)
        for cfg in configs:
            regs, blocks = module.occupancy(cfg.spec.id, cfg.block, cfg.smem)
            if blocks <= 0:
                raise LaunchError(f"{cfg}: occupancy API returned {regs}, {blocks}")
            grid = blocks * sm_count
            args = (cfg.spec.id, src.data_ptr(), sink.data_ptr(), READ_BYTES // 16, cfg.iters, grid, cfg.block, cfg.smem)
            checked(module, "launch_occupancy_kernel", *args)
            t = time(lambda args=args: module.launch_occupancy_kernel(*args))
            row = occupancy_row(cfg, regs, blocks, sm_count, t, copy_gb_s)
            log(format_occupancy(row))
            sections.setdefault(cfg.experiment, []).append(row)
        if sink.item() != 0.0:
            raise LaunchError("a kernel stored its never-taken result: the inputs hit the sentinel")
        del src
    return sections


def divergence_reference(torch, x) -> dict:
    """What each mode must return, by torch ops: path A or B per element, as the kernel picks it."""
    a, b = x.clone(), x.clone()
    for _ in range(DIVERGENCE_K):
        a = a * 1.0000001 + 0.5
        b = b * 0.9999999 - 0.25
    idx = torch.arange(x.numel(), device=x.device) % DIVERGENCE_BLOCK
    by_warp = torch.where((idx // 32) % 2 == 0, a, b)
    by_lane = torch.where(idx % 2 == 0, a, b)
    return {"uniform": a, "warp-split": by_warp, "lane-split": by_lane}
