"""Itemise one GPU's memory the way vLLM 0.33 (V1 engine) sizes its KV pool.

What vLLM 0.33 does at startup, per worker (one per GPU):

1. ``request_memory`` (vllm/v1/worker/utils.py): the instance's budget is
   ``ceil(total_memory * gpu_memory_utilization)``, where total_memory is what
   the driver reports (``torch.accelerator.get_memory_info``), not the marketed
   size. It is a per-instance fraction of the whole GPU, not of free memory;
   startup fails if less than that is free.
2. ``Worker.determine_available_memory`` (vllm/v1/worker/gpu_worker.py) runs a
   profiling forward pass of max_num_batched_tokens tokens inside
   ``memory_profiling`` (vllm/utils/mem_utils.py) and sets
      available = requested - non_kv_cache_memory - cudagraph_estimate
   with non_kv_cache_memory = total_consumed + transient_peak_headroom:
   * total_consumed: free memory at the baseline snapshot minus free memory
     after profiling: the weights, persistent torch buffers and non-torch memory
     (cuBLAS workspaces, NCCL buffers) this instance holds. The CUDA context is
     created before the baseline snapshot, so it is not in it: it, and any other
     process, live in the (1 - utilization) slack.
   * transient_peak_headroom: torch's peak allocated bytes during the profile
     pass minus what stays allocated after it: the activation peak.
   * cudagraph_estimate: ``profile_cudagraph_memory()``, subtracted because
     VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 (vllm/envs.py).
3. ``get_kv_cache_configs`` (vllm/v1/core/kv_cache_planning.py): num_blocks =
   available // bytes_per_block. One block is the BlockPool's null block, so
   the startup check plans against available - bytes_per_block.
4. ``get_max_concurrency_for_kv_cache_config`` and ``get_kv_cache_capacity``
   (vllm/v1/core/kv_cache_utils.py): maximum concurrency = num_blocks / blocks
   one max_model_len request needs; the logged "GPU KV cache size: N tokens"
   is int(concurrency * max_model_len).

Weights, KV geometry and the block arithmetic follow from the config. Three
terms do not (activation peak, non-torch memory, CUDA-graph memory): they are
inputs, and their defaults here are labelled estimates with their basis.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from labs import vllm_facts
from labs.kv_sizing import formula
from labs.specs import GPUSpec, ModelSpec, SpecError

GIB = 2**30

# vllm/config/cache.py CacheConfig.gpu_memory_utilization default, from labs/data/vllm.yaml.
DEFAULT_GPU_MEMORY_UTILIZATION = vllm_facts.resolved_default("gpu_memory_utilization")

SOURCES = (
    "vllm/v1/worker/utils.py request_memory",
    "vllm/v1/worker/gpu_worker.py Worker.determine_available_memory",
    "vllm/utils/mem_utils.py memory_profiling",
    "vllm/v1/core/kv_cache_planning.py get_kv_cache_configs, get_kv_cache_config_from_groups, "
    "_get_kv_cache_bytes_per_block, _check_enough_kv_cache_memory",
    "vllm/v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config, get_kv_cache_capacity",
    "vllm/v1/kv_cache_interface.py FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec",
    "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults",
    "vllm/config/cache.py CacheConfig (gpu_memory_utilization=0.92, block_size=16)",
)


def vllm_batch_defaults(gpu: GPUSpec) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that `vllm serve` picks on this GPU.

    vllm/engine/arg_utils.py `get_batch_defaults`, OpenAI-server context, as
    recorded in labs/data/vllm.yaml's `batch_defaults` table (memory tiers).
    """
    return (vllm_facts.gpu_batch_default("max_num_batched_tokens", gpu),
            vllm_facts.gpu_batch_default("max_num_seqs", gpu))


