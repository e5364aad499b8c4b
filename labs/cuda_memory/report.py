"""The memory lab's recorded results as Markdown for the site (torch-free).

macros.py registers `MACROS`: a page renders `cuda_memory_table("reads")` and quotes one
field with `cuda_memory_row(...)` inside `{% if cuda_memory_recorded() %}`.
"""

from __future__ import annotations

from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR

RESULTS = LabResults(
    "cuda_memory", RESULTS_DIR / "cuda_memory.json", "python -m labs.cuda_memory --out out/mem --record",
    {
        "reads": [Column("Pattern", "pattern", "`{}`"), Column("Lane spacing (floats)", "stride_floats"),
                  Column("Time (µs)", "time_us", "{:,.1f}"), Column("Useful GB/s", "gb_s", "{:,.0f}"),
                  Column("Of copy", "of_copy", "{:.3f}"), Column("Sector model", "sector_efficiency", "{:.3f}")],
        "transpose": [Column("Variant", "variant", "`{}`"), Column("n", "n", "{:,}"),
                      Column("Time (µs)", "time_us", "{:,.1f}"), Column("GB/s", "gb_s", "{:,.0f}"),
                      Column("Of copy", "of_copy", "{:.3f}"), Column("Time ÷ tiled copy", "time_vs_copy_tiles", "{:.2f}"),
                      Column("Bank passes per column read", "smem_bank_ways")],
        "bank-conflicts": [Column("Stride (words)", "stride_words"), Column("Bank passes (model)", "bank_ways"),
                           Column("Time (µs)", "time_us", "{:,.1f}"), Column("Slowdown", "slowdown", "{:.2f}×")],
    },
)


def cuda_memory_recorded(gpu: str) -> bool:
    """True when labs/results/cuda_memory.json holds an entry for `gpu`."""
    return RESULTS.recorded(gpu)


def cuda_memory_table(section: str, gpu: str) -> str:
    """One experiment's rows (reads, transpose, bank-conflicts), or "not recorded yet"."""
    return RESULTS.table(section, gpu)


def cuda_memory_row(section: str, key: str, value, gpu: str) -> dict:
    """The first row of a section whose `key` equals `value`; raises when not recorded."""
    return RESULTS.row(section, key, value, gpu)


def cuda_memory_entry(gpu: str) -> dict:
    """The whole recorded entry: gpu, date, copy_gb_s, sections."""
    return RESULTS.entry(gpu)


def cuda_memory_env(gpu: str) -> str:
    """Where and when the rows were measured, or "not recorded yet"."""
    return RESULTS.env_line(gpu)


def coalescing_model(stride_floats: int, elem_bytes: int = 4) -> dict:
    """The sector model for one warp: sectors touched, bytes moved, and the fraction used."""
    from labs.cuda_memory import model

    sectors = model.sectors_per_warp(stride_floats, elem_bytes)
    return {"sectors": sectors, "bytes_moved": sectors * model.SECTOR_BYTES,
            "bytes_used": model.WARP * elem_bytes, "efficiency": model.sector_efficiency(stride_floats, elem_bytes)}


def bank_passes(stride_words: int) -> int:
    """Passes one warp needs when lane l reads shared-memory word l * stride."""
    from labs.cuda_memory import model

    return model.strided_bank_ways(stride_words)


MACROS = [coalescing_model, bank_passes, cuda_memory_recorded, cuda_memory_table, cuda_memory_row, cuda_memory_entry, cuda_memory_env]
