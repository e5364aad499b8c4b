"""A request's state, from the waiting queue to its last token.

A sequence is its token ids (prompt, then output) and one cursor: `num_computed`, how many
of those tokens have their keys and values in the cache. A step gives a sequence
`num_tokens - num_computed` tokens or fewer (a prefill chunk), and when the cursor reaches
the end the step samples one more token. There is no prefill or decode phase: a decode is
a step of one token. Preemption by recompute moves the cursor back to 0 (or to the end of a
prefix-cache hit); the tokens stay, so the request resumes where it was.

Times come from the clock the caller passes in (a GPU's wall clock, or a simulator's), so
the same record serves the engine and the serving simulator.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class RequestError(ValueError):
    """A request is invalid; the message says which field and what is allowed."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each output token; checked as vLLM 0.33's SamplingParams._verify_args checks them.

    temperature 0 is greedy (argmax). top_k 0 (or -1) and top_p 1 turn those filters off. A
    seed makes the request's draws its own: the same output whatever else is in the batch.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not is_num(self.temperature) or not math.isfinite(self.temperature) or not 0 <= self.temperature <= 2:
            raise RequestError(f"temperature must be a number in [0, 2], got {self.temperature!r}")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:  # NaN fails both comparisons
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            raise RequestError(f"top_k must be an integer, 0 or -1 (off) or >= 1, got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise RequestError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        """From a JSON-like dict (an HTTP body's fields); unknown keys are an error."""
        names = {f.name for f in cls.__dataclass_fields__.values()}
        unknown = sorted(set(d) - names)
        if unknown:
            raise RequestError(f"unknown sampling parameter {unknown[0]!r}; allowed: {', '.join(sorted(names))}")
        return cls(**d)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request inside the engine. Slots: the scheduler touches these every step."""

    __slots__ = ("seq_id", "token_ids", "num_prompt_tokens", "params", "arrival", "status", "num_computed",
                 "high_water", "num_cached_tokens", "block_hashes", "preemptions", "first_token_time",
                 "finish_time", "finish_reason", "token_times")

    def __init__(self, seq_id: int, prompt_ids: list[int], params: SamplingParams, arrival: float = 0.0):
        self.seq_id = seq_id
        self.token_ids = list(prompt_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.arrival = arrival
        self.status = Status.WAITING
        self.num_computed = 0  # tokens whose K/V are in the cache
        self.high_water = 0  # most tokens ever computed: computing below it again is recompute
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.block_hashes: list[bytes] = []  # chained hashes of this sequence's full blocks, in order
        self.preemptions = 0
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.finish_reason: str | None = None  # "length" or "stop", as vLLM reports it
        self.token_times: list[float] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token: int, now: float) -> None:
        """Record one sampled token at time `now`."""
        self.token_ids.append(token)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now

    def __repr__(self) -> str:
        return (f"Sequence({self.seq_id}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed})")
