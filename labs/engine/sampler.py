"""Pick one token per row of logits on the device: greedy, or temperature with top-k and top-p.

Sampling uses the exponential-race form of drawing from a categorical: with E_i ~ Exp(1)
independent, argmax_i p_i / E_i is distributed as p. vLLM 0.33's sampler draws the same way
(`random_sample` in vllm/v1/sample/ops/topk_topp_sampler.py). It needs no cumulative sum and
no device-to-host sync, and a row's draw uses only that row's noise, so a request with a
seed gets its own generator and the same tokens whatever else shares its batch.

Order, as vLLM applies it: temperature, then top-k, then top-p (the smallest set of tokens
whose probability reaches top_p, always at least the most likely one).
"""

from __future__ import annotations

import torch

from labs.engine.sequence import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> torch.Tensor:
    """(B, V) logits -> (B,) int64 token ids; `generators[i]` is row i's own, or None for the global one."""
    logits = logits.float()
    if all(p.greedy for p in params):
        return logits.argmax(dim=-1)
    dev = logits.device
    vocab = logits.shape[-1]
    first = params[0]
    if all(p == first for p in params) and not (0 < first.top_k < vocab) and first.top_p == 1.0 \
            and all(g is None for g in generators):
        # One temperature for all, no filters, no seeds (a benchmark's batch): no per-row tensors to
        # build and copy to the device, and no greedy pass, since no row is greedy.
        noise = torch.empty_like(logits).exponential_()
        return ((logits / first.temperature).softmax(dim=-1) / noise).argmax(dim=-1)
    greedy = logits.argmax(dim=-1)
    temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=dev)
    logits = logits / temperature[:, None]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if min(top_k) < vocab or min(top_p) < 1.0:
        logits = _top_k_top_p(logits, torch.tensor(top_k, device=dev), torch.tensor(top_p, device=dev))
    probs = logits.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_()  # the global generator, for unseeded rows
    for i, g in enumerate(generators):
        if g is not None:  # a seeded row redraws from its own generator
            noise[i].exponential_(generator=g)
    sampled = (probs / noise).argmax(dim=-1)
    is_greedy = torch.tensor([p.greedy for p in params], device=dev)
    return torch.where(is_greedy, greedy, sampled)


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k and top-p sets."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    drop = ranks >= top_k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p; rank 0 is always kept.
    before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((before >= top_p[:, None]) & (top_p[:, None] < 1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
