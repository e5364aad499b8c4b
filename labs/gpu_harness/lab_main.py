"""The run every GPU lab's `__main__` shares: environment, copy bandwidth, experiments, record.

Each lab supplies only what differs: its parser text and a `measure(gpu,
experiments)` that returns the sections to record plus any fields of its own
for the run (a CUDA lab builds its kernels there first). Everything around it
is one code path, so every lab prints the same header, refuses the same bad
arguments and writes nothing unless its run finished.

A variant that cannot run on this GPU (an unsupported dtype, a profiler without
CUPTI) is printed and listed under the run's "failed"; the other rows are still
written and recorded. A wrong result (a mismatch against the reference) or a
kernel that does not build exits 1 before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from labs.gpu_harness import bench


class LabFailed(Exception):
    """Raised by a lab's measure step: the run stops with this one-line error and nothing is written."""


@dataclass(frozen=True)
class Gpu:
    """What a lab's measure step gets: torch, the environment, a timer and the copy bandwidth of this run."""

    torch: Any
    env: dict
    time: Callable
    copy_gb_s: float
    reps: int


Measure = Callable[[Gpu, tuple], "tuple[dict, dict]"]


def variants(run: Callable[[Gpu, tuple], tuple[dict, list]]) -> Measure:
    """The measure step of the Part 2 labs: `run` returns the sections and the variants that could not run here."""

    def measure(gpu: Gpu, experiments: tuple) -> tuple[dict, dict]:
        sections, failed = run(gpu, experiments)
        if failed:
            print(f"{len(failed)} variant(s) failed to run and are not recorded: "
                  + "; ".join(f"{f['variant']} ({f['error']})" for f in failed))
        return sections, {"failed": failed}

    return measure


def build_kernels(source, name: str):
    """Compile a lab's CUDA source with load_inline; a missing nvcc or a compile error stops the run."""
    from labs.gpu_harness.cuda_build import build

    try:
        return build(source, name)
    except (RuntimeError, OSError) as e:  # the compiler's log went to stderr above
        raise LabFailed(f"building {source.path.name} with load_inline failed: {str(e).splitlines()[0]}") from None


def main(argv, *, prog: str, description: str, lab: str, lab_module, results_path: Path, measure: Measure,
         reps: int | None = None) -> int:
    p = bench.parser(prog, description, lab_module.EXPERIMENTS, results_path)
    if reps is not None:
        p.set_defaults(reps=reps)
        for action in p._actions:  # the shared parser's help names its own default
            if action.dest == "reps":
                action.help = action.help.replace("default 20", f"default {reps}")
    args = p.parse_args(argv)
    experiments = bench.validate(p, args) or lab_module.EXPERIMENTS
    import torch

    from labs.gpu_harness.environment import NoGpuError, environment
    from labs.gpu_harness.timing import copy_bandwidth_gb_s, event_timer

    try:
        env = environment(torch)
    except NoGpuError as e:
        return bench.fail(str(e))
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    time = event_timer(torch, reps=args.reps)
    copy = copy_bandwidth_gb_s(torch, time)
    print(f"copy bandwidth: {copy:,.0f} GB/s (device-to-device copy_, bytes read + written)")
    try:
        sections, own = measure(Gpu(torch, env, time, copy, args.reps), experiments)
    except (AssertionError, LabFailed) as e:
        return bench.fail(str(e))
    if not sections:
        return bench.fail("no variant ran; nothing to record")
    run = {"copy_gb_s": round(copy, 1), "reps": args.reps, **own}
    bench.finish(lab, env, run, sections, lab_module, args.out, args.record, results_path)
    return 0
