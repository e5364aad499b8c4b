"""The parallel lab's recorded results, through the project's one writer and reader (labs/recorded.py).

Each results file, its lab name and its row key live here, so the CLIs and
the report agree on them. CPU runs (the gloo TP check, the seeded MoE
simulation) are filed under the machine "CPU"; GPU runs under the GPU's name,
count and interconnect. Standard library only (torch is imported only to name
a GPU machine).
"""

from __future__ import annotations

import datetime

from labs import recorded

FILES = {
    "tp": ("parallel_tp_check.json", "parallel-tp", ("backend", "world_size", "case")),
    "collectives": ("parallel_collectives.json", "parallel-collectives", ("op", "size", "mode")),
    "gemm": ("parallel_gemm_shards.json", "parallel-gemm-shards", ("model", "tp", "tokens")),
    "moe": ("parallel_moe_skew.json", "parallel-moe-skew", ("model", "ep", "tokens", "skew")),
}
CPU = recorded.Machine("CPU")


def path(kind: str):
    return recorded.RESULTS_DIR / FILES[kind][0]


def gpu_machine(count: int) -> recorded.Machine:
    return recorded.local_machine(count)


def record(kind: str, machine: recorded.Machine, rows: list[dict], versions: dict | None = None,
           replace: bool = False, derive=None) -> str:
    """Merge `rows` (each with its key fields and 'ok') into the kind's file; return what the CLI prints."""
    name, lab, key = FILES[kind]
    run = {"date": datetime.date.today().isoformat(), **(versions or {})}
    return str(recorded.record_rows(recorded.RESULTS_DIR / name, lab, machine, rows, key, run,
                                    replace=replace, derive=derive))


def load(kind: str, gpu: str, count: int = 1) -> recorded.MachineResults | None:
    """The rows of one machine, or None when the file or the machine is not recorded."""
    found = recorded.load_results(path(kind))
    if found is None or not found.has(gpu, count):
        return None
    return found.machine(gpu, count)
