"""Worked examples of part 2 (GPU memory): the VRAM budget, KV capacity and out-of-memory diagnosis.

The memory lessons argue from differences and ratios of figures the labs already hold: the
back-of-envelope capacity vLLM refuses, what share of the budget the weights take, what one
point of utilization or one offloaded GiB buys, how much cache an OOM left unused. Each is
computed here from the KV-sizing lab (labs.kv_sizing), the specs and the OOM lab's recorded
runs (labs/oom/report.py), so the pages quote the figures instead of deriving them.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import specs
from labs.kv_sizing import formula, memory_budget
from labs.kv_sizing.memory_budget import GIB
from labs.oom.report import oom_result
from labs.worked import positive


@dataclass(frozen=True)
class NaiveEnvelope:
    """The marketed-memory estimate of a deployment's capacity against vLLM's budget for it."""

    marketed_bytes: int  # every GPU's marketed decimal GB, together
    weight_bytes: int  # the whole model's weights
    kv_bytes_per_token: int  # the whole model's, every KV head
    naive_requests: float  # (marketed - weights) / (KV per token x L)
    max_concurrency: float  # what vLLM's budget holds, per deployment
    shortfall_of_one_request: float  # the part of one request that budget lacks (0 when one fits)


def memory_naive_envelope(model: str, gpu: str, max_model_len: int, n_gpus: int = 1) -> NaiveEnvelope:
    """The back-of-envelope answer the VRAM lesson opens with, beside vLLM's.

    The envelope is a new formula on purpose: it is the estimate the lesson takes apart (marketed
    GB, no utilization share, no activation peak or graphs, no blocks), so nothing in labs/ holds it.
    """
    positive("max_model_len", max_model_len)
    positive("n_gpus", n_gpus)
    m, g = specs.get_model(model), specs.get_gpu(gpu)
    marketed = int(n_gpus * g.memory_gb_marketed * 1e9)
    kv_per_token = formula.kv_bytes_per_token(m)
    budget = memory_budget.budget(m, g, max_model_len, tensor_parallel_size=n_gpus)
    return NaiveEnvelope(
        marketed_bytes=marketed,
        weight_bytes=m.weight_bytes,
        kv_bytes_per_token=kv_per_token,
        naive_requests=(marketed - m.weight_bytes) / (kv_per_token * max_model_len),
        max_concurrency=budget.max_concurrency,
        shortfall_of_one_request=max(0.0, 1 - budget.max_concurrency),
    )


@dataclass(frozen=True)
class BudgetShares:
    """One GPU's budget read as shares, and what the knobs that barely move it add."""

    weights_share: float  # of the requested budget (u x total)
    runtime_overhead_share: float  # activation peak + non-torch + CUDA graphs, of the same budget
    raised_utilization: float
    pool_gain_at_raised_utilization: int  # KV pool bytes gained by raising u to raised_utilization
    tokens_per_offloaded_gib: int  # whole tokens of cache one GiB of --cpu-offload-gb frees
    requests_per_offloaded_gib: float  # the same GiB as a fraction of one max_model_len request


def memory_budget_shares(model: str, gpu: str, max_model_len: int,
                         raised_utilization: float = 0.95) -> BudgetShares:
    """Why raising u and offloading weights are weak knobs next to fp8 and TP.

    An offloaded GiB of weights is a GiB more for the pool, so it buys GiB / (KV bytes per token)
    tokens; the budget's other terms do not move.
    """
    positive("max_model_len", max_model_len)
    m, g = specs.get_model(model), specs.get_gpu(gpu)
    base = memory_budget.budget(m, g, max_model_len)
    raised = memory_budget.budget(m, g, max_model_len, gpu_memory_utilization=raised_utilization)
    kv_per_token = formula.kv_bytes_per_token(m)
    return BudgetShares(
        weights_share=base.weights / base.requested_memory,
        runtime_overhead_share=base.runtime_overhead / base.requested_memory,
        raised_utilization=raised_utilization,
        pool_gain_at_raised_utilization=raised.kv_pool - base.kv_pool,
        tokens_per_offloaded_gib=GIB // kv_per_token,
        requests_per_offloaded_gib=GIB / (kv_per_token * max_model_len),
    )


