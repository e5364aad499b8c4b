"""The scheduler: which sequences run in the next step, and how many tokens each.

It decides and keeps the books; it never runs a model and never times anything. Whoever
drives it (the engine on a GPU, the serving simulator on a roofline) calls

    out = scheduler.schedule()        # a SchedulerOutput: chunks of (sequence, start, n)
    tokens = <run the step>           # one sampled token per chunk that samples
    finished = scheduler.update(out, tokens)

and the `clock` it was given (a function returning seconds) stamps arrivals' tokens, so the
same scheduler can be timed by a GPU or by a cost model on one trace.

Continuous policy, in the shape of vLLM 0.33's V1 `Scheduler.schedule`
(vllm/v1/core/sched/scheduler.py):

* One token budget per step (max_num_batched_tokens), shared by decodes and prefill chunks.
  Each running sequence, in admission order, gets `num_tokens - num_computed` tokens, capped
  by what is left of the budget; with chunked prefill off a prompt must fit the budget
  whole, and the budget is raised to max_model_len, as vLLM's EngineArgs does.
* When a running sequence needs a block and none is free, the last-admitted running
  sequence is preempted: its blocks are freed, its cursor goes back, and it goes to the
  front of the waiting queue, to be recomputed. No one is admitted in a step that preempted.
* Then waiting sequences (FCFS) are admitted while the budget lasts, fewer than
  max_num_seqs run, and the whole current sequence fits in the free blocks (vLLM's
  `scheduler_reserve_full_isl`, on by default): its output need not fit, so decodes can run
  the pool dry later, which is what preemption is for.

Static policy (the pre-vLLM server loop, for comparison): take up to max_num_seqs waiting
requests whose padded size (longest prompt plus largest max_tokens, per row) fits the pool,
prefill them in one step, decode until the last one finishes, then take the next batch.
`SchedulerOutput.padded` says what shape a padded implementation would compute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from labs.engine.block_manager import BlockManager
from labs.engine.config import EngineConfig
from labs.engine.sequence import Sequence, Status


class CapacityError(ValueError):
    """A request that can never run in this pool."""


class Chunk(NamedTuple):
    """`num_tokens` tokens of `seq` from position `start`; `samples` when they reach its end."""

    seq: Sequence
    start: int
    num_tokens: int
    samples: bool
    block_ids: tuple[int, ...] = ()  # the sequence's block table for this step (engine runs only)


@dataclass
class SchedulerOutput:
    chunks: list[Chunk]
    preempted: list[Sequence] = field(default_factory=list)
    # Static batching: (rows, new tokens, cached tokens) of the padded batch this step stands for.
    padded: tuple[int, int, int] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_decode_only(self) -> bool:
        return all(c.num_tokens == 1 for c in self.chunks)


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager, clock: Callable[[], float],
                 eos_token_ids: tuple[int, ...] = (), with_block_ids: bool = True):
        """with_block_ids: copy each chunk's block table into it (the engine's runner needs it; a simulator not)."""
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.blocks = blocks
        self.clock = clock
        self.with_block_ids = with_block_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.recomputed_tokens = 0
        self._static_rows = self._static_prompt = self._static_step = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        """Drop a sequence wherever it is and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason
        seq.finish_time = self.clock()

    # --- one step ----------------------------------------------------------------

    # --8<-- [start:schedule]
    def schedule(self) -> SchedulerOutput:
        if self.config.policy == "static":
            return self._schedule_static()
        budget = self.config.token_budget
        out = SchedulerOutput([])
        i = 0
        running, try_grow = self.running, self.blocks.try_grow
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(len(seq.token_ids) - seq.num_computed, budget)
            while not try_grow(seq, n):
                victim = running.pop()  # the last admitted; never one already scheduled
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:  # it preempted itself: nothing else fits either
                break
            self._take(out, seq, n)
            budget -= n
            i += 1
        if out.preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hits = self.blocks.lookup(seq)
            todo = seq.num_tokens - len(hits) * self.blocks.block_size
            if not self.config.enable_chunked_prefill and todo > budget:
                break
            if self.blocks.blocks_to_admit(seq, hits) > self.blocks.num_free:
                break
            self.waiting.popleft()
            self._admit(seq, hits)
            n = min(todo, budget)
            self.blocks.try_grow(seq, n)  # fits: admission checked the whole sequence
            self._take(out, seq, n)
            budget -= n
        return out
    # --8<-- [end:schedule]

    def _schedule_static(self) -> SchedulerOutput:
        out = SchedulerOutput([])
        if not self.running:
            batch: list[Sequence] = []
            longest_prompt = longest_output = 0
            while self.waiting and len(batch) < self.config.max_num_seqs:
                seq = self.waiting[0]
                p = max(longest_prompt, seq.num_tokens)
                o = max(longest_output, seq.params.max_tokens)
                if (len(batch) + 1) * self.blocks.blocks_for(p + o) > self.blocks.num_usable:
                    break
                batch.append(self.waiting.popleft())
                longest_prompt, longest_output = p, o
            if self.waiting and not batch:
                seq = self.waiting[0]
                raise CapacityError(f"request {seq.seq_id} alone does not fit the KV pool "
                                 f"({self.blocks.num_usable * self.blocks.block_size} token slots)")
            for seq in batch:
                self._admit(seq, [])
                self.blocks.try_grow(seq, seq.num_tokens)  # fits: the padded batch does
                self._take(out, seq, seq.num_tokens)
            self._static_rows, self._static_prompt, self._static_step = len(batch), longest_prompt, 0
            out.padded = (len(batch), longest_prompt, 0)
        else:
            self._static_step += 1
            for seq in self.running:
                self.blocks.try_grow(seq, 1)  # fits: the padded batch does
                self._take(out, seq, 1)
            out.padded = (self._static_rows, 1, self._static_prompt + self._static_step - 1)
        return out

    def _admit(self, seq: Sequence, hits: list[int]) -> None:
        first = seq.num_output == 0 and seq.preemptions == 0
        self.blocks.admit(seq, hits)
        if first:
            seq.num_cached_tokens = seq.num_computed
        seq.status = Status.RUNNING
        self.running.append(seq)

    def _take(self, out: SchedulerOutput, seq: Sequence, n: int) -> None:
        """Put n tokens of seq (whose blocks are already grown) into the step."""
        start = seq.num_computed
        ids = self.blocks.table(seq) if self.with_block_ids else ()
        out.chunks.append(Chunk(seq, start, n, start + n == len(seq.token_ids), ids))

    # --8<-- [start:preempt]
    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)
    # --8<-- [end:preempt]

    def update(self, out: SchedulerOutput, sampled: list[int | None]) -> list[Sequence]:
        """Advance cursors, append sampled tokens (one per chunk; ignored where it does not sample), finish."""
        now = self.clock()
        finished = []
        caching = self.blocks.enable_prefix_caching
        max_len, eos = self.config.max_model_len, self.eos_token_ids
        for (seq, start, n, samples, _), token in zip(out.chunks, sampled, strict=True):
            end, high = start + n, seq.high_water
            if start < high:
                self.recomputed_tokens += min(end, high) - start
            if end > high:
                seq.high_water = end
            seq.num_computed = end
            if caching:
                self.blocks.commit(seq, start)
            if not samples:
                continue
            seq.append(token, now)
            ids = seq.token_ids
            if len(ids) - seq.num_prompt_tokens >= seq.params.max_tokens or len(ids) >= max_len:
                reason = "length"
            elif token in eos and not seq.params.ignore_eos:
                reason = "stop"
            else:
                continue
            seq.status, seq.finish_reason, seq.finish_time = Status.FINISHED, reason, now
            self.blocks.free(seq)
            finished.append(seq)
        if finished:
            self.running = [s for s in self.running if s.status is Status.RUNNING]
        return finished