def estimate_activation_peak(model: ModelSpec, num_tokens: int, max_num_seqs: int, tp: int = 1) -> int:
    """Estimate of the profiling pass's transient peak, in bytes (one rank).

    Basis: the largest live set of one layer's MLP during a prefill of
    `num_tokens` tokens at the model dtype: the fused gate/up output
    (T x 2I/tp), the activated product (T x I/tp) and two hidden-size tensors
    (input and residual, T x 2H); for MoE, I is experts_per_token x
    moe_intermediate_size. Plus the sampler's float32 logits for max_num_seqs
    rows (S x V x 4). It ignores attention workspaces and allocator rounding,
    so treat it as a starting point and replace it with the "torch peak memory
    increase" your own vLLM startup log prints.
    """
    b = 2 if model.serving_dtype != "float32" else 4
    inter = model.intermediate_size
    if model.moe is not None:
        inter = model.moe.experts_per_token * model.moe.moe_intermediate_size
    per_token = (3 * inter // tp + 2 * model.hidden_size) * b
    logits = max_num_seqs * model.vocab_size * 4
    return num_tokens * per_token + logits


# Order-of-magnitude defaults for the two terms no config determines.
NON_TORCH_ESTIMATE = int(0.25 * GIB)
NON_TORCH_TP_EXTRA = int(0.5 * GIB)
CUDAGRAPH_ESTIMATE = int(0.5 * GIB)


@dataclass(frozen=True)
class Budget:
    """One rank's memory, itemised; all sizes in bytes."""

    model: str
    gpu: str
    tensor_parallel_size: int
    max_model_len: int
    block_size: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    max_num_seqs: int
    total_memory: int
    requested_memory: int
    weights: int
    activation_peak: int
    non_torch: int
    cudagraph: int
    kv_pool: int
    kv_bytes_per_token: int
    layer_bytes_per_token: int
    page_bytes: int
    bytes_per_block: int
    num_blocks: int
    blocks_per_request: int
    kv_bytes_per_sequence: int
    max_concurrency: float
    kv_cache_tokens: int
    token_slots: int
    kv_heads_per_rank: int
    kv_head_replicas: int
    kv_cache_groups: list
    fits_one_request: bool
    estimated_max_model_len: int
    error: str | None
    total_measured: bool = True  # False: no cudaMemGetInfo total recorded, nvidia-smi's used (an upper bound)
    estimates: dict = field(default_factory=dict)
    formula: list = field(default_factory=list)
    sources: tuple = SOURCES

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def runtime_overhead(self) -> int:
        """Activation peak, non-torch memory and CUDA graphs together: what profiling takes beside the weights."""
        return self.activation_peak + self.non_torch + self.cudagraph

    def pool_for(self, requests: int) -> int:
        """KV pool bytes that hold `requests` max_model_len requests at once (plus the null block)."""
        return (requests * self.blocks_per_request + 1) * self.bytes_per_block

    @property
    def max_requests(self) -> int:
        """Whole max_model_len requests the pool holds at once: max_concurrency rounded down."""
        return self.num_blocks // self.blocks_per_request if self.blocks_per_request else 0

    def requests_of(self, tokens: int) -> int:
        """Requests of `tokens` tokens each that fit at once, in whole blocks, the null block left out.

        Stricter than max_requests, which follows vLLM's logged concurrency (num_blocks, null block
        included). Full-attention models only: a sliding-window group reserves its window instead.
        """
        if any(g["kind"] != "full" for g in self.kv_cache_groups):
            raise ValueError(f"{self.model}: requests_of counts full-attention blocks only")
        return (self.num_blocks - 1) // -(-tokens // self.block_size)


def kv_check_message(max_model_len: int, needed: int, available: int, estimated_max_len: int) -> str:
    """The error vLLM 0.33 raises when one max-length request does not fit.

    Worded as in vllm/v1/core/kv_cache_planning.py `_check_enough_kv_cache_memory`,
    with its GiB figures as `format_gib` writes them (rounded to two places, trailing
    zeros dropped); `available` already excludes the null block.
    """
    hint = (f"Based on the available memory, the estimated maximum model length is {estimated_max_len}. "
            if estimated_max_len > 0 else "")
    return (
        f"To serve at least one request with the model's max seq len ({max_model_len}), "
        f"({_format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache "
        f"memory ({_format_gib(available)} GiB). {hint}Try increasing `gpu_memory_utilization` (which also "
        f"controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. "
        f"See {CONSERVING_MEMORY_URL} for more details."
    )


# The page both of vLLM 0.33's KV-cache refusals point to.
CONSERVING_MEMORY_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"


def no_memory_message() -> str:
    """vLLM 0.33's error when nothing is left for the KV cache (`_check_enough_kv_cache_memory`)."""
    return ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
            f"despite its name). See {CONSERVING_MEMORY_URL} for more details.")


