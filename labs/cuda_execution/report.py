"""The execution-model lab's recorded results as Markdown for the site (torch-free).

macros.py registers `MACROS`: a page renders `cuda_execution_table("divergence")` and
quotes one field with `cuda_execution_row(...)` inside `{% if cuda_execution_recorded() %}`.
"""

from __future__ import annotations

from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR

_OCC = [Column("Kernel", "kernel", "`{}`"), Column("Bound by", "bound"), Column("Block", "block"),
        Column("Unused shared memory (B)", "smem_bytes", "{:,}"), Column("Registers / thread", "regs"),
        Column("Blocks / SM (API)", "blocks_per_sm"), Column("Blocks / SM (model)", "model_blocks_per_sm"),
        Column("Occupancy", "occupancy", "{:.1%}"), Column("Time (µs)", "time_us", "{:,.1f}"),
        Column("GB/s", "gb_s", "{:,.0f}"), Column("Of copy", "of_copy", "{:.2f}"),
        Column("GFLOP/s", "gflop_s", "{:,.0f}")]

RESULTS = LabResults(
    "cuda_execution", RESULTS_DIR / "cuda_execution.json", "python -m labs.cuda_execution --out out/exec --record",
    {
        "divergence": [Column("Branch on", "mode", "`{}`"), Column("Threads", "n_threads", "{:,}"),
                       Column("FMAs per path", "fma_per_path", "{:,}"), Column("Time (µs)", "time_us", "{:,.1f}"),
                       Column("Useful GFLOP/s", "useful_gflop_s", "{:,.0f}"), Column("Slowdown", "slowdown", "{:.2f}×")],
        "occupancy": _OCC,
        "block-size": _OCC,
        "registers": _OCC,
    },
)


def cuda_execution_recorded(gpu: str) -> bool:
    """True when labs/results/cuda_execution.json holds an entry for `gpu`."""
    return RESULTS.recorded(gpu)


def cuda_execution_table(section: str, gpu: str, kernel: str | None = None) -> str:
    """One experiment's rows (divergence, occupancy, block-size, registers), or "not recorded yet"."""
    return RESULTS.table(section, gpu, {"kernel": kernel} if kernel else None)


def cuda_execution_row(section: str, key: str, value, gpu: str) -> dict:
    """The first row of a section whose `key` equals `value`; raises when not recorded."""
    return RESULTS.row(section, key, value, gpu)


def cuda_execution_occupancy_row(section: str, kernel: str, occupancy: float | None = None,
                                 block: int | None = None, *, gpu: str) -> dict:
    """The row of `kernel` in a section at an occupancy (a fraction) or a block size."""
    for r in RESULTS.rows(section, gpu):
        if r["kernel"] == kernel and (occupancy is None or abs(r["occupancy"] - occupancy) < 1e-6) \
                and (block is None or r["block"] == block):
            return r
    raise KeyError(f"cuda_execution: no {section} row for {kernel} at occupancy {occupancy}, block {block}")


def cuda_execution_entry(gpu: str) -> dict:
    """The whole recorded entry: gpu, date, copy_gb_s, device_limits, sections."""
    return RESULTS.entry(gpu)


def cuda_execution_env(gpu: str) -> str:
    """Where and when the rows were measured, or "not recorded yet"."""
    return RESULTS.env_line(gpu)


def sm_limits() -> dict:
    """Compute capability 9.0's per-SM occupancy limits, as the lab's occupancy model holds them."""
    from dataclasses import asdict

    from labs.cuda_execution.occupancy import HOPPER

    return {**asdict(HOPPER), "max_warps_per_sm": HOPPER.max_warps_per_sm,
            "regs_per_sub_partition": HOPPER.regs_per_sm // HOPPER.sub_partitions}


def occupancy_of(block: int, regs: int, smem: int = 0) -> dict:
    """The occupancy model's answer for a block size, registers per thread and shared memory per block.

    blocks_per_sm, warps_per_sm, occupancy (a fraction), limiter, and the per-limit
    inputs a page shows as factors: regs_per_warp (allocated), warps_per_block.
    """
    from labs.cuda_execution.occupancy import HOPPER, blocks_per_sm

    o = blocks_per_sm(block, regs, smem)
    regs_per_warp = -(-regs * HOPPER.warp_size // HOPPER.reg_alloc_unit) * HOPPER.reg_alloc_unit
    return {"blocks_per_sm": o.blocks_per_sm, "warps_per_sm": o.warps_per_sm, "occupancy": o.occupancy,
            "limiter": o.limiter, "regs_per_warp": regs_per_warp, "warps_per_block": -(-block // HOPPER.warp_size),
            "warps_per_sub_partition": (HOPPER.regs_per_sm // HOPPER.sub_partitions) // regs_per_warp if regs_per_warp else None,
            "warps_by_registers": ((HOPPER.regs_per_sm // HOPPER.sub_partitions) // regs_per_warp) * HOPPER.sub_partitions
            if regs_per_warp else None}


def as_percent(fraction: float, digits: int = 0) -> str:
    """0.125 -> '12.5%' (digits=1): occupancy and fractions of a ceiling, as a page prints them."""
    return f"{100 * fraction:.{digits}f}%"


MACROS = [as_percent, sm_limits, occupancy_of, cuda_execution_recorded, cuda_execution_table, cuda_execution_row, cuda_execution_occupancy_row,
          cuda_execution_entry, cuda_execution_env]
