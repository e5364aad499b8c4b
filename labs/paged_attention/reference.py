"""The slow, obvious reference for paged decode attention: gather, then attend in fp32.

It copies each sequence's blocks out of the pool by indexing with its block table (no
slot arithmetic), so it shares no addressing code with the kernel: a bug in one is
unlikely to be repeated in the other.
"""

from __future__ import annotations

import math

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's keys (or values) as a contiguous (seq_len, num_kv_heads, head_dim) tensor."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = cache[block_table[:num_blocks].long()]  # (num_blocks, block_size, Hkv, d), a copy
    return blocks.flatten(0, 1)[:seq_len]


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    v_layout: str = "token",
) -> torch.Tensor:
    """softmax(q K^T * scale) V per sequence, in fp32; returns (batch, num_q_heads, head_dim) fp32.

    q: (batch, num_q_heads, head_dim); k_cache, v_cache: (num_blocks, block_size,
    num_kv_heads, head_dim); block_tables: (batch, max_blocks); seq_lens: (batch,).
    Query head h reads KV head h // (num_q_heads // num_kv_heads). For an fp8 cache,
    k_scale and v_scale dequantise first (real = stored * scale, in fp32), then the same
    fp32 attention runs: the reference for the kernel's own error, apart from the
    quantisation's. v_layout: the V pool's order (`cache.V_LAYOUTS`); "dim" is viewed
    token by token first, by a permute, not by the kernel's strides.
    """
    from labs.paged_attention.cache import v_by_token

    v_cache = v_by_token(v_cache, v_layout)
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.empty(batch, num_q_heads, head_dim, dtype=torch.float32, device=q.device)
    for b in range(batch):
        n = int(seq_lens[b])
        if n == 0:  # no keys: the kernel's convention is a zero row
            out[b] = 0
            continue
        k = gather_kv(k_cache, block_tables[b], n).float()  # (n, Hkv, d)
        v = gather_kv(v_cache, block_tables[b], n).float()
        if k_scale is not None:
            k = k * (k_scale.float() if torch.is_tensor(k_scale) else k_scale)
        if v_scale is not None:
            v = v * (v_scale.float() if torch.is_tensor(v_scale) else v_scale)
        # Expanding K and V per query head is fine here: this is the slow reference.
        k = k.repeat_interleave(group, dim=1)  # (n, Hq, d)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)
    return out
