"""Two stand-in language models and the decoding loop, with and without the mask.

Neither model knows anything: `random_logits` draws a fresh Gaussian row per step, and
`Bigram` counts which token follows which in the lab's own corpus (add-alpha smoothed, so
every token keeps some probability). What the mask guarantees must hold for any logits, so
a model that knows nothing is the fair test; the bigram model also shows what it cannot
give: the right city for the country.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from labs.structured import masks
from labs.structured.automaton import DFA


class RandomLogits:
    name = "random logits"

    def __init__(self, size: int, scale: float = 3.0):
        self.size, self.scale = size, scale

    def logits(self, prev: int, rng: np.random.Generator) -> np.ndarray:
        return rng.normal(0.0, self.scale, self.size)


class Bigram:
    name = "bigram"

    def __init__(self, size: int, sequences: list[list[int]], start: int, alpha: float = 0.01):
        self.size, self.start = size, start
        counts: dict[int, Counter] = defaultdict(Counter)
        for seq in sequences:
            for a, b in zip([start, *seq], seq):
                counts[a][b] += 1
        self.base = float(np.log(alpha))
        self.rows = {a: (np.array(list(c)), np.log(np.array(list(c.values()), dtype=float) + alpha))
                     for a, c in counts.items()}

    def logits(self, prev: int, rng: np.random.Generator) -> np.ndarray:
        out = np.full(self.size, self.base)
        if prev in self.rows:
            ids, values = self.rows[prev]
            out[ids] = values
        return out


def _draw(logits: np.ndarray, rng: np.random.Generator) -> int:
    """A sample of softmax(logits) by the Gumbel-max trick (what vLLM's sampler does too)."""
    return int(np.argmax(logits + rng.gumbel(size=logits.shape)))


@dataclass
class Sample:
    ids: list[int]
    text: bytes
    finished: bool  # ended with <eos> rather than at max_tokens


# --8<-- [start:decode]
def decode(model, dfa: DFA, next_state: np.ndarray | None, eos_id: int, rng: np.random.Generator,
           max_tokens: int = 96, start: int | None = None) -> Sample:
    """One sample. With `next_state` (the precomputed table) every step is masked; None decodes freely."""
    state, prev, ids = 0, eos_id if start is None else start, []
    for _ in range(max_tokens):
        logits = model.logits(prev, rng)
        if next_state is not None:
            mask = masks.allowed(next_state[state], bool(dfa.accepting[state]), eos_id)
            logits = masks.apply(logits, mask)
        token = _draw(logits, rng)
        if token == eos_id:
            return Sample(ids, b"", True)
        ids.append(token)
        if next_state is not None:
            state = int(next_state[state, token])
        prev = token
    return Sample(ids, b"", False)
# --8<-- [end:decode]
