"""python -m labs.lora.bench: many LoRA adapters in one batch, per-adapter loop vs segmented Triton kernels.

    python -m labs.lora.bench --out out/lora               # every case, rows printed and written to out/lora
    python -m labs.lora.bench --out out/lora --record      # ... and stored in labs/results/lora.json
    python -m labs.lora.bench --only adapters              # the sweep over distinct adapters only

On Llama-3.1-8B's q_proj (4,096 x 4,096, o_proj's shape) and gate_proj (4,096 x 14,336), at
16 to 2,048 rows: the LoRA time over the base layer's time against the number of distinct
adapters (rank 16) and against the rank (8 adapters). Each case is checked against an fp32
reference first; a mismatch exits 1 and writes nothing.
"""

from __future__ import annotations

import sys

from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR
from labs.lora import lab

LAB = "lora"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"


_measure = lab_main.variants(lambda gpu, experiments: lab.run(gpu.torch, gpu.time, gpu.reps, experiments))


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.lora.bench", lab=LAB, lab_module=lab,
                         results_path=RESULTS_PATH, reps=10, measure=_measure,
                         description="Check a per-adapter LoRA loop and segmented shrink/expand Triton kernels "
                         "against an fp32 reference, then time both against the base layer on Llama-3.1-8B "
                         "projections over distinct adapters, ranks and token counts.")


if __name__ == "__main__":
    sys.exit(main())
