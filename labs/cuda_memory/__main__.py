"""python -m labs.cuda_memory: check, then time access patterns, transposes and bank conflicts.

    python -m labs.cuda_memory --out out/mem            # every experiment, rows printed
    python -m labs.cuda_memory --out out/mem --record   # ... and stored in labs/results/
    python -m labs.cuda_memory --only transpose           # one experiment

Order: environment -> build kernels.cu with load_inline (-O3, sm_90) -> copy bandwidth
-> each experiment checks its kernels' output, then times them (CUDA events, L2 flushed
before each call, median of --reps). Nothing is written unless every step passed.
"""

from __future__ import annotations

import sys

from labs.cuda_memory import lab
from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR

LAB = "cuda_memory"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"
RECORD_COMMAND = "python -m labs.cuda_memory --out out/mem --record"


def _measure(gpu: lab_main.Gpu, experiments: tuple) -> tuple[dict, dict]:
    module = lab_main.build_kernels(lab.SOURCE, "labs_cuda_memory")
    return lab.run(gpu.torch, module, gpu.time, gpu.env["sm_count"], gpu.copy_gb_s, experiments), {}


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.cuda_memory", lab=LAB, lab_module=lab,
                         results_path=RESULTS_PATH, measure=_measure,
                         description="Time coalesced, strided and scattered reads against the copy bandwidth, a "
                         "transpose naive and tiled through shared memory, and shared-memory bank conflicts.")


if __name__ == "__main__":
    sys.exit(main())
