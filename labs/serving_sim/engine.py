"""Two engines over one trace: static batching and vLLM-style continuous batching.

`run_continuous` imitates the V1 scheduler of vLLM 0.33
(vllm/v1/core/sched/scheduler.py `Scheduler.schedule`), reduced to what moves
throughput and latency:

* Iteration-level: every step rebuilds the batch. There is no prefill or decode
  phase; each request has tokens it knows and tokens it has computed, and the
  step gives each one `known - computed` tokens, capped by a shared token
  budget (max_num_batched_tokens).
* Running requests first, in admission order; then waiting ones (FCFS), while
  the budget lasts and fewer than max_num_seqs run.
* A waiting request is admitted only if its whole current sequence fits in the
  free blocks (`scheduler_reserve_full_isl`, on by default); its output does
  not have to fit, so decode growth can exhaust the pool later.
* When a running request needs a block and none is free, the last-admitted
  running request is preempted: its blocks are freed, its computed count goes
  to 0, and it goes to the front of the waiting queue, to be recomputed (prompt
  plus the tokens it already generated). No waiting request is admitted in a
  step that preempted.
* Chunked prefill on: a prompt longer than the remaining budget is split over
  steps. Off: it must fit the budget whole, and the budget is raised to
  max_model_len, as vLLM's EngineArgs does when chunked prefill is disabled.

Not modelled: prefix caching (a recomputed request re-prefills everything;
vLLM may find its freed blocks still cached), async scheduling, CUDA graphs,
speculative tokens. `run_static` is the pre-vLLM server loop: take up to B
waiting requests, pad every prompt to the longest, decode until the longest
output is done, then take the next batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from labs.serving_sim.cost import Chunk, Roofline
from labs.serving_sim.trace import Request
from labs.specs import SpecError


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    num_blocks: int
    block_size: int = 16
    enable_chunked_prefill: bool = True
    max_model_len: int = 131072

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def token_budget(self) -> int:
        """Tokens per step. Without chunking vLLM raises the budget to max_model_len."""
        if self.enable_chunked_prefill:
            return self.max_num_batched_tokens
        return max(self.max_num_batched_tokens, self.max_model_len)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


class Live:
    """A request's state while the engine holds it (slots: the engines touch these every step)."""

    __slots__ = ("req", "computed", "generated", "known", "blocks", "high_water", "preemptions",
                 "first_token", "finish", "token_times")

    def __init__(self, req: Request):
        self.req = req
        self.computed = 0  # tokens whose KV is in the cache
        self.generated = 0
        self.known = req.prompt_len  # prompt plus generated: what must be computed to sample the next token
        self.blocks = 0
        self.high_water = 0  # most tokens ever computed: anything below it again is recompute
        self.preemptions = 0
        self.first_token: float | None = None
        self.finish: float | None = None
        self.token_times: list[float] = []

    def emit(self, now: float) -> None:
        """Record one sampled token at time `now`."""
        self.generated += 1
        self.known += 1
        self.token_times.append(now)
        if self.first_token is None:
            self.first_token = now
        if self.generated == self.req.output_len:
            self.finish = now


@dataclass
class RunResult:
    policy: str
    requests: list[Live]
    steps: int = 0
    busy_time: float = 0.0
    computed_tokens: int = 0  # tokens run through the model, padding and recompute included
    preemptions: int = 0
    recomputed_tokens: int = 0
    end_time: float = 0.0
    # (step time s, tokens, requests, blocks in use) per step, when the run records it
    step_log: list[tuple[float, int, int, int]] | None = None

    @property
    def finished(self) -> list[Live]:
        return [r for r in self.requests if r.finish is not None]

    @property
    def useful_tokens(self) -> int:
        """Tokens that had to be computed once: every prompt token and every output token but the last."""
        return sum(r.req.prompt_len + r.generated - 1 for r in self.requests if r.generated)


def _check_fits(trace: list[Request], cfg: EngineConfig) -> None:
    for r in trace:
        total = r.prompt_len + r.output_len
        if total > cfg.max_model_len:
            raise SpecError(f"request {r.rid} needs {total} tokens, above max_model_len {cfg.max_model_len}")
        if cfg.blocks_for(total) > cfg.num_blocks:
            raise SpecError(
                f"request {r.rid} needs {cfg.blocks_for(total)} blocks but the pool has {cfg.num_blocks}: "
                "it could never finish"
            )


