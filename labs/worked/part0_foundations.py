"""Worked examples of part 0 (foundations): KV heads, the memory hierarchy, requests per GPU.

The part-0 lessons compare what a model is with what it could have been (the same model with
MHA or MQA heads, DeepSeek-V3 cached as MHA instead of as a latent), one GPU memory tier with
another, and one deployment's requests with another's. Those comparisons are ratios and
counterfactuals that no cost-model result holds, so they are computed here, on the KV-sizing
formula (labs/kv_sizing), the memory budget and the cost model (labs/roofline.py), and the
pages quote the fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labs import roofline
from labs.kv_sizing import formula, memory_budget
from labs.kv_sizing.memory_budget import GIB
from labs.specs import ModelSpec, SpecError, get_gpu, get_model
from labs.worked import positive

# Hopper register file: 65,536 32-bit registers per SM (Hopper tuning guide, occupancy; the
# driver's regs_per_multiprocessor read 65,536 on an H200 on 2026-11-29).
REGISTERS_PER_SM = 65_536
REGISTER_BYTES = 4

# Shared memory serves 32 banks x 4 bytes = 128 bytes per clock per SM (CUDA C++ programming
# guide, shared memory banks).
SHARED_MEMORY_BANKS = 32
SHARED_MEMORY_BANK_BYTES = 4



def _variant(model: ModelSpec, n_kv_heads: int, label: str) -> ModelSpec:
    """The same model with another KV-head count: what its cache would cost had it been trained so."""
    return dataclasses.replace(model, n_kv_heads=n_kv_heads, display_name=f"{model.display_name} ({label})")


@dataclass(frozen=True)
class TokensInMemory:
    model: str
    memory_bytes: int
    kv_bytes_per_token: int
    tokens: int  # whole tokens that fit: memory_bytes // kv_bytes_per_token (not rounded to whole blocks)


def part0_tokens_in_memory(model: str, memory_gib: float, kv_dtype: str = "auto") -> TokensInMemory:
    """Tokens of context a fixed amount of memory holds: a like-for-like price of one model's cache."""
    positive("memory_gib", memory_gib)
    spec = get_model(model)
    memory = int(memory_gib * GIB)
    per_token = formula.kv_bytes_per_token(spec, kv_dtype)
    return TokensInMemory(model, memory, per_token, memory // per_token)


@dataclass(frozen=True)
class LatentSaving:
    model: str
    element_bytes: int
    mha_kv_bytes_per_token: int  # every head's K (head_dim) and V (v_head_dim), every layer
    latent_kv_bytes_per_token: int  # what vLLM caches: one latent per layer
    saving: float  # mha / latent


def part0_mla_saving(model: str = "deepseek-v3", kv_dtype: str = "auto") -> LatentSaving:
    """What an MLA model's cache would cost stored as plain MHA, against the latent it stores.

    The KV-sizing formula has no MHA figure for an MLA model, whose key (head_dim =
    qk_nope + qk_rope) and value (v_head_dim) differ in width, so it is counted here:
    n_layers x n_heads x (head_dim + v_head_dim) x bytes per element.
    """
    spec = get_model(model)
    if spec.mla is None:
        raise SpecError(f"{model}: not an MLA model (it has no latent to compare)")
    element = formula.kv_itemsize(spec, kv_dtype)
    mha = spec.n_layers * spec.n_heads * (spec.head_dim + spec.mla.v_head_dim) * element
    latent = formula.kv_bytes_per_token(spec, kv_dtype)
    return LatentSaving(model, element, mha, latent, mha / latent)


@dataclass(frozen=True)
class KVHeadVariants:
    model: str
    gpu: str
    max_model_len: int
    gqa_group: int  # query heads per KV head of the model as trained
    kv_pool: int  # one rank's KV pool, bytes; the variants are sized against the same pool
    kv_bytes_per_token: int
    mha_kv_bytes_per_token: int
    mqa_kv_bytes_per_token: int
    flop_per_byte: float  # decode attention's intensity
    mha_flop_per_byte: float
    mqa_flop_per_byte: float
    max_requests: int  # whole max_model_len requests the pool holds
    mha_max_requests: int
    mqa_max_requests: int


def part0_kv_head_variants(model: str = "llama-3.1-8b", gpu: str = "h200",
                           max_model_len: int = 8192) -> KVHeadVariants:
    """The model as trained against the same model with MHA (H_kv = H_q) or MQA (H_kv = 1) heads.

    The variants go through the same KV formula, cost model and pool sizing as the real model,
    with the real model's weight bytes, so the pool is the same and only the bytes per token
    differ: the comparison a lesson makes when it says MHA would hold 1/group of the requests.
    """
    spec, gpu_spec = get_model(model), get_gpu(gpu)
    if spec.mla is not None:
        raise SpecError(f"{model}: an MLA model has no MHA/MQA variant of its heads")
    base = roofline.deployment(spec, gpu_spec)
    pool = base.kv_pool(max_model_len)
    figures = {}
    for label, heads in (("mha", spec.n_heads), ("mqa", 1)):
        variant = _variant(spec, heads, label.upper())
        figures[label] = (roofline.deployment(variant, gpu_spec).attention_flop_per_byte(),
                          memory_budget.budget(variant, gpu_spec, max_model_len, weights=pool.weights))
    (mha_intensity, mha_pool), (mqa_intensity, mqa_pool) = figures["mha"], figures["mqa"]
    return KVHeadVariants(
        model=model, gpu=gpu, max_model_len=max_model_len, gqa_group=spec.gqa_group, kv_pool=pool.kv_pool,
        kv_bytes_per_token=pool.kv_bytes_per_token, mha_kv_bytes_per_token=mha_pool.kv_bytes_per_token,
        mqa_kv_bytes_per_token=mqa_pool.kv_bytes_per_token, flop_per_byte=base.attention_flop_per_byte(),
        mha_flop_per_byte=mha_intensity, mqa_flop_per_byte=mqa_intensity, max_requests=pool.max_requests,
        mha_max_requests=mha_pool.max_requests, mqa_max_requests=mqa_pool.max_requests)


@dataclass(frozen=True)
class TensorParallelKV:
    model: str
    tp: int
    query_heads_per_rank: int
    kv_heads_per_rank: int
    kv_head_replicas: int  # ranks holding a copy of each KV head (the whole latent, for MLA)
    kv_bytes_per_token: int  # the whole model on one GPU
    kv_bytes_per_token_per_rank: int  # what each of the tp ranks stores
    clean_split_kv_bytes_per_token: float  # kv_bytes_per_token / tp: what a split without copies would give


def part0_tensor_parallel_kv(model: str, tp: int, kv_dtype: str = "auto") -> TensorParallelKV:
    """How tensor parallelism divides a model's heads and KV bytes, against a clean 1/tp split.

    Query heads always split evenly; KV heads stop splitting at one per rank (then they are
    copied) and an MLA latent never splits, which is why the per-rank bytes can exceed 1/tp.
    """
    spec = get_model(model)
    formula.check_tensor_parallel(spec, tp)
    whole = formula.kv_bytes_per_token(spec, kv_dtype)
    return TensorParallelKV(
        model=model, tp=tp, query_heads_per_rank=spec.n_heads // tp,
        kv_heads_per_rank=formula.kv_heads_per_rank(spec, tp), kv_head_replicas=formula.kv_head_replicas(spec, tp),
        kv_bytes_per_token=whole, kv_bytes_per_token_per_rank=formula.kv_bytes_per_token(spec, kv_dtype, tp),
        clean_split_kv_bytes_per_token=whole / tp)


@dataclass(frozen=True)
class MemoryHierarchy:
    model: str
    gpu: str
    versus_gpu: str
    weight_bytes: float  # matrix weights one decode step reads (the cost model counts bytes as floats)
    l2_bytes: float  # the whitepaper's L2, decimal MB
    weights_over_l2: float
    register_file_bytes: int  # all SMs together
    shared_memory_bytes_per_s: float  # all SMs together, at the GPU's sm_clock_mhz
    hbm_bytes_per_s: float  # datasheet
    shared_over_hbm: float
    bandwidth_ratio: float  # gpu's datasheet HBM bandwidth over versus_gpu's
    kv_bytes_per_token: int
    l2_kv_tokens: float  # tokens of KV cache the L2 would hold


def part0_memory_hierarchy(model: str = "llama-3.1-8b", gpu: str = "h200",
                           versus_gpu: str = "h100-sxm") -> MemoryHierarchy:
    """How the on-chip tiers compare with HBM and with one model's weights and KV cache.

    Shared-memory bandwidth is not in any datasheet: it is derived from the bank width and the
    SM clock (labs/data/gpus.yaml `sm_clock_mhz`, recorded only for GPUs the labs ran on).
    """
    deployment = roofline.deployment(model, gpu)
    gpu_spec, versus = deployment.gpu, get_gpu(versus_gpu)
    if gpu_spec.l2_mb is None:
        raise SpecError(f"{gpu}: labs/data/gpus.yaml has no l2_mb")
    if gpu_spec.sm_clock_mhz is None:
        raise SpecError(f"{gpu}: labs/data/gpus.yaml has no sm_clock_mhz")
    weights = deployment.decode(1, 0).weight_bytes
    l2 = gpu_spec.l2_mb * 1e6
    hbm = roofline.bandwidth(gpu_spec).bytes_per_s
    shared = gpu_spec.sm_count * SHARED_MEMORY_BANKS * SHARED_MEMORY_BANK_BYTES * gpu_spec.sm_clock_mhz * 1e6
    kv = deployment.kv_bytes_per_token()
    return MemoryHierarchy(
        model=model, gpu=gpu, versus_gpu=versus_gpu, weight_bytes=weights, l2_bytes=l2, weights_over_l2=weights / l2,
        register_file_bytes=gpu_spec.sm_count * REGISTERS_PER_SM * REGISTER_BYTES,
        shared_memory_bytes_per_s=shared, hbm_bytes_per_s=hbm, shared_over_hbm=shared / hbm,
        bandwidth_ratio=hbm / roofline.bandwidth(versus).bytes_per_s, kv_bytes_per_token=kv, l2_kv_tokens=l2 / kv)


@dataclass(frozen=True)
class RequestsPerGPU:
    model: str
    versus_model: str
    gpu: str
    max_model_len: int
    tp: int
    versus_tp: int
    requests: float  # max concurrency of the whole deployment (vLLM's startup figure)
    versus_requests: float
    requests_per_gpu: float
    versus_requests_per_gpu: float
    ratio_per_gpu: float  # requests_per_gpu / versus_requests_per_gpu


def part0_requests_per_gpu(model: str, versus_model: str, gpu: str = "h200", max_model_len: int = 8192,
                           tp: int = 1, versus_tp: int = 1) -> RequestsPerGPU:
    """Requests per GPU of two deployments that use different GPU counts, the fair way to compare their ceilings."""
    pool = roofline.deployment(model, gpu, tp=tp).kv_pool(max_model_len)
    versus = roofline.deployment(versus_model, gpu, tp=versus_tp).kv_pool(max_model_len)
    if not pool.max_concurrency > 0 or not versus.max_concurrency > 0:
        raise SpecError(f"{model} at TP {tp} or {versus_model} at TP {versus_tp} holds no "
                        f"{max_model_len}-token request on {gpu}")
    per_gpu, versus_per_gpu = pool.max_concurrency / tp, versus.max_concurrency / versus_tp
    return RequestsPerGPU(
        model=model, versus_model=versus_model, gpu=gpu, max_model_len=max_model_len, tp=tp, versus_tp=versus_tp,
        requests=pool.max_concurrency, versus_requests=versus.max_concurrency, requests_per_gpu=per_gpu,
        versus_requests_per_gpu=versus_per_gpu, ratio_per_gpu=per_gpu / versus_per_gpu)


EXAMPLES = [part0_tokens_in_memory, part0_mla_saving, part0_kv_head_variants, part0_tensor_parallel_kv,
            part0_memory_hierarchy, part0_requests_per_gpu]