@dataclass(frozen=True)
class UtilizationPoint:
    """What one percentage point of --gpu-memory-utilization is worth on a GPU."""

    total_memory: int  # the total vLLM multiplies by u (cudaMemGetInfo's, else nvidia-smi's)
    bytes_per_point: float  # total / 100: all of it goes to (or comes out of) the KV pool


def memory_utilization_point(gpu: str) -> UtilizationPoint:
    """The price of lowering u as a fix: the weights, activation peak and graphs do not depend on u,
    so every point taken off the budget comes out of the KV pool."""
    total = specs.get_gpu(gpu).memory_bytes_budget
    return UtilizationPoint(total_memory=total, bytes_per_point=total / 100)


@dataclass(frozen=True)
class SlidingWindowKV:
    """KV bytes per token of a hybrid model: what grows with context, against every layer counted."""

    n_layers: int
    n_full_layers: int
    kv_bytes_per_token: int  # the full-attention layers only: what each more token of context costs
    kv_bytes_per_token_every_layer: int  # the naive formula's, as if every layer kept every token


def memory_sliding_window_kv(model: str) -> SlidingWindowKV:
    """Where the naive per-token formula overcounts: sliding layers stop growing past their window."""
    m = specs.get_model(model)
    return SlidingWindowKV(
        n_layers=m.n_layers,
        n_full_layers=m.n_full_layers,
        kv_bytes_per_token=formula.kv_bytes_per_token(m),
        kv_bytes_per_token_every_layer=formula.kv_bytes_per_token_all_layers(m),
    )


@dataclass(frozen=True)
class LogRounding:
    """How coarse vLLM's GiB log lines are, in blocks of one model."""

    bytes_per_block: int
    log_precision_gib: float
    blocks_per_log_step: float  # blocks in one step of the logged GiB figure


def memory_log_rounding(model: str, log_precision_gib: float = 0.01) -> LogRounding:
    """A pool rebuilt from GiB figures copied out of the log can only match to this many blocks."""
    positive("log_precision_gib", log_precision_gib)
    m = specs.get_model(model)
    bpb = formula.bytes_per_block(m, formula.default_block_size(m))
    return LogRounding(bytes_per_block=bpb, log_precision_gib=log_precision_gib,
                       blocks_per_log_step=log_precision_gib * GIB / bpb)


@dataclass(frozen=True)
class OomEvidence:
    """The allocator figures that tell the OOM lab's prefill failure from its fragmentation failure."""

    prefill_cached_unused: int  # reserved - allocated when the prefill failed
    prefill_one_step_bytes: int  # batched tokens x measured activation bytes per token
    fragmentation_cached_unused: int  # reserved - allocated when the fragmented allocation failed
    fragmentation_cache_per_request: float  # that cache as a multiple of the failed request


def memory_oom_evidence(gpu: str, path: str | None = None) -> OomEvidence:
    """Reserved-but-unallocated is the number that separates fragmentation from a real shortage;
    the OOM lab records reserved and allocated, so the gap is taken here from its recorded runs."""
    prefill = oom_result("prefill-activation", gpu=gpu, path=path)
    fragmented = oom_result("fragmentation", gpu=gpu, path=path)
    pe, fe = prefill["evidence"], fragmented["evidence"]
    fragmentation_gap = fe["reserved"] - fe["allocated"]
    return OomEvidence(
        prefill_cached_unused=pe["reserved"] - pe["allocated"],
        prefill_one_step_bytes=prefill["setup"]["batched_tokens"] * prefill["activation_bytes_per_token"],
        fragmentation_cached_unused=fragmentation_gap,
        fragmentation_cache_per_request=fragmentation_gap / fe["requested"],
    )


EXAMPLES = [memory_naive_envelope, memory_budget_shares, memory_utilization_point, memory_sliding_window_kv,
            memory_log_rounding, memory_oom_evidence]
