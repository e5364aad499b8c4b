"""Synthetic request traces: seeded, so every run prints the same table.

A trace is a list of requests with an arrival time, a prompt length and an
output length (the simulator knows the output length in advance; the engine it
imitates does not, which is why it must preempt when the KV pool runs out).

Lengths are drawn uniformly from an inclusive range `lo:hi` (a single number
means every request has that length). Arrivals are all at t = 0 (an offline
batch, like `vllm bench serve --request-rate inf`) or a Poisson process of the
given rate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from labs.specs import SpecError


@dataclass(frozen=True)
class Request:
    rid: int
    arrival: float  # seconds
    prompt_len: int  # tokens
    output_len: int  # tokens to generate, >= 1


@dataclass(frozen=True)
class LengthRange:
    lo: int
    hi: int

    def __post_init__(self):
        if not 1 <= self.lo <= self.hi:
            raise SpecError(f"length range must satisfy 1 <= lo <= hi, got {self.lo}:{self.hi}")

    @classmethod
    def parse(cls, text: str) -> "LengthRange":
        """'256' or '16:512' -> LengthRange; a clear error for anything else."""
        parts = text.split(":")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise SpecError(f"length range must be N or LO:HI in tokens, got {text!r}") from None
        if len(values) == 1:
            return cls(values[0], values[0])
        if len(values) == 2:
            return cls(values[0], values[1])
        raise SpecError(f"length range must be N or LO:HI in tokens, got {text!r}")

    def draw(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


def make_trace(
    n: int,
    prompt: LengthRange,
    output: LengthRange,
    rate: float = math.inf,
    seed: int = 0,
    start: float = 0.0,
    first_rid: int = 0,
) -> list[Request]:
    """`n` requests; Poisson arrivals at `rate` requests/s, or all at `start` when rate is inf."""
    if n < 1:
        raise SpecError(f"a trace needs at least one request, got {n}")
    if not rate > 0:
        raise SpecError(f"request rate must be > 0 requests/s (or inf), got {rate}")
    rng = random.Random(seed)
    t = start
    out = []
    for i in range(n):
        if math.isfinite(rate) and i > 0:
            t += rng.expovariate(rate)
        out.append(Request(first_rid + i, t, prompt.draw(rng), output.draw(rng)))
    return out
