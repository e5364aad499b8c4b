"""The fleet's clock: the serving simulator's roofline, slowed by what the engine measured on a GPU.

An ideal roofline is a floor; a fleet simulated on floors would need too few GPUs. The engine
benchmark (labs/results/engine.json) measured how far above its floor the engine runs, at rates
(copy bandwidth, bf16 GEMM) it measured in the same run. `engine_calibration(gpu)` is the one place
that turns those rows into two factors:

* memory-bound efficiency: the median `efficiency` (floor / measured step) of the decode rows
  with CUDA graphs on (`decode/L*/B*/graphs`, 17 rows on the H200: batch 1 to 1,024, contexts
  128 to 8,192). A decode step reads weights and KV; this is how close to the copy bandwidth
  the engine gets.
* compute-bound efficiency: the `chunked/off` row, a 16,384-token prompt prefilled in one step
  next to 32 running decodes (floor / TTFT). That step is GEMM-bound; this is the prefill rate
  the engine reaches against the measured GEMM rate.

`CalibratedRoofline.step_time` is then max(memory time / memory efficiency, compute time /
compute efficiency) at the measured rates: a decode step costs what the engine's decode steps
cost, a prefill-heavy step what its prefill cost. The factors are the engine's, not vLLM's:
vLLM's kernels are faster, so a vLLM fleet would need fewer GPUs than this one.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from labs import recorded, roofline, specs
from labs.serving_sim.cost import Roofline
from labs.specs import SpecError

ENGINE_RESULTS = recorded.RESULTS_DIR / "engine.json"
DECODE_ROWS = "decode rows with CUDA graphs (decode/L*/B*/graphs), median of floor / step"
PREFILL_ROW = "chunked/off"


@dataclass(frozen=True)
class Calibration:
    """The engine's measured rates and its two efficiency factors, with where they come from."""

    gpu: str  # the machine label in engine.json
    date: str
    copy_tb_s: float
    gemm_tflops: float
    memory_efficiency: float
    compute_efficiency: float
    decode_rows: int  # how many rows the median is over

    def describe(self) -> str:
        return (f"calibrated by labs/results/engine.json ({self.gpu}, {self.date}): copy {self.copy_tb_s:.2f} TB/s, "
                f"GEMM {self.gemm_tflops:.0f} TFLOP/s; memory-bound steps at {self.memory_efficiency:.0%} of their "
                f"floor (median of {self.decode_rows} {DECODE_ROWS.split(' (')[0]}), compute-bound at "
                f"{self.compute_efficiency:.0%} (row {PREFILL_ROW})")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# --8<-- [start:calibration]
def engine_calibration(gpu: str = "H200") -> Calibration:
    """The two efficiency factors and the rates they were measured against, from the engine's rows."""
    results = recorded.load_results(ENGINE_RESULTS)
    if results is None:
        raise SpecError(f"{recorded.shown_path(ENGINE_RESULTS)} is missing: the fleet clock is calibrated by it")
    try:
        machine = results.machine(gpu)
    except recorded.RecordedError as err:
        raise SpecError(str(err)) from None
    decode = [r["efficiency"] for r in machine.rows
              if r.get("section") == "decode" and r.get("cuda_graphs") and r.get("ok")]
    prefill = [r for r in machine.rows if r.get("name") == PREFILL_ROW and r.get("ok")]
    if not decode or not prefill:
        raise SpecError(f"{machine.label}: engine.json needs decode rows with CUDA graphs and the {PREFILL_ROW} row")
    run = prefill[0]["run"]
    return Calibration(machine.label, run["date"], float(run["copy_tb_s"]), float(run["gemm_tflops"]),
                       statistics.median(decode), float(prefill[0]["efficiency"]), len(decode))
# --8<-- [end:calibration]


@dataclass(frozen=True)
class CalibratedRoofline(Roofline):
    """A serving-simulator Roofline whose steps cost what the engine's steps measured, not their floor."""

    memory_efficiency: float = 1.0
    compute_efficiency: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        for name in ("memory_efficiency", "compute_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise SpecError(f"{name} must be in (0, 1], got {getattr(self, name)}")

    def _time(self, cost: roofline.StepCost) -> float:
        return max(cost.memory_s / self.memory_efficiency, cost.compute_s / self.compute_efficiency) + self.overhead_s

    def step_time(self, chunks) -> float:
        if not chunks:
            return 0.0
        return self._time(roofline.mixed(self.deployment, chunks))

    def uniform_step_time(self, batch: int, new: int, cached: int) -> float:
        if batch < 1:
            return 0.0
        return self._time(roofline.uniform(self.deployment, batch, roofline.Chunk(new, cached)))


def calibrated_roofline(model: str, gpu: str, calibration: Calibration) -> CalibratedRoofline:
    """`model` on `gpu` at the calibration's measured rates and efficiencies (TP 1, bf16)."""
    m, g = specs.get_model(model), specs.get_gpu(gpu)
    g = dataclasses.replace(g, hbm_bandwidth_tbps=calibration.copy_tb_s,
                            dense_tflops={**g.dense_tflops, "bf16": calibration.gemm_tflops})
    return CalibratedRoofline(m, g, memory_efficiency=calibration.memory_efficiency,
                              compute_efficiency=calibration.compute_efficiency)
