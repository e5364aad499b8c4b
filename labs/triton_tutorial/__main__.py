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

from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR
from labs.triton_tutorial import lab

LAB = "triton_tutorial"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"
RECORD_COMMAND = "python -m labs.triton_tutorial --out out/triton --record"


def _measure(gpu: lab_main.Gpu, experiments: tuple) -> tuple[dict, dict]:
    return lab.run(gpu.torch, gpu.time, gpu.copy_gb_s, experiments), {}


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.triton_tutorial", lab=LAB, lab_module=lab,
                         results_path=RESULTS_PATH, measure=_measure,
                         description="Check the tutorial's Triton kernels (vector add, fused softmax, tiled "
                         "matmul) against torch, then time both.")


if __name__ == "__main__":
    sys.exit(main())
