"""The Triton lab's recorded results as Markdown for the site (torch-free).

macros.py registers `MACROS`: a page renders `triton_tutorial_table("matmul")` and quotes
one case with `triton_tutorial_row(...)` inside `{% if triton_tutorial_recorded() %}`.
"""

from __future__ import annotations

from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR

_COMMON = [Column("Case", "case", "`{}`"), Column("Time (µs)", "time_us", "{:,.1f}"),
           Column("torch (µs)", "torch_time_us", "{:,.1f}"), Column("Time ÷ torch", "time_vs_torch", "{:.3f}")]
_BYTES = [*_COMMON, Column("GB/s", "gb_s", "{:,.0f}"), Column("torch GB/s", "torch_gb_s", "{:,.0f}"),
          Column("Of copy", "of_copy", "{:.3f}"), Column("Rel. error", "rel_err", "{:.1e}")]

RESULTS = LabResults(
    "triton_tutorial", RESULTS_DIR / "triton_tutorial.json", "python -m labs.triton_tutorial --out out/triton --record",
    {
        "add": _BYTES,
        "softmax": _BYTES,
        "matmul": [*_COMMON, Column("TFLOP/s", "tflop_s", "{:,.0f}"), Column("torch TFLOP/s", "torch_tflop_s", "{:,.0f}"),
                   Column("Rel. error", "rel_err", "{:.1e}"), Column("torch rel. error", "torch_rel_err", "{:.1e}")],
    },
)


def triton_tutorial_recorded(gpu: str) -> bool:
    """True when labs/results/triton_tutorial.json holds an entry for `gpu`."""
    return RESULTS.recorded(gpu)


def triton_tutorial_table(section: str, gpu: str) -> str:
    """One kernel's rows (add, softmax, matmul), or "not recorded yet"."""
    return RESULTS.table(section, gpu)


def triton_tutorial_row(case: str, gpu: str) -> dict:
    """One case's recorded row by name (e.g. "matmul-8192x8192x8192-bfloat16"); raises when not recorded."""
    kernel = case.split("-", 1)[0]
    return RESULTS.row(kernel, "case", case, gpu)


def triton_tutorial_entry(gpu: str) -> dict:
    """The whole recorded entry: gpu, date, copy_gb_s, sections."""
    return RESULTS.entry(gpu)


def triton_tutorial_env(gpu: str) -> str:
    """Where and when the rows were measured, or "not recorded yet"."""
    return RESULTS.env_line(gpu)


MACROS = [triton_tutorial_recorded, triton_tutorial_table, triton_tutorial_row, triton_tutorial_entry,
          triton_tutorial_env]
