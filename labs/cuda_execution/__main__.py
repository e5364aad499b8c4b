"""python -m labs.cuda_execution: check, then time the divergence and occupancy kernels.

    python -m labs.cuda_execution --out out/exec            # every experiment, rows printed
    python -m labs.cuda_execution --out out/exec --record   # ... and stored in labs/results/
    python -m labs.cuda_execution --only divergence         # one experiment

Order: environment -> build kernels.cu with load_inline (-O3, sm_90) -> copy bandwidth
-> each experiment checks its kernels' output, then times them (CUDA events, L2 flushed
before each call, median of --reps). Nothing is written unless every step passed.
"""

from __future__ import annotations

import sys

from labs.cuda_execution import lab
from labs.gpu_harness import bench
from labs.gpu_harness.results import RESULTS_DIR

LAB = "cuda_execution"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"
RECORD_COMMAND = "python -m labs.cuda_execution --out out/exec --record"


def main(argv: list[str] | None = None) -> int:
    p = bench.parser("python -m labs.cuda_execution",
                     "Time SIMT divergence and occupancy (registers, block size, shared memory) on "
                     "a memory-bound and a latency-bound CUDA kernel.", lab.EXPERIMENTS, RESULTS_PATH)
    args = p.parse_args(argv)
    experiments = bench.validate(p, args) or lab.EXPERIMENTS
    import torch

    from labs.gpu_harness.cuda_build import build
    from labs.gpu_harness.environment import NoGpuError, environment
    from labs.gpu_harness.timing import copy_bandwidth_gb_s, event_timer

    try:
        env = environment(torch)
    except NoGpuError as e:
        return bench.fail(str(e))
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    try:
        module = build(lab.SOURCE, "labs_cuda_execution")
    except (RuntimeError, OSError) as e:  # nvcc missing or a compile error: its log went to stderr above
        return bench.fail(f"building {lab.SOURCE.path.name} with load_inline failed: {str(e).splitlines()[0]}")
    limits = dict(zip(["sm_count", "regs_per_sm", "max_threads_per_sm", "max_blocks_per_sm", "smem_per_sm",
                       "reserved_smem_per_block", "max_smem_per_block", "warp_size"], module.device_limits()))
    print("device limits: " + ", ".join(f"{k} {v}" for k, v in limits.items()))
    time = event_timer(torch, reps=args.reps)
    copy = copy_bandwidth_gb_s(torch, time)
    print(f"copy bandwidth: {copy:,.0f} GB/s (device-to-device copy_, bytes read + written)")
    sections = lab.run(torch, module, time, env["sm_count"], copy, experiments)
    run = {"copy_gb_s": round(copy, 1), "reps": args.reps, "device_limits": limits}
    bench.finish(LAB, env, run, sections, lab, args.out, args.record, RESULTS_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