def _format_gib(n_bytes: int) -> str:
    """vllm/utils/mem_utils.py format_gib: str(round(bytes / GiB, 2))."""
    return f"{round(n_bytes / GIB, 2)}"


def estimate_max_model_len(model: ModelSpec, available: int, block_size: int, kv_dtype: str = "auto",
                           tp: int = 1, in_flight: int = 16384, upper: int | None = None) -> int:
    """Longest max_model_len whose one request fits `available` bytes (vLLM's binary search)."""
    return _estimate_max_model_len(model, available, block_size, kv_dtype, tp, in_flight,
                                   upper or model.max_position_embeddings)


def _estimate_max_model_len(model, check_memory, block_size, kv_dtype, tp, in_flight, upper) -> int:
    """vLLM's binary search (`_estimate_max_model_len_from_groups`): longest L whose request fits."""
    bpb = formula.bytes_per_block(model, block_size, kv_dtype, tp)

    def fits(n: int) -> bool:
        return formula.blocks_per_request(model, n, block_size, in_flight) * bpb <= check_memory

    if not fits(1):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def budget(
    model: ModelSpec,
    gpu: GPUSpec,
    max_model_len: int | None = None,
    *,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    block_size: int | None = None,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    activation_peak: int | None = None,
    non_torch: int | None = None,
    cudagraph: int | None = None,
    total_memory: int | None = None,
    weights: int | None = None,
) -> Budget:
    """Itemise one rank's memory and size its KV pool as vLLM 0.33 does.

    `total_memory` overrides the GPU's driver-reported total (bytes), e.g. with
    a measured `torch.cuda.mem_get_info()[1]`. `weights` overrides one rank's
    weight bytes (default: the cost model's, labs.roofline.weight_bytes, at the
    dtype vLLM loads).
    """
    if max_model_len is None:
        max_model_len = model.max_position_embeddings
    if max_model_len < 1:
        raise SpecError(f"max model length must be a positive number of tokens, got {max_model_len}")
    if not 0 < gpu_memory_utilization <= 1:
        raise SpecError(f"gpu memory utilization must be in (0, 1], got {gpu_memory_utilization}")
    tp = tensor_parallel_size
    formula.check_tensor_parallel(model, tp)
    kv_dtype = formula.resolve_kv_dtype(model, kv_cache_dtype)
    block_size = block_size or formula.default_block_size(model, kv_dtype)
    if block_size < 1:
        raise SpecError(f"block size must be >= 1, got {block_size}")
    default_tokens, default_seqs = vllm_batch_defaults(gpu)
    max_num_batched_tokens = max_num_batched_tokens or default_tokens
    max_num_seqs = max_num_seqs or default_seqs
    in_flight = 2 * max_num_batched_tokens  # async scheduling: 2 batches in flight

    estimates = {}
    if activation_peak is None:
        activation_peak = estimate_activation_peak(model, max_num_batched_tokens, max_num_seqs, tp)
        estimates["activation_peak"] = (
            f"estimate: MLP live set of a {max_num_batched_tokens}-token prefill "
            f"(T x (3I/tp + 2H) x b) + float32 logits of {max_num_seqs} rows (S x V x 4)"
        )
    if non_torch is None:
        non_torch = NON_TORCH_ESTIMATE + (NON_TORCH_TP_EXTRA if tp > 1 else 0)
        estimates["non_torch"] = (
            "estimate: 0.25 GiB of cuBLAS/attention workspaces and persistent buffers"
            + (", + 0.5 GiB of NCCL buffers for TP > 1" if tp > 1 else "")
            + "; read yours from vLLM's 'Memory profiling takes' debug line"
        )
    if cudagraph is None:
        cudagraph = CUDAGRAPH_ESTIMATE
        estimates["cudagraph"] = (
            "estimate: 0.5 GiB; vLLM 0.33 measures it (profile_cudagraph_memory) and logs it at startup"
        )
    total = total_memory if total_memory is not None else gpu.memory_bytes_budget
    requested = math.ceil(total * gpu_memory_utilization)
    if weights is None:
        from labs import roofline  # imported here: roofline builds on this module

        weights = roofline.weight_bytes(roofline.Deployment(model, gpu, kv_dtype=kv_dtype, tp=tp))

    kv_pool = requested - weights - activation_peak - non_torch - cudagraph
    bpb = formula.bytes_per_block(model, block_size, kv_dtype, tp)
    bpr = formula.blocks_per_request(model, max_model_len, block_size, in_flight)
    num_blocks = max(kv_pool, 0) // bpb
    per_seq = bpr * bpb
    check_memory = kv_pool - bpb  # the null block is never usable
    error = None
    est_len = _estimate_max_model_len(model, check_memory, block_size, kv_dtype, tp, in_flight, max_model_len)
    if kv_pool <= 0:
        error = no_memory_message()
    elif per_seq > check_memory:
        error = kv_check_message(max_model_len, per_seq, check_memory, est_len)
    concurrency = num_blocks / bpr if bpr else 0.0
    lines = [
        f"requested = ceil(total x utilization) = ceil({total} x {gpu_memory_utilization}) = {requested}",
        f"kv_pool = requested - weights - activation_peak - non_torch - cudagraph = {kv_pool}",
        f"bytes_per_block = block_size x layer_bytes_per_token x group_slots = "
        f"{block_size} x {formula.layer_bytes_per_token(model, kv_dtype, tp)} x "
        f"{max(g.slots for g in formula.kv_cache_groups(model))} = {bpb}",
        f"num_blocks = kv_pool // bytes_per_block = {num_blocks}",
        f"blocks_per_request(L={max_model_len}) = {bpr}",
        f"max_concurrency = num_blocks / blocks_per_request = {concurrency:.2f}",
        f"kv_cache_tokens = int(max_concurrency x L) = {int(concurrency * max_model_len)}",
    ]
    if model.mla is None:
        lines.insert(2, (
            f"layer_bytes_per_token = 2 x H_kv/rank x d x b = 2 x {formula.kv_heads_per_rank(model, tp)} x "
            f"{model.head_dim} x {formula.kv_itemsize(model, kv_dtype)} = {formula.layer_bytes_per_token(model, kv_dtype, tp)}"))
    else:
        lines.insert(2, (
            f"layer_bytes_per_token = (kv_lora_rank + qk_rope_head_dim) x b = ({model.mla.kv_lora_rank} + "
            f"{model.mla.qk_rope_head_dim}) x {formula.kv_itemsize(model, kv_dtype)} = "
            f"{formula.layer_bytes_per_token(model, kv_dtype, tp)}"))
    return Budget(
        model=model.name, gpu=gpu.name, tensor_parallel_size=tp, max_model_len=max_model_len,
        block_size=block_size, kv_cache_dtype=kv_dtype, gpu_memory_utilization=gpu_memory_utilization,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        total_memory=total, requested_memory=requested, weights=weights,
        activation_peak=activation_peak, non_torch=non_torch, cudagraph=cudagraph, kv_pool=kv_pool,
        kv_bytes_per_token=formula.kv_bytes_per_token(model, kv_dtype, tp),
        layer_bytes_per_token=formula.layer_bytes_per_token(model, kv_dtype, tp),
        page_bytes=formula.page_bytes(model, block_size, kv_dtype, tp),
        bytes_per_block=bpb, num_blocks=num_blocks, blocks_per_request=bpr,
        kv_bytes_per_sequence=per_seq, max_concurrency=concurrency,
        kv_cache_tokens=int(concurrency * max_model_len), token_slots=num_blocks * block_size,
        kv_heads_per_rank=formula.kv_heads_per_rank(model, tp),
        kv_head_replicas=formula.kv_head_replicas(model, tp),
        kv_cache_groups=[asdict(g) for g in formula.kv_cache_groups(model)],
        fits_one_request=error is None, estimated_max_model_len=est_len, error=error,
        total_measured=total_memory is not None or gpu.memory_mib_cuda is not None,
        estimates=estimates, formula=lines,
    )
