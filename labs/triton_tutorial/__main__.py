"""python -m labs.triton_tutorial: check, then time vector add, fused softmax and tiled matmul against torch.

    python -m labs.triton_tutorial --out out/triton            # every case, rows printed
    python -m labs.triton_tutorial --out out/triton --record   # ... and stored in labs/results/
    python -m labs.triton_tutorial --only matmul               # one kernel

Order: environment -> copy bandwidth -> per case: compare with an fp32 torch result
(exit 1 before any timing on a mismatch), then time ours and torch's (CUDA events,
L2 flushed before each call, median of --reps). Nothing is written unless every case ran.
"""

from __future__ import annotations

import sys

from labs.gpu_harness import bench
from labs.gpu_harness.results import RESULTS_DIR
from labs.triton_tutorial import lab

LAB = "triton_tutorial"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"
RECORD_COMMAND = "python -m labs.triton_tutorial --out out/triton --record"


def main(argv: list[str] | None = None) -> int:
    p = bench.parser("python -m labs.triton_tutorial",
                     "Check the tutorial's Triton kernels (vector add, fused softmax, tiled matmul) "
                     "against torch, then time both.", lab.EXPERIMENTS, RESULTS_PATH)
    args = p.parse_args(argv)
    experiments = bench.validate(p, args) or lab.EXPERIMENTS
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
        sections = lab.run(torch, time, copy, experiments)
    except AssertionError as e:
        return bench.fail(str(e))
    run = {"copy_gb_s": round(copy, 1), "reps": args.reps}
    bench.finish(LAB, env, run, sections, lab, args.out, args.record, RESULTS_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
