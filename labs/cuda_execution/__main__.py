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
from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR

LAB = "cuda_execution"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"
RECORD_COMMAND = "python -m labs.cuda_execution --out out/exec --record"
LIMITS = ("sm_count", "regs_per_sm", "max_threads_per_sm", "max_blocks_per_sm", "smem_per_sm",
          "reserved_smem_per_block", "max_smem_per_block", "warp_size")


def _measure(gpu: lab_main.Gpu, experiments: tuple) -> tuple[dict, dict]:
    module = lab_main.build_kernels(lab.SOURCE, "labs_cuda_execution")
    limits = dict(zip(LIMITS, module.device_limits()))
    print("device limits: " + ", ".join(f"{k} {v}" for k, v in limits.items()))
    sections = lab.run(gpu.torch, module, gpu.time, gpu.env["sm_count"], gpu.copy_gb_s, experiments)
    return sections, {"device_limits": limits}


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.cuda_execution", lab=LAB, lab_module=lab,
                         results_path=RESULTS_PATH, measure=_measure,
                         description="Time SIMT divergence and occupancy (registers, block size, shared memory) "
                         "on a memory-bound and a latency-bound CUDA kernel.")


if __name__ == "__main__":
    sys.exit(main())
