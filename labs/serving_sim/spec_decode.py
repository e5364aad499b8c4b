"""Speculative decoding: expected tokens per step and the speedup they buy.

One speculative step: a drafter proposes k tokens (k draft passes for an
autoregressive drafter), the target scores all k + 1 positions in one forward
pass, and rejection sampling keeps the longest accepted prefix plus one token
from the target (the correction, or a bonus token when all k pass). With each
draft token accepted independently with probability alpha, the step yields

    E[tokens] = 1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)

(k + 1 when alpha = 1). `monte_carlo_tokens` counts the same thing by drawing
acceptances, so the tests can check the closed form.

The speedup is tokens per second with speculation over tokens per second
without, at the same batch B and context L:

    speedup = E[tokens] * t_target(B x 1) / (k * t_draft(B) + t_target(B x (k + 1)))

with step times from the roofline (labs/serving_sim/cost.py). At small B the
target step is memory-bound, so scoring k + 1 tokens costs about what scoring
1 does and the speedup approaches E[tokens]; at large B the verify step turns
compute-bound, its cost grows with k + 1, and the speedup falls below 1.

Drafters costed here:
* ``eagle``: one decoder layer of the target's width plus the target's LM head
  (an EAGLE-style head reuses it), with one layer of KV. Derived from the
  model's geometry, not measured.
* ``ngram``: prompt lookup on the CPU; its GPU cost is taken as 0.
* a model name from labs/data/models.yaml: a separate small draft model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from labs.serving_sim.cost import Chunk, Roofline
from labs.specs import SpecError, get_model


def expected_tokens(alpha: float, k: int) -> float:
    """Closed form of tokens per speculative step (accepted drafts + 1)."""
    _check(alpha, k)
    if alpha == 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def draft_acceptance_rate(alpha: float, k: int) -> float:
    """Accepted over drafted tokens, the ratio vLLM's counters give, for per-position rate alpha.

    It is not alpha: a draft token after the first rejection is drafted but never accepted,
    so the ratio is E[accepted] / k = (alpha - alpha^(k+1)) / (k (1 - alpha)), below alpha for k > 1.
    """
    return (expected_tokens(alpha, k) - 1) / k


def per_position_alpha(accepted_per_pos: list[float], drafts: float) -> list[float]:
    """Conditional acceptance at each position from vLLM's per-position counters.

    vllm:spec_decode_num_accepted_tokens_per_pos counts drafts whose first i + 1 tokens all
    passed, so position i's own rate is its count over position i - 1's (drafts for i = 0).
    """
    counts = [float(drafts), *accepted_per_pos]
    return [b / a if a else float("nan") for a, b in zip(counts, counts[1:])]


def alpha_from_mean_accepted(mean_accepted: float, k: int) -> float:
    """The alpha whose expected accepted drafts per step (E - 1) equals `mean_accepted`, by bisection."""
    _check(0.5, k)
    if not 0 <= mean_accepted <= k:
        raise SpecError(f"mean accepted tokens per draft must be in [0, {k}], got {mean_accepted}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) - 1 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def monte_carlo_tokens(alpha: float, k: int, trials: int, seed: int = 0) -> float:
    """Mean tokens per step over `trials` simulated steps with i.i.d. acceptances."""
    _check(alpha, k)
    if trials < 1:
        raise SpecError(f"trials must be >= 1, got {trials}")
    rng = random.Random(seed)
    total = 0
    for _ in range(trials):
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        total += accepted + 1
    return total / trials


def _check(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise SpecError(f"acceptance rate alpha must be in [0, 1], got {alpha}")
    if k < 1:
        raise SpecError(f"number of speculative tokens k must be >= 1, got {k}")


@dataclass(frozen=True)
class Drafter:
    """The cost of one draft pass over B requests."""

    name: str
    target: Roofline
    draft: Roofline | None = None  # a separate draft model

    def time(self, batch: int, context: int) -> float:
        if self.name == "ngram":
            return 0.0
        if self.draft is not None:
            return self.draft.decode_step_time(batch, context)
        # EAGLE-style head: one layer of the target plus the target's LM head, one layer of KV.
        t, m = self.target, self.target.model
        layer_params = t.body_params // m.n_layers
        nbytes = (layer_params + t.lm_head_params) * m.weight_bytes_per_param
        nbytes += batch * (context + 1) * t.kv_bytes_per_token // m.n_layers
        nflops = 2 * (layer_params + t.lm_head_params) * batch
        nflops += 4 * m.n_heads * m.head_dim * batch * (context + 1)
        return max(nbytes / t.bandwidth, nflops / t.flops) + t.overhead_s


def make_drafter(name: str, target: Roofline) -> Drafter:
    if name in ("eagle", "ngram"):
        return Drafter(name, target)
    draft_model = get_model(name)  # raises SpecError naming the known models
    if draft_model.vocab_size != target.model.vocab_size:
        raise SpecError(
            f"draft model {name} has vocab {draft_model.vocab_size}, target {target.model.name} has "
            f"{target.model.vocab_size}: a draft model must share the target's tokenizer"
        )
    return Drafter(name, target, Roofline(draft_model, target.gpu, target.kv_cache_dtype, target.overhead_s))


def speedup(target: Roofline, drafter: Drafter, alpha: float, k: int, batch: int, context: int) -> float:
    """Decode tokens/s with speculation over without, at batch `batch` and context `context`."""
    base = target.decode_step_time(batch, context)
    verify = target.step_time([Chunk(k + 1, context, k + 1)] * batch)
    spec = k * drafter.time(batch, context) + verify
    return expected_tokens(alpha, k) * base / spec


def draft_cost_ratio(target: Roofline, drafter: Drafter, batch: int, context: int) -> float:
    """One draft pass over one target decode step, at the same batch and context."""
    return drafter.time(batch, context) / target.decode_step_time(batch, context)
