"""python -m labs.cuda_graphs: a decode step and a prefill, eager vs CUDA graph; a fused add + RMSNorm.

    python -m labs.cuda_graphs --out out/graphs            # both experiments, rows printed
    python -m labs.cuda_graphs --out out/graphs --record   # ... and stored in labs/results/
    python -m labs.cuda_graphs --only fusion               # the fused/unfused pair only
"""

from __future__ import annotations

import sys

from labs.cuda_graphs import lab
from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR

LAB = "cuda_graphs"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"

_measure = lab_main.variants(lambda gpu, experiments: lab.run(gpu.torch, gpu.reps, experiments))


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.cuda_graphs", lab=LAB, lab_module=lab, results_path=RESULTS_PATH,
                         reps=10, measure=_measure,
                         description="Time a decode step and a prefill of a few transformer layers eager and as a "
                         "CUDA graph (launches, kernels, GPU-busy fraction), and a fused residual add + RMSNorm "
                         "against the unfused torch ops.")


if __name__ == "__main__":
    sys.exit(main())
