"""A paged KV cache: a block allocator, per-sequence block tables, and the tensor pool.

PagedAttention (Kwon et al., SOSP 2023, https://arxiv.org/abs/2309.06180v1) stores each
sequence's keys and values in fixed-size blocks of `block_size` tokens. A per-sequence
block table maps logical block i (tokens i*block_size ... (i+1)*block_size - 1) to a
physical block anywhere in a pool. Memory is then wasted only in each sequence's last,
partly filled block, and blocks can be shared between sequences that share a prefix.

Three pieces, kept apart so each can be used alone:

* `BlockAllocator`: plain Python, no torch. A free list plus a reference count per
  block. The KV-sizing lab uses it to count blocks without touching a GPU.
* `BlockTables`: plain Python. Per-sequence block lists and lengths, the slot mapping
  for new tokens, and prefix sharing by reference count.
* `PagedKVCache`: the torch tensors, one K and one V pool per layer, and the write path.

Physical block 0 is a null block: the allocator never hands it out. Padding entries in
a block table are 0, and a kernel's masked load of a table entry falls back to 0, so any
address formed from a padding entry points into a block that holds no sequence's data.

Layout. Each layer's pool is two tensors, K and V, each shaped

    (num_blocks, block_size, num_kv_heads, head_dim)

so token slot `s = block_id * block_size + offset` is row `s` of the flat view
(num_blocks * block_size, num_kv_heads, head_dim). Why this order:

* The write path stores one new token as one contiguous run of
  num_kv_heads * head_dim elements (8 heads x 128 x 2 bytes = 2 KiB in bf16), indexed by
  its slot alone.
* The decode kernel works on one (sequence, KV head) pair. For each token it reads one
  contiguous row of head_dim elements: 256 bytes at head_dim 128 in bf16, two whole
  128-byte lines. Threads load 16-byte vectors along head_dim, so every byte of every
  line fetched is used; in bf16 the stride between rows does not cost bandwidth. In fp8 a
  row is 128 bytes, and one head's rows read by one program at a time came 10-15% below
  the DRAM rate of whole blocks, so the CUDA fp8 kernel has each program read every head of
  its tokens (NOTES.md, v9).
* vLLM 0.33 describes a layer's cache by a logical shape [blocks, KV heads, tokens,
  content] and lets each backend pick the physical order; with no preference the first
  choice is LBNHC, tokens before heads, which is this order (`vllm/v1/kv_cache_layout.py`,
  `_DEFAULT_LAYOUT_PREFERENCE` in `vllm/v1/attention/backends/utils.py`, v0.33.0).
  The other order, heads before tokens, makes one head's block a single 4 KiB run
  (useful to bulk-copy engines) but splits each token's write into num_kv_heads runs.

Bytes per block for a whole model: 2 * num_layers * block_size * num_kv_heads * head_dim
* itemsize (`PagedKVCache.bytes_per_block`).

FP8. A pool of dtype float8_e4m3fn (vLLM's `--kv-cache-dtype fp8` on NVIDIA GPUs) holds
value / scale, with one fp32 scale per layer for K and one for V. vLLM 0.33 keeps them
as the attention layer's `_k_scale` and `_v_scale` buffers, 1.0 unless the checkpoint
supplies scales (`set_default_quant_scales` in
`vllm/model_executor/layers/attention/attention.py`,
`BaseKVCacheMethod.process_weights_after_loading` in
`vllm/model_executor/layers/quantization/kv_cache.py`); its Triton cache writer divides by
the scale and lets the store round to fp8 (`vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`).
0.33 has no `calculate_kv_scales` path: the name survives only in a comment. Here
`fp8_scale` gives the calibrated scale amax / 448 (448 is e4m3's largest finite value),
and `write` clamps to +-448 before the cast, so an outlier saturates instead of
becoming NaN (e4m3fn has no infinity).

FP8 V layout. vLLM 0.33 stores an fp8 V pool in the same order as K, and so does this
pool by default. It can also store V the other way round, (num_blocks, num_kv_heads,
head_dim, block_size) (`v_layout="dim"`). Why one would: the decode kernel's second
product, P.V, reduces over tokens, and the matrix unit reads its V operand as runs along
that axis. With V stored token by token, Triton 3.6 transposed each 8-bit V tile in
shared memory one byte per load (sm_90's `ldmatrix` transposes only 16-bit elements),
which made the fp8 kernel bound by instruction issue (NOTES.md, v3). Stored by dimension,
the tile arrives in the operand's order and the byte loads are gone, yet on the H200 the
kernel took 350 us instead of 226 at (64, 4,096) (NOTES.md, v4). The kernel now converts a
token-order V tile to fp16 before transposing it (NOTES.md, v5), and the CUDA fp8 kernel
(fp8_decode.cu) transposes the 8-bit tile in registers (v6): both remove the byte loads
without a new layout, so the default stays vLLM's order, the one the CUDA kernel reads.
A token's write in the "dim" order is num_kv_heads x head_dim single-byte stores with a
stride of block_size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from labs import vllm_facts

if TYPE_CHECKING:  # torch is imported only where a tensor is made; see PagedKVCache.
    import torch

# Block sizes the kernel is built and tested for. vLLM's default is 16
# (CacheConfig.DEFAULT_BLOCK_SIZE in vllm/config/cache.py, v0.33.0).
SUPPORTED_BLOCK_SIZES = (1, 8, 16, 32)
DEFAULT_BLOCK_SIZE = vllm_facts.resolved_default("block_size")  # 16, from labs/data/vllm.yaml
NULL_BLOCK = 0
# Largest finite float8 e4m3fn value: stored values are clamped to +-FP8_MAX.
FP8_MAX = 448.0
# V pool orders: "token" like K, (blocks, block_size, heads, dim); "dim", (blocks, heads, dim, block_size).
V_LAYOUTS = ("token", "dim")


def v_by_token(v_pool: torch.Tensor, v_layout: str) -> torch.Tensor:
    """A V pool as a (num_blocks, block_size, num_kv_heads, head_dim) view, whatever its order."""
    if v_layout not in V_LAYOUTS:
        raise ValueError(f"v_layout must be one of {V_LAYOUTS}, got {v_layout!r}")
    return v_pool if v_layout == "token" else v_pool.permute(0, 3, 1, 2)


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than a request asked for."""


