"""Worked examples of part 5 (serving with vLLM): prefix caching, sampling, the request loop, SLO tuning.

The part-5 lessons and their questions work a few cases through: a 2,000-token system prompt
hitting the prefix cache, what the sampler's logits cost beside a decode step, how much a serial
CPU loop idles the GPU, how far a looser TPOT target raises the batch. Their figures are computed
here from the cost model (labs.roofline), the KV-sizing lab's block size and the serving
simulator's sampling scenario, so a page quotes a field instead of re-deriving a formula.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import roofline
from labs.kv_sizing import formula
from labs.roofline import StepCost
from labs.worked import at_least


# ---------------------------------------------------------------------------
# Prefix caching
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefixCacheHit:
    """One prompt of a shared prefix plus the request's own tokens, with and without a cache hit."""

    block_size: int
    shared_tokens: int
    prompt_tokens: int  # shared prefix plus the request's own tokens
    hit_tokens: int  # whole cached blocks, never the prompt's last token
    hit_blocks: int
    hit_rate: float  # hit tokens over prompt tokens
    cold: StepCost  # the whole prompt prefilled
    warm: StepCost  # only the tokens after the hit, attending over the cached ones
    flops_saved: float
    compute_s_saved: float  # at the dense peak: a lower bound on the TTFT a hit saves
    hit_kv_bytes: int  # KV a request does not duplicate when it shares the hit blocks


