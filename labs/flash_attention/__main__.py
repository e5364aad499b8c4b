"""python -m labs.flash_attention: naive attention vs our Triton FlashAttention vs torch SDPA.

    python -m labs.flash_attention --out out/flash            # prefill and decode cases, rows printed
    python -m labs.flash_attention --out out/flash --record   # ... and stored in labs/results/
    python -m labs.flash_attention --only decode              # the decode cases only
"""

from __future__ import annotations

import sys

from labs.flash_attention import lab
from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR

LAB = "flash_attention"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"

_measure = lab_main.variants(lambda gpu, experiments: lab.run(gpu.torch, gpu.time, gpu.reps, experiments))


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.flash_attention", lab=LAB, lab_module=lab, results_path=RESULTS_PATH,
                         reps=10, measure=_measure,
                         description="Check naive attention and our Triton FlashAttention kernel against torch "
                         "SDPA, then time all three over sequence lengths (prefill) and context lengths (decode).")


if __name__ == "__main__":
    sys.exit(main())
