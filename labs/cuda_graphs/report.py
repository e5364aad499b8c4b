"""The CUDA-graphs lab's recorded results as Markdown for the site (torch-free).

macros.py registers `MACROS`: a page renders `cuda_graphs_table("step", "H200")` and
quotes one row with `cuda_graphs_row(...)` inside `{% if cuda_graphs_recorded("H200") %}`.
"""

from __future__ import annotations

from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR

class _Results(LabResults):
    def env_line(self, gpu: str) -> str:  # this lab times wall-clock steps, not L2-flushed event medians
        if not self.recorded(gpu):
            return self.missing()
        e = self.entry(gpu)
        return (f"Measured on an {e['gpu']} on {e['date']}: driver {e['driver']}, CUDA {e['cuda']}, torch {e['torch']}, "
                f"Triton {e['triton']}; step times are wall-clock means of {e['reps']} back-to-back steps "
                "(fusion rows: five times as many calls), launch and kernel counts from torch.profiler.")


RESULTS = _Results(
    "cuda_graphs", RESULTS_DIR / "cuda_graphs.json", "python -m labs.cuda_graphs --out out/graphs --record",
    {
        "step": [Column("Phase", "phase"), Column("Variant", "variant", "`{}`"), Column("Tokens", "tokens", "{:,}"),
                 Column("Step (µs)", "step_us", "{:,.1f}"), Column("Eager ÷ this", "vs_eager", "{:.2f}"),
                 Column("Launch calls", "launches", "{:,.0f}"), Column("Kernels", "kernels", "{:,.0f}"),
                 Column("Kernel time (µs)", "kernel_us", "{:,.1f}"), Column("GPU busy", "gpu_busy", "{:.0%}")],
        "fusion": [Column("Rows", "rows", "{:,}"), Column("Hidden", "hidden", "{:,}"),
                   Column("Unfused (µs)", "unfused_us", "{:,.1f}"), Column("Fused (µs)", "fused_us", "{:,.1f}"),
                   Column("Speedup", "speedup", "{:.2f}"), Column("Fused GB/s", "fused_gb_s", "{:,.0f}"),
                   Column("Kernels unfused", "unfused_kernels", "{:.0f}"),
                   Column("Kernels fused", "fused_kernels", "{:.0f}")],
    },
)


def cuda_graphs_recorded(gpu: str) -> bool:
    """True when labs/results/cuda_graphs.json holds an entry for `gpu`."""
    return RESULTS.recorded(gpu)


def cuda_graphs_table(section: str, gpu: str) -> str:
    """The step or fusion rows, or "not recorded yet"."""
    return RESULTS.table(section, gpu)


def cuda_graphs_row(phase: str, variant: str, gpu: str) -> dict:
    """One step row (phase "decode" or "prefill", variant "eager", "graph", "eager+fused", "graph+fused")."""
    for r in RESULTS.rows("step", gpu):
        if r["phase"] == phase and r["variant"] == variant:
            return r
    raise LookupError(f"cuda_graphs: no {phase} row for variant {variant!r}")


def cuda_graphs_fusion_row(rows: int, gpu: str) -> dict:
    """The fused/unfused pair at `rows` rows."""
    return RESULTS.row("fusion", "rows", rows, gpu)


def cuda_graphs_env(gpu: str) -> str:
    """Where and when the rows were measured, or "not recorded yet"."""
    return RESULTS.env_line(gpu)


QUOTED = [("decode", "eager"), ("decode", "graph"), ("prefill", "eager"), ("prefill", "graph")]


def cuda_graphs_complete(gpu: str) -> bool:
    """True when the rows the lesson and question quote were recorded with every field they use.

    A partial run (a variant that failed, a profiler without kernel events) still fills
    the tables; the prose that quotes single rows waits for a complete one.
    """
    if not RESULTS.recorded(gpu):
        return False
    try:
        rows = [cuda_graphs_row(phase, variant, gpu) for phase, variant in QUOTED]
    except LookupError:
        return False
    return all(r.get(k) is not None for r in rows for k in ("step_us", "launches", "gpu_busy", "vs_eager"))


MACROS = [cuda_graphs_complete, cuda_graphs_recorded, cuda_graphs_table, cuda_graphs_row, cuda_graphs_fusion_row, cuda_graphs_env]
