"""python -m labs.roofline_lab: GEMM TFLOP/s against M (bf16, fp8) and decode attention's intensity.

    python -m labs.roofline_lab --out out/roofline            # both experiments, rows printed
    python -m labs.roofline_lab --out out/roofline --record   # ... and stored in labs/results/
    python -m labs.roofline_lab --only gemm                   # the GEMM sweep only
"""

from __future__ import annotations

import sys

from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR
from labs.roofline_lab import lab

LAB = "roofline_lab"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"

_measure = lab_main.variants(lambda gpu, experiments: lab.run(gpu.torch, gpu.time, experiments))


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.roofline_lab", lab=LAB, lab_module=lab, results_path=RESULTS_PATH,
                         reps=10, measure=_measure,
                         description="Measure a Llama-3.1-8B layer's GEMM in bf16 and fp8 for M = 1 to 8,192 "
                         "tokens, find the measured ridge, and measure decode attention's intensity with the "
                         "project's paged kernel.")


if __name__ == "__main__":
    sys.exit(main())
