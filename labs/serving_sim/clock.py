"""A clock that a step moves forward by its roofline cost, so the scheduler runs without a GPU.

The engine's scheduler takes a clock (a function returning seconds) and never times
anything itself. On a GPU that clock is the wall clock; here it is simulated time, and
`advance` moves it by what `cost.Roofline` says the scheduled step costs.
"""

from __future__ import annotations

from labs.engine.scheduler import SchedulerOutput
from labs.serving_sim.cost import Chunk, Roofline


class RooflineClock:
    def __init__(self, cost: Roofline, start: float = 0.0):
        self.cost = cost
        self.now = start

    def __call__(self) -> float:
        return self.now

    def step_time(self, out: SchedulerOutput) -> float:
        """Seconds for the step: its chunks, or the padded batch it stands for under static batching."""
        if out.padded is not None:
            rows, new, cached = out.padded
            return self.cost.uniform_step_time(rows, new, cached)
        return self.cost.step_time([Chunk(c.num_tokens, c.start, c.samples) for c in out.chunks])

    def advance(self, out: SchedulerOutput) -> float:
        dt = self.step_time(out)
        self.now += dt
        return dt