def prefix_hit_tokens(shared_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens a prompt reuses from cached blocks: B_s * floor(min(n, N - 1) / B_s).

    Only full blocks are hashed (a partial one is still being written), and vLLM's
    get_computed_blocks caps the hit at N - 1 because the last prompt token must run to give
    the first output's logits. No lab holds this rule torch-free, so it lives here.
    """
    return block_size * (min(shared_tokens, prompt_tokens - 1) // block_size)


def prefix_cache_hit_example(model: str, gpu: str, shared_tokens: int, user_tokens: int,
                             block_size: int | None = None) -> PrefixCacheHit:
    """What a prefix-cache hit on a shared system prompt skips, priced by the cost model."""
    at_least("shared_tokens", shared_tokens, 1)
    at_least("user_tokens", user_tokens, 0)
    dep = roofline.deployment(model, gpu)
    size = block_size if block_size is not None else formula.default_block_size(dep.model)
    at_least("block_size", size, 1)
    prompt = shared_tokens + user_tokens
    hit = prefix_hit_tokens(shared_tokens, prompt, size)
    cold, warm = dep.prefill(prompt), dep.prefill(prompt - hit, hit)
    return PrefixCacheHit(
        block_size=size, shared_tokens=shared_tokens, prompt_tokens=prompt, hit_tokens=hit,
        hit_blocks=hit // size, hit_rate=hit / prompt, cold=cold, warm=warm,
        flops_saved=cold.flops - warm.flops, compute_s_saved=cold.compute_s - warm.compute_s,
        hit_kv_bytes=dep.kv_bytes(hit))


@dataclass(frozen=True)
class PrefixCopies:
    """The same prefix's KV held once per running request, as it is without prefix caching."""

    copies: int
    kv_bytes_per_copy: int
    kv_bytes: int


def prefix_cache_copies_example(model: str, gpu: str, shared_tokens: int, copies: int) -> PrefixCopies:
    """The KV that `copies` concurrent requests spend on identical prefix bytes without sharing."""
    at_least("shared_tokens", shared_tokens, 1)
    at_least("copies", copies, 1)
    per_copy = roofline.deployment(model, gpu).kv_bytes(shared_tokens)
    return PrefixCopies(copies=copies, kv_bytes_per_copy=per_copy, kv_bytes=copies * per_copy)


# ---------------------------------------------------------------------------
# Sampling: the serving simulator's sampling scenario, one figure at a time
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingPass:
    """One read and write of a decode step's float32 logits, against the step itself."""

    batch: int
    context: int
    logits_bytes: int
    pass_s: float  # read and write the B x V logits once at HBM bandwidth
    step_s: float  # the decode step's floor
    pass_fraction: float  # pass over step


@dataclass(frozen=True)
class PromptLogprobs:
    """What prompt_logprobs adds to one prompt: logits and an LM head for every position."""

    prompt_tokens: int
    logits_bytes: int
    lm_head_s: float  # the LM head over every prompt position, at the dense peak
    prefill_s: float  # the prompt's prefill floor without it


def _sampling_scenario(model: str, gpu: str, batch: int, context: int, prompt_tokens: int) -> dict:
    """The lab's own numbers (python -m labs.serving_sim sampling), so the page and the lab agree."""
    from labs.serving_sim import scenarios

    return scenarios.sampling(scenarios.setup(model, gpu), (batch,), context, prompt_tokens)[0]


def sampling_pass_example(model: str, gpu: str, batch: int, context: int) -> SamplingPass:
    """Why sampling parameters do not move throughput: a sampler pass is a sliver of the step."""
    at_least("batch", batch, 1)
    at_least("context", context, 0)
    row = _sampling_scenario(model, gpu, batch, context, 1)[str(batch)]
    return SamplingPass(batch=batch, context=context, logits_bytes=row["logits_bytes"], pass_s=row["pass_s"],
                        step_s=row["step_s"], pass_fraction=row["pass_s"] / row["step_s"])


def sampling_prompt_logprobs_example(model: str, gpu: str, prompt_tokens: int) -> PromptLogprobs:
    """Where sampling does cost: prompt_logprobs runs the LM head on every prompt token."""
    at_least("prompt_tokens", prompt_tokens, 1)
    row = _sampling_scenario(model, gpu, 1, 0, prompt_tokens)["prompt_logprobs"]
    return PromptLogprobs(prompt_tokens=prompt_tokens, logits_bytes=row["logits_bytes"],
                          lm_head_s=row["lm_head_s"], prefill_s=row["prefill_s"])


# ---------------------------------------------------------------------------
# The request loop: CPU work in series with the GPU
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SerialLoop:
    """One engine step with its CPU work done in series, as V0's single loop did."""

    gpu_step_s: float  # the decode step's floor
    cpu_s: float  # CPU work per step, not overlapped
    gpu_idle_fraction: float  # cpu / (gpu + cpu)


def lifecycle_serial_loop_example(model: str, gpu: str, context: int, cpu_s: float, batch: int = 1) -> SerialLoop:
    """Why V1 overlaps CPU and GPU work: in series, the CPU's share of a short step is GPU idle time.

    A new formula: the GPU waits through the CPU part of every step, so it idles for
    cpu / (gpu step + cpu) of the wall time.
    """
    at_least("batch", batch, 1)
    at_least("context", context, 0)
    at_least("cpu_s", cpu_s, 0)
    step = roofline.deployment(model, gpu).decode(batch, context).floor_s
    return SerialLoop(gpu_step_s=step, cpu_s=cpu_s, gpu_idle_fraction=cpu_s / (step + cpu_s))


# ---------------------------------------------------------------------------
# Tuning against a TPOT target
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TpotRelax:
    """The largest decode batch under a tight and a looser TPOT target, at one context."""

    tight_batch: int
    loose_batch: int
    batch_ratio: float  # loose batch over tight batch
    throughput_gain: float  # decode tokens/s at the loose batch over the tight one


def tuning_tpot_relax_example(model: str, gpu: str, context: int, tight_tpot_s: float, loose_tpot_s: float,
                              kv_dtype: str = "auto") -> TpotRelax:
    """Relaxing a TPOT target admits more requests than it adds throughput: each step gets slower."""
    at_least("context", context, 0)
    at_least("tight_tpot_s", tight_tpot_s, 0)
    at_least("loose_tpot_s", loose_tpot_s, tight_tpot_s)
    dep = roofline.deployment(model, gpu, kv_dtype=kv_dtype)
    tight, loose = dep.largest_batch(context, tight_tpot_s), dep.largest_batch(context, loose_tpot_s)
    if tight < 1:
        raise ValueError(f"tight_tpot_s {tight_tpot_s:g} s is below one sequence's decode step at {context:,} tokens")
    return TpotRelax(tight_batch=tight, loose_batch=loose, batch_ratio=loose / tight,
                     throughput_gain=dep.throughput_gain(loose, context, tight))


EXAMPLES = [prefix_cache_hit_example, prefix_cache_copies_example, sampling_pass_example,
            sampling_prompt_logprobs_example, lifecycle_serial_loop_example, tuning_tpot_relax_example]