def run_continuous(trace: list[Request], cost: Roofline, cfg: EngineConfig, until: float | None = None,
                   record: bool = False) -> RunResult:
    """Simulate an iteration-level engine until the trace drains (or `until` seconds).

    `record` keeps a per-step log (time, tokens, requests, blocks in use) for tests and plots.
    """
    _check_fits(trace, cfg)
    pending = deque(sorted(trace, key=lambda r: (r.arrival, r.rid)))
    live = [Live(r) for r in pending]
    by_id = {x.req.rid: x for x in live}
    waiting: deque[Live] = deque()
    running: list[Live] = []
    free = cfg.num_blocks
    now = 0.0
    res = RunResult("continuous", live, step_log=[] if record else None)
    max_steps = 50 * sum(r.prompt_len + r.output_len for r in trace) + 1000

    while pending or waiting or running:
        if until is not None and now >= until:
            break
        while pending and pending[0].arrival <= now:
            waiting.append(by_id[pending.popleft().rid])
        if not waiting and not running:
            now = pending[0].arrival
            continue

        budget = cfg.token_budget
        scheduled: list[tuple[Live, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.known - r.computed, budget)
            need = cfg.blocks_for(r.computed + n) - r.blocks
            self_preempted = False
            while need > free:
                victim = running.pop()
                free += victim.blocks
                victim.blocks, victim.computed = 0, 0
                victim.preemptions += 1
                res.preemptions += 1
                waiting.appendleft(victim)
                preempted = True
                if victim is r:
                    self_preempted = True
                    break
            if self_preempted:
                break
            r.blocks += need
            free -= need
            budget -= n
            scheduled.append((r, n))
            i += 1

        if not preempted:
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                r = waiting[0]
                todo = r.known - r.computed
                if not cfg.enable_chunked_prefill and todo > budget:
                    break
                if cfg.blocks_for(r.known) > free:  # the whole current sequence must fit
                    break
                n = min(todo, budget)
                waiting.popleft()
                r.blocks = cfg.blocks_for(n)
                free -= r.blocks
                running.append(r)
                scheduled.append((r, n))
                budget -= n

        if not scheduled:
            if res.steps > max_steps:
                raise RuntimeError("simulation made no progress; this is a bug")
            continue

        chunks = [Chunk(n, r.computed, r.computed + n == r.known) for r, n in scheduled]
        dt = cost.step_time(chunks)
        now += dt
        res.steps += 1
        res.busy_time += dt
        if res.step_log is not None:
            res.step_log.append((dt, sum(n for _, n in scheduled), len(scheduled), cfg.num_blocks - free))
        done: list[Live] = []
        for r, n in scheduled:
            res.computed_tokens += n
            end = r.computed + n
            if r.computed < r.high_water:
                res.recomputed_tokens += min(end, r.high_water) - r.computed
            r.computed = end
            if end > r.high_water:
                r.high_water = end
            if end == r.known:
                r.emit(now)
                if r.finish is not None:
                    done.append(r)
        if done:
            for r in done:
                free += r.blocks
                r.blocks = 0
            finished = {id(r) for r in done}
            running = [r for r in running if id(r) not in finished]
        if res.steps > max_steps:
            raise RuntimeError("simulation exceeded its step bound; this is a bug")
    res.end_time = now
    return res


def run_static(trace: list[Request], cost: Roofline, batch_size: int, num_blocks: int, block_size: int = 16) -> RunResult:
    """Request-level batching: a batch runs, padded, until its longest request finishes.

    A batch is at most `batch_size` requests that have arrived, and no more than
    the KV pool can hold at the padded length (every row reserves the longest
    prompt plus the longest output, as a padded KV tensor does).
    """
    if batch_size < 1:
        raise SpecError(f"static batch size must be >= 1, got {batch_size}")
    queue = deque(sorted(trace, key=lambda r: (r.arrival, r.rid)))
    live = {r.rid: Live(r) for r in queue}
    res = RunResult("static", list(live.values()))
    slots = num_blocks * block_size
    now = 0.0
    while queue:
        if queue[0].arrival > now:
            now = queue[0].arrival
        batch: list[Request] = []
        while queue and queue[0].arrival <= now and len(batch) < batch_size:
            cand = batch + [queue[0]]
            padded = max(r.prompt_len for r in cand) + max(r.output_len for r in cand)
            if len(cand) * -(-padded // block_size) * block_size > slots:
                break
            batch.append(queue.popleft())
        if not batch:
            raise SpecError(f"request {queue[0].rid} alone does not fit the KV pool ({slots} token slots)")
        rows = len(batch)
        p_max = max(r.prompt_len for r in batch)
        o_max = max(r.output_len for r in batch)
        dt = cost.uniform_step_time(rows, p_max, 0)
        now += dt
        res.steps += 1
        res.busy_time += dt
        res.computed_tokens += rows * p_max
        for r in batch:
            live[r.rid].emit(now)
        for j in range(1, o_max):
            dt = cost.uniform_step_time(rows, 1, p_max + j - 1)
            now += dt
            res.steps += 1
            res.busy_time += dt
            res.computed_tokens += rows
            for r in batch:
                if r.output_len > j:
                    live[r.rid].emit(now)
    res.end_time = now
    return res
