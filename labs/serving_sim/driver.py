"""The simulator's loop: the engine's scheduler, timed by a roofline clock instead of a GPU.

`run_continuous` and `run_static` feed a trace to `labs.engine.scheduler.Scheduler` (the
same code that schedules the engine's GPU steps; its docstring describes both policies) and
advance a `RooflineClock` by each step's cost. Nothing here decides what runs.

What the simulation leaves out: prefix caching (its requests have no token ids, so a
recomputed request re-prefills everything, where vLLM may find its freed blocks still
cached), async scheduling, CUDA graphs, speculative tokens, and end-of-sequence tokens
(every request generates exactly its output length).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from labs.engine.block_manager import BlockManager
from labs.engine.config import EngineConfig
from labs.engine.scheduler import CapacityError, Scheduler
from labs.engine.sequence import SamplingParams, Sequence
from labs.serving_sim.clock import RooflineClock
from labs.serving_sim.cost import Roofline
from labs.serving_sim.trace import Request
from labs.specs import SpecError

# A simulator trace can never need more steps than this many per token it holds.
STEPS_PER_TOKEN_BOUND = 50


def sim_config(**fields) -> EngineConfig:
    """An EngineConfig for the simulator: prefix caching off (its requests carry no token ids)."""
    fields.setdefault("max_model_len", 131072)
    return EngineConfig(enable_prefix_caching=False, **fields)


@dataclass
class RunResult:
    policy: str
    requests: list[Sequence]
    steps: int = 0
    busy_time: float = 0.0
    computed_tokens: int = 0  # tokens run through the model, padding and recompute included
    preemptions: int = 0
    recomputed_tokens: int = 0
    end_time: float = 0.0
    # (step time s, tokens, requests, blocks in use) per step, when the run records it
    step_log: list[tuple[float, int, int, int]] | None = None

    @property
    def finished(self) -> list[Sequence]:
        return [r for r in self.requests if r.finish_time is not None]

    @property
    def useful_tokens(self) -> int:
        """Tokens that had to be computed once: every prompt token and every output token but the last."""
        return sum(r.num_prompt_tokens + r.num_output - 1 for r in self.requests if r.num_output)


def _sequences(trace: list[Request]) -> list[Sequence]:
    """One Sequence per request, in arrival order; prompt ids are placeholders (prefix caching is off)."""
    ordered = sorted(trace, key=lambda r: (r.arrival, r.rid))
    return [Sequence(r.rid, [0] * r.prompt_len, SamplingParams(max_tokens=r.output_len, temperature=0.0,
                                                               ignore_eos=True), arrival=r.arrival)
            for r in ordered]


def _check_fits(trace: list[Request], cfg: EngineConfig) -> None:
    for r in trace:
        total = r.prompt_len + r.output_len
        if total > cfg.max_model_len:
            raise SpecError(f"request {r.rid} needs {total} tokens, above max_model_len {cfg.max_model_len}")
        need = -(-total // cfg.block_size)
        if need > cfg.usable_blocks:
            raise SpecError(f"request {r.rid} needs {need} blocks but the pool has {cfg.usable_blocks}: "
                            "it could never finish")


def simulate(trace: list[Request], cost: Roofline, cfg: EngineConfig, until: float | None = None,
             record: bool = False) -> RunResult:
    """Run the scheduler over `trace` until it drains (or the clock passes `until` seconds).

    `record` keeps a per-step log (time, tokens, requests, blocks in use) for tests and plots.
    """
    if cfg.policy == "continuous":
        _check_fits(trace, cfg)
    clock = RooflineClock(cost)
    # The pool has cfg.usable_blocks blocks plus the allocator's null block.
    blocks = BlockManager(cfg.usable_blocks + 1, cfg.block_size, enable_prefix_caching=False)
    sched = Scheduler(cfg, blocks, clock, with_block_ids=False)
    seqs = _sequences(trace)
    pending = deque(seqs)
    res = RunResult(cfg.policy, seqs, step_log=[] if record else None)
    max_steps = STEPS_PER_TOKEN_BOUND * sum(r.prompt_len + r.output_len for r in trace) + 1000
    while pending or sched.has_work():
        if until is not None and clock.now >= until:
            break
        while pending and pending[0].arrival <= clock.now:
            sched.add(pending.popleft())
        if not sched.has_work():
            clock.now = pending[0].arrival
            continue
        try:
            out = sched.schedule()
        except CapacityError as exc:
            raise SpecError(str(exc)) from None
        if res.steps > max_steps:
            raise RuntimeError("simulation exceeded its step bound; this is a bug")
        if not out.chunks:
            continue
        dt = clock.advance(out)
        res.steps += 1
        res.busy_time += dt
        res.computed_tokens += out.padded[0] * out.padded[1] if out.padded else out.num_tokens
        if res.step_log is not None:
            res.step_log.append((dt, out.num_tokens, len(out.chunks), blocks.num_usable - blocks.num_free))
        sched.update(out, [0] * len(out.chunks))
    res.preemptions = sched.preemptions
    res.recomputed_tokens = sched.recomputed_tokens
    res.end_time = clock.now
    return res


def run_continuous(trace: list[Request], cost: Roofline, cfg: EngineConfig, until: float | None = None,
                   record: bool = False) -> RunResult:
    """Iteration-level scheduling (vLLM V1's policy) over the trace."""
    return simulate(trace, cost, cfg, until, record)


def run_static(trace: list[Request], cost: Roofline, batch_size: int, num_blocks: int, block_size: int = 16) -> RunResult:
    """Request-level batching: a batch runs, padded, until its longest request finishes.

    A batch is at most `batch_size` requests that have arrived, and no more than the KV pool
    can hold at the padded length (every row reserves the longest prompt plus the longest
    output, as a padded KV tensor does); each step costs what the padded batch computes.
    """
    if batch_size < 1:
        raise SpecError(f"static batch size must be >= 1, got {batch_size}")
    unlimited = 2**62  # a static batch has no token budget and no length cap
    cfg = sim_config(max_num_seqs=batch_size, max_num_batched_tokens=unlimited, num_blocks=num_blocks,
                     block_size=block_size, policy="static", max_model_len=unlimited)
    return simulate(trace, cost, cfg)
