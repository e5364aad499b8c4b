"""Build decode problems on a paged KV cache, the way a serving engine would leave it.

Both the tests and the benchmark use `make_problem`, so the benchmark times the same
kind of cache the tests check: blocks in random physical order (the free list after
churn), optional prefix blocks shared between sequences, and every slot no sequence
owns, the null block included, filled with NaN.

With kv_dtype=float8_e4m3fn the cache is quantised on write with calibrated per-tensor
scales (amax / 448 of the K and of the V values written). The same seed draws the same
values whatever the cache dtype, so an fp8 problem and a bf16 problem built with one
seed hold the same data, one of them rounded to e4m3.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from labs.paged_attention.cache import BlockAllocator, BlockTables, PagedKVCache, fp8_scale


@dataclass
class DecodeProblem:
    q: torch.Tensor  # (B, Hq, d)
    k_cache: torch.Tensor  # (num_blocks, block_size, Hkv, d)
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # (B, max_blocks) int32, padded with the null block
    seq_lens: torch.Tensor  # (B,) int32
    lens: list[int]
    shared_blocks: int  # blocks each forked sequence shares with sequence 0
    k_scale: torch.Tensor | None = None  # () fp32, for an fp8 cache
    v_scale: torch.Tensor | None = None
    v_layout: str = "token"  # the V pool's order (cache.V_LAYOUTS)

    def kernel_kwargs(self) -> dict:
        """The scales (fp8) and the V layout (when not K's) to pass `paged_decode` and the reference."""
        kw = {} if self.k_scale is None else {"k_scale": self.k_scale, "v_scale": self.v_scale}
        return kw if self.v_layout == "token" else {**kw, "v_layout": self.v_layout}

    @property
    def max_seq_len(self) -> int:
        return max(self.lens)

    def kv_bytes(self) -> int:
        """Bytes of K and V the kernel must read (at the cache's dtype): shared blocks count once per sequence."""
        _, _, hkv, d = self.k_cache.shape
        return 2 * sum(self.lens) * hkv * d * self.k_cache.element_size()


def scrambled_allocator(num_blocks: int, rng: random.Random) -> BlockAllocator:
    """An allocator whose free list is in random order, as after many sequences came and went."""
    allocator = BlockAllocator(num_blocks)
    blocks = allocator.allocate(allocator.num_free)
    rng.shuffle(blocks)
    allocator.free(blocks)
    return allocator


def make_problem(
    lens: Sequence[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    shared_prefix_blocks: int = 0,
    spare_blocks: int = 3,
    fill: float = float("nan"),
    seed: int = 0,
    kv_dtype: torch.dtype | None = None,
    v_layout: str = "token",
) -> DecodeProblem:
    """A batch of sequences with `lens` cached tokens each and one query token each.

    With shared_prefix_blocks = k > 0, every sequence longer than k blocks (other than
    sequence 0, which must be at least k blocks long) starts with sequence 0's first k
    blocks, by reference count, as prefix caching would leave them. dtype is the
    queries'; kv_dtype the cache's (default: dtype). v_layout: the V pool's order
    ("token", vLLM's, or "dim"; cache.py). "dim" is opt-in: on the H200 with Triton 3.6 it
    made the fp8 kernel slower, not faster (NOTES.md, v4).
    """
    if any(n < 1 for n in lens):
        raise ValueError(f"every sequence needs at least 1 cached token, got lens={list(lens)}")
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)  # on the device: GBs of K/V at bench sizes
    prefix_tokens = shared_prefix_blocks * block_size
    if shared_prefix_blocks and lens[0] < prefix_tokens:
        raise ValueError(f"sequence 0 has {lens[0]} tokens, fewer than the {prefix_tokens} it should share")

    needed = sum(-(-n // block_size) for n in lens)
    allocator = scrambled_allocator(needed + spare_blocks + 1, rng)
    tables = BlockTables(allocator, block_size)
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    cache = PagedKVCache(1, allocator.num_blocks, block_size, num_kv_heads, head_dim, kv_dtype, device, v_layout)
    cache.fill_(fill)

    shared = 0
    writes = []
    for seq, n in enumerate(lens):
        if seq > 0 and shared_prefix_blocks and n > prefix_tokens:
            tables.fork(0, seq, prefix_tokens)
            slots = tables.append(seq, n - prefix_tokens)
            shared = shared_prefix_blocks
        else:
            slots = tables.append(seq, n)
        shape = (len(slots), num_kv_heads, head_dim)
        k = torch.randn(shape, generator=gen, device=device)
        v = torch.randn(shape, generator=gen, device=device)
        writes.append((slots, k, v))
    if cache.is_fp8:  # calibrate on everything written, as a checkpoint's scales would be
        cache.set_scales(0, max(fp8_scale(k) for _, k, _ in writes), max(fp8_scale(v) for _, _, v in writes))
    for slots, k, v in writes:
        cache.write(0, slots, k, v)
    del writes

    rows, seq_lens = tables.padded(range(len(lens)))
    q = torch.randn((len(lens), num_q_heads, head_dim), generator=gen, device=device).to(dtype)
    return DecodeProblem(
        q=q,
        k_cache=cache.k[0],
        v_cache=cache.v[0],
        block_tables=torch.tensor(rows, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        lens=list(lens),
        shared_blocks=shared,
        k_scale=cache.k_scale[0] if cache.is_fp8 else None,
        v_scale=cache.v_scale[0] if cache.is_fp8 else None,
        v_layout=v_layout,
    )
