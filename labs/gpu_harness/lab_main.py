"""The run every Part 2 lab's `__main__` shares: environment, copy bandwidth, experiments, record.

A variant that cannot run on this GPU (an unsupported dtype, a profiler without
CUPTI) is printed and listed under the run's "failed"; the other rows are still
written and recorded. A wrong result (a mismatch against the reference) exits 1
before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from labs.gpu_harness import bench


def main(argv, *, prog: str, description: str, lab: str, lab_module, results_path: Path, reps: int = 10) -> int:
    p = bench.parser(prog, description, lab_module.EXPERIMENTS, results_path)
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
        sections, failed = lab_module.run(torch, time, copy, args.reps, experiments)
    except AssertionError as e:
        return bench.fail(str(e))
    if failed:
        print(f"{len(failed)} variant(s) failed to run and are not recorded: "
              + "; ".join(f"{f['variant']} ({f['error']})" for f in failed))
    if not sections:
        return bench.fail("no variant ran; nothing to record")
    run = {"copy_gb_s": round(copy, 1), "reps": args.reps, "failed": failed}
    bench.finish(lab, env, run, sections, lab_module, args.out, args.record, results_path)
    return 0