class BlockAllocator:
    """Hands out physical block ids from a free list and counts references to each.

    A block is free when its count is 0. `share` adds a reference (a second sequence
    that reuses a cached prefix block); `free` drops one and returns the block to the
    free list when the count reaches 0. Freed blocks go to the front of the list, so the
    block freed last is reused first, as vLLM does for blocks without a prefix-cache
    hash (`BlockPool.free_blocks` in `vllm/v1/core/block_pool.py`, v0.33.0).
    """

    def __init__(self, num_blocks: int):
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(
                f"num_blocks must be an int >= 2 (block {NULL_BLOCK} is the null block), "
                f"got {num_blocks!r}"
            )
        self.num_blocks = num_blocks
        self._refcount = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_usable(self) -> int:
        """Blocks that can ever be handed out: all but the null block."""
        return self.num_blocks - 1

    def refcount(self, block_id: int) -> int:
        self._check_id(block_id)
        return self._refcount[block_id]

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks off the free list, each with a reference count of 1."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise OutOfBlocksError(
                f"asked for {n} blocks but only {len(self._free)} are free "
                f"(pool of {self.num_blocks}, block {NULL_BLOCK} reserved as the null block)"
            )
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._refcount[b] = 1
        return blocks

    def share(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block; every block must already be in use."""
        for b in block_ids:
            self._check_id(b)
            if self._refcount[b] == 0:
                raise ValueError(f"cannot share block {b}: it is free")
            self._refcount[b] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0 is free again."""
        for b in block_ids:
            self._check_id(b)
            if self._refcount[b] == 0:
                raise ValueError(f"block {b} is already free (double free)")
            self._refcount[b] -= 1
            if self._refcount[b] == 0:
                self._free.appendleft(b)

    def _check_id(self, block_id: int) -> None:
        if block_id == NULL_BLOCK:
            raise ValueError(f"block {NULL_BLOCK} is the null block; it is never allocated")
        if not 0 < block_id < self.num_blocks:
            raise ValueError(f"block id {block_id} is outside the pool [1, {self.num_blocks})")


class BlockTables:
    """Per-sequence block tables and lengths on top of a `BlockAllocator`.

    Only whole blocks are shared (`fork`), as prefix caching shares only full blocks.
    A sequence's next token therefore always lands in a block it owns alone, and no
    copy-on-write is needed.
    """

    def __init__(self, allocator: BlockAllocator, block_size: int = DEFAULT_BLOCK_SIZE):
        if block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {block_size}")
        self.allocator = allocator
        self.block_size = block_size
        self._blocks: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}

    def blocks(self, seq_id: int) -> list[int]:
        return list(self._blocks[seq_id])

    def seq_len(self, seq_id: int) -> int:
        return self._lens[seq_id]

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def append(self, seq_id: int, num_tokens: int) -> list[int]:
        """Extend a sequence (new or existing) by `num_tokens` and return their slots.

        Slot = block_id * block_size + offset, the row the write path stores the token
        in. Blocks are allocated before any state changes, so an `OutOfBlocksError`
        leaves the tables as they were.
        """
        blocks = self._blocks.get(seq_id, [])
        old_len = self._lens.get(seq_id, 0)
        new_len = old_len + num_tokens
        new_blocks = self.allocator.allocate(self.blocks_needed(new_len) - len(blocks))
        blocks = blocks + new_blocks
        self._blocks[seq_id] = blocks
        self._lens[seq_id] = new_len
        bs = self.block_size
        return [blocks[t // bs] * bs + t % bs for t in range(old_len, new_len)]

    def fork(self, src_id: int, dst_id: int, num_tokens: int) -> None:
        """Start sequence `dst_id` with the first `num_tokens` of `src_id`, sharing blocks.

        `num_tokens` must be a whole number of blocks (prefix caching shares full blocks).
        """
        if dst_id in self._blocks:
            raise ValueError(f"sequence {dst_id} already exists")
        if num_tokens % self.block_size:
            raise ValueError(
                f"can share only whole blocks: {num_tokens} tokens is not a multiple of "
                f"block_size {self.block_size}"
            )
        if num_tokens > self._lens[src_id]:
            raise ValueError(f"sequence {src_id} has {self._lens[src_id]} tokens, fewer than {num_tokens}")
        shared = self._blocks[src_id][: num_tokens // self.block_size]
        self.allocator.share(shared)
        self._blocks[dst_id] = list(shared)
        self._lens[dst_id] = num_tokens

    def free(self, seq_id: int) -> None:
        """Release a finished sequence; shared blocks stay until their last user frees them."""
        self.allocator.free(self._blocks.pop(seq_id))
        del self._lens[seq_id]

    def padded(self, seq_ids: Sequence[int]) -> tuple[list[list[int]], list[int]]:
        """Block tables as equal-length rows, padded with the null block, plus the lengths."""
        width = max((len(self._blocks[s]) for s in seq_ids), default=0)
        rows = [self._blocks[s] + [NULL_BLOCK] * (width - len(self._blocks[s])) for s in seq_ids]
        return rows, [self._lens[s] for s in seq_ids]


class PagedKVCache:
    """The tensor pool: per layer, K and V shaped (num_blocks, block_size, num_kv_heads, head_dim).

    With v_layout="dim", V is (num_blocks, num_kv_heads, head_dim, block_size) instead.

    `torch.empty` is used on purpose: a real pool is never zeroed, and the tests fill it
    with NaN to prove that the kernel reads only slots the block tables point to.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        v_layout: str = "token",
    ):
        import torch

        if block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {block_size}")
        if v_layout not in V_LAYOUTS:
            raise ValueError(f"v_layout must be one of {V_LAYOUTS}, got {v_layout!r}")
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        v_shape = shape if v_layout == "token" else (num_blocks, num_kv_heads, head_dim, block_size)
        self.v_layout = v_layout
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(v_shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # Per-layer fp32 scales, on the device like vLLM's layer._k_scale / _v_scale: the
        # kernel reads them there, so a captured graph sees new values. 1.0 = not calibrated.
        self.k_scale = [torch.ones((), dtype=torch.float32, device=device) for _ in range(num_layers)]
        self.v_scale = [torch.ones((), dtype=torch.float32, device=device) for _ in range(num_layers)]

    @property
    def is_fp8(self) -> bool:
        import torch

        return self.dtype == torch.float8_e4m3fn

    def set_scales(self, layer: int, k_scale: float, v_scale: float) -> None:
        """Set one layer's scales (real value = stored value * scale), before writing to it."""
        if not self.is_fp8:
            raise ValueError(f"scales apply only to an fp8 cache; this one is {self.dtype}")
        if not (k_scale > 0 and v_scale > 0):
            raise ValueError(f"scales must be > 0, got k_scale={k_scale}, v_scale={v_scale}")
        self.k_scale[layer].fill_(k_scale)
        self.v_scale[layer].fill_(v_scale)

    @property
    def bytes_per_block(self) -> int:
        """2 (K and V) * layers * block_size * kv_heads * head_dim * itemsize."""
        itemsize = self.k[0].element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * itemsize

    def fill_(self, value: float) -> None:
        for t in (*self.k, *self.v):
            t.fill_(value)

    def write(self, layer: int, slots: torch.Tensor | Sequence[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' keys and values, each (num_tokens, num_kv_heads, head_dim), at their slots."""
        import torch

        kc, vc = self.k[layer], self.v[layer]
        slots = torch.as_tensor(slots, dtype=torch.long, device=kc.device)
        expected = (slots.numel(), self.num_kv_heads, self.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(f"k and v must be {expected} for {slots.numel()} slots, got {tuple(k.shape)}, {tuple(v.shape)}")
        if self.is_fp8:  # quantise on write: divide by the scale, saturate, round to e4m3
            k = (k.float() / self.k_scale[layer]).clamp(-FP8_MAX, FP8_MAX)
            v = (v.float() / self.v_scale[layer]).clamp(-FP8_MAX, FP8_MAX)
        # The flat view is a view, not a copy: indexing by slot writes into the pool.
        kc.view(-1, self.num_kv_heads, self.head_dim)[slots] = k.to(kc.dtype)
        if self.v_layout == "token":
            vc.view(-1, self.num_kv_heads, self.head_dim)[slots] = v.to(vc.dtype)
        else:  # (block, :, :, offset) for each token: index dims come first, so this is (n, Hkv, d)
            vc[slots // self.block_size, :, :, slots % self.block_size] = v.to(vc.dtype)


def fp8_scale(x: torch.Tensor) -> float:
    """The per-tensor scale that maps x's largest magnitude to FP8_MAX (a calibrated scale)."""
    amax = float(x.abs().max())
    return amax / FP8_MAX if amax > 0 else 1.0
