"""KV-cache bytes, per token and per block, as vLLM 0.33 (V1 engine) counts them.

No torch here: the site renders these numbers at build time.

Notation (the site's glossary): n_layers, H_kv (KV heads), d (head dim),
b (bytes per element of the KV-cache dtype), B_s (block size, tokens).

* Standard attention (MHA / GQA / MQA): one layer stores a K and a V vector per
  KV head per token, so one layer costs ``2 * H_kv * d * b`` bytes per token and
  one block of one layer (vLLM's "page") costs ``B_s`` times that
  (``AttentionSpec.page_size_bytes`` in vllm/v1/kv_cache_interface.py).
* MLA (DeepSeek-V2/V3): one layer stores one latent of
  ``kv_lora_rank + qk_rope_head_dim`` elements per token, with no separate V
  (``MLAAttentionSpec``: num_kv_heads=1, head_size=576, head_size_v=0). The
  latent is not split over tensor-parallel ranks (``max_tp_shards=1`` in
  vllm/model_executor/layers/attention/mla_attention.py): every rank holds it all.
* Sliding-window layers (Gemma 2/3): with the hybrid KV-cache manager (on by
  default on CUDA: vllm/config/vllm.py) a sliding layer is a
  ``SlidingWindowSpec`` whose request never holds more than
  ``cdiv(min(W - 1 + in_flight, L), B_s) + 1`` blocks
  (``SlidingWindowSpec.max_admission_blocks_per_request``). Layers are grouped
  by kind into KV-cache groups of equal size
  (vllm/v1/core/kv_cache_planning.py ``_get_kv_cache_groups_uniform_page_size``);
  every group draws same-sized blocks from one shared pool, and a block costs
  ``group_size * page`` bytes (``_get_kv_cache_bytes_per_block``). So a token
  past the window costs only the full-attention groups' bytes.

Tensor parallelism: vLLM splits KV heads over TP ranks; when TP exceeds H_kv
each rank keeps one KV head and ``TP / H_kv`` ranks hold copies of it
(vllm/model_executor/layers/linear.py ``QKVParallelLinear``: num_kv_heads = 1,
num_kv_head_replicas = tp / total_num_kv_heads). TP must divide the query heads
and either divide H_kv or be a multiple of it.

The fp8 KV dtypes here are the per-tensor-scaled ones (``fp8``, ``fp8_e4m3``,
``fp8_e5m2``): one byte per element, scales outside the cache. The packed
formats (``fp8_ds_mla``, nvfp4, turboquant...) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import vllm_facts
from labs.specs import ModelSpec, SpecError

# --kv-cache-dtype values (vllm/config/cache.py CacheDType) modelled here, with
# the bytes per element vLLM stores (vllm/utils/torch_utils.py
# STR_DTYPE_TO_TORCH_DTYPE maps the fp8 ones to torch.uint8).
KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
KV_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}
KV_DTYPES = ("auto", *KV_DTYPE_BYTES, *KV_DTYPE_ALIASES)

# vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE. The attention backend can
# raise it (platforms/interface.py _preferred_block_size_for_backends). For MLA on
# Hopper, vllm/platforms/cuda.py tries FLASH_ATTN_MLA first: it takes any multiple
# of 16 but only a 16-bit cache, so a bf16 cache keeps 16-token blocks. An fp8 cache
# falls through to FLASHMLA, which runs only 64-token blocks.
DEFAULT_BLOCK_SIZE = vllm_facts.resolved_default("block_size")  # 16, from labs/data/vllm.yaml
MLA_FP8_BLOCK_SIZE = 64  # vllm/v1/attention/backends/mla/flashmla.py get_supported_kernel_block_sizes


def default_block_size(model: ModelSpec, kv_dtype: str = "auto") -> int:
    """The block size vLLM 0.33 picks on Hopper when --block-size is not given."""
    if model.mla is not None and KV_DTYPE_BYTES.get(resolve_kv_dtype(model, kv_dtype)) == 1:
        return MLA_FP8_BLOCK_SIZE
    return DEFAULT_BLOCK_SIZE


def resolve_kv_dtype(model: ModelSpec, kv_dtype: str = "auto") -> str:
    """The KV-cache dtype name after 'auto' and aliases: 'auto' is the model's serving dtype."""
    name = KV_DTYPE_ALIASES.get(kv_dtype, kv_dtype)
    if name == "auto":
        return model.serving_dtype
    if name not in KV_DTYPE_BYTES:
        raise SpecError(f"unsupported kv cache dtype {kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
    return name


def kv_itemsize(model: ModelSpec, kv_dtype: str = "auto") -> int:
    """Bytes per cached element."""
    name = resolve_kv_dtype(model, kv_dtype)
    if name not in KV_DTYPE_BYTES:  # 'auto' on a float32-serving model cannot happen; guard anyway
        raise SpecError(f"model dtype {name!r} has no KV-cache size here")
    return KV_DTYPE_BYTES[name]


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """Raise unless vLLM 0.33 can shard this model's attention over `tp` ranks."""
    if tp < 1:
        raise SpecError(f"tensor parallel size must be >= 1, got {tp}")
    if model.n_heads % tp:
        raise SpecError(f"{model.name}: {model.n_heads} query heads are not divisible by tensor parallel size {tp}")
    if model.mla is None and model.n_kv_heads % tp and tp % model.n_kv_heads:
        raise SpecError(
            f"{model.name}: tensor parallel size {tp} neither divides nor is a multiple of "
            f"{model.n_kv_heads} KV heads"
        )


def kv_heads_per_rank(model: ModelSpec, tp: int = 1) -> int:
    """KV heads one rank stores (MLA: one latent 'head', replicated on every rank)."""
    check_tensor_parallel(model, tp)
    if model.mla is not None:
        return 1
    return max(1, model.n_kv_heads // tp)


def kv_head_replicas(model: ModelSpec, tp: int = 1) -> int:
    """How many ranks hold a copy of each KV head (1 means no duplication)."""
    check_tensor_parallel(model, tp)
    if model.mla is not None:
        return tp
    return max(1, tp // model.n_kv_heads)


def layer_bytes_per_token(model: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes one layer caches for one token on one rank (vLLM's page size / block size)."""
    b = kv_itemsize(model, kv_dtype)
    if model.mla is not None:
        return model.mla.latent_dim * b
    return 2 * kv_heads_per_rank(model, tp) * model.head_dim * b


# ---------------------------------------------------------------------------
# KV-cache groups (hybrid models)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KVGroup:
    """One vLLM KV-cache group: `slots` layer slots of one kind, `layers` of them real."""

    kind: str  # "full" or "sliding"
    layers: int
    slots: int


def kv_cache_groups(model: ModelSpec) -> tuple[KVGroup, ...]:
    """The KV-cache groups vLLM 0.33 forms for this model.

    A model with one attention kind is one group of all its layers. A hybrid
    model is split per kind into groups of `group_size` layers
    (vllm/v1/core/kv_cache_planning.py `_get_kv_cache_groups_uniform_page_size`):
    group_size is the smallest kind's layer count, or the largest one's when the
    largest is under 1.5x the smallest; the last group of a kind is padded.
    """
    counts: dict[str, int] = {}
    for kind in model.layer_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    if len(counts) == 1:
        (kind, n), = counts.items()
        return (KVGroup(kind, n, n),)
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for kind, n in counts.items():
        n_groups = -(-n // group_size)
        for i in range(n_groups):
            real = len(range(i, n, n_groups))  # vLLM assigns layers[i::n_groups]
            groups.append(KVGroup(kind, real, group_size))
    return tuple(groups)


# ---------------------------------------------------------------------------
# The public numbers
# ---------------------------------------------------------------------------


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes of KV cache one more token of context costs, on one rank.

    For a model whose layers all attend fully this is
    ``n_layers * 2 * H_kv * d * b`` (Llama-3.1-8B, bf16: 32 * 2 * 8 * 128 * 2 =
    131,072 bytes). For MLA it is ``n_layers * (kv_lora_rank + qk_rope_head_dim) * b``.
    For a hybrid model it counts the full-attention groups only (padding slots
    included, since vLLM allocates them): past the window a sliding layer frees
    a block for each block it fills, so its cost is a per-sequence constant,
    counted by `kv_bytes_per_sequence`.
    """
    per_layer = layer_bytes_per_token(model, kv_dtype, tp)
    groups = kv_cache_groups(model)
    if not any(g.kind == "full" for g in groups):
        # Every layer slides (Mistral v0.1): nothing grows past the window, so
        # report what each token the cache keeps costs.
        return per_layer * model.n_layers
    return per_layer * sum(g.slots for g in groups if g.kind == "full")


def kv_bytes_per_token_all_layers(model: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes a token costs while it is inside every layer's window: every layer stores it."""
    return layer_bytes_per_token(model, kv_dtype, tp) * model.n_layers


def page_bytes(model: ModelSpec, block_size: int = DEFAULT_BLOCK_SIZE, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes of one block of one layer: vLLM's ``KVCacheSpec.page_size_bytes``."""
    if block_size < 1:
        raise SpecError(f"block size must be >= 1, got {block_size}")
    return block_size * layer_bytes_per_token(model, kv_dtype, tp)


def bytes_per_block(model: ModelSpec, block_size: int = DEFAULT_BLOCK_SIZE, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes one block id takes from the pool: the divisor vLLM turns memory into blocks with.

    vllm/v1/core/kv_cache_planning.py `_get_kv_cache_bytes_per_block`: the
    largest group's sum of page sizes. With one group (every layer alike) that
    is ``2 * n_layers * B_s * H_kv * d * b``; for a hybrid model it is
    ``group_size * page``.
    """
    return page_bytes(model, block_size, kv_dtype, tp) * max(g.slots for g in kv_cache_groups(model))


def blocks_per_request(
    model: ModelSpec,
    max_model_len: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_in_flight_tokens: int = 16384,
) -> int:
    """Blocks one request of `max_model_len` tokens needs, summed over groups.

    Mirrors vllm/v1/core/kv_cache_utils.py `get_max_concurrency_for_kv_cache_config`:
    each group needs cdiv(max_memory_usage_bytes, page_size_bytes) blocks, where
    a full layer needs cdiv(L, B_s) (FullAttentionSpec.max_memory_usage_bytes)
    and a sliding layer cdiv(min(W - 1 + in_flight, L), B_s) + 1. `in_flight` is
    vLLM's max_in_flight_tokens (vllm/config/vllm.py): max_num_batched_tokens
    times the concurrent batches, which is 2 with async scheduling (on by
    default in 0.33). The default 16384 is 2 x 8192, the OpenAI-server
    max_num_batched_tokens on an H100/H200.
    """
    if max_model_len < 1:
        raise SpecError(f"max model length must be >= 1, got {max_model_len}")
    total = 0
    for g in kv_cache_groups(model):
        if g.kind == "full":
            total += -(-max_model_len // block_size)
        else:
            window = model.sliding_window.window
            tokens = min(window - 1 + max_in_flight_tokens, max_model_len)
            total += -(-tokens // block_size) + 1
    return total


def kv_bytes_per_sequence(
    model: ModelSpec,
    max_model_len: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_dtype: str = "auto",
    tp: int = 1,
    max_in_flight_tokens: int = 16384,
) -> int:
    """Bytes one request of `max_model_len` tokens reserves on one rank, whole blocks included.

    This is the `needed_memory` of vLLM's startup check
    (kv_cache_planning.py `_max_memory_usage_bytes_from_groups`).
    """
    return blocks_per_request(model, max_model_len, block_size, max_in_flight_tokens) * bytes_per_block(
        model, block_size, kv_dtype, tp
    )
