"""Attention for a whole mixed step in one launch: every chunk (prefill chunk or decode) reads its keys from the paged cache.

Why: a step that mixes prefill chunks and decodes used to call SDPA once per prefill chunk,
after gathering that chunk's context out of the cache, and the paged decode kernel once for
the decodes. At 64 running sequences with a few prompts being admitted, that is tens of
launches and copies per layer, thousands per step, and the step waits on the CPU. Here the
step's chunks are one packed batch of T query tokens (as the model already sees them),
described by

* q_start (n + 1,): where chunk c's queries start in the packed batch (a cumulative sum),
* ctx_start (n,): the position of chunk c's first query token (tokens already cached before it),
* block_tables (n, max_blocks): chunk c's block table, and
* tiles (n_tiles, 2): (chunk, first query of the tile) for every tile of BLOCK_Q queries,
  built on the host from the chunk sizes it already knows.

Query token i of chunk c sits at position ctx_start[c] + i and attends to keys 0 .. that
position, all of them read through the block table (the chunk's own keys were written
into the cache first, by `fused.rope_and_cache`). A decode is a chunk of one token.

The layout of a program follows vLLM's Triton "unified attention" kernel (the design, not
its code): one program per (tile, KV head), whose matrix rows are BLOCK_Q query tokens
times the G query heads that share the KV head, so each K/V tile is read once for the whole
group. The loop over key tiles is FlashAttention-2's online softmax (Dao 2023,
https://arxiv.org/abs/2307.08691v1) with base-2 exponents, and it stops at the tile's last
query position: causal masking skips the upper triangle.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

ROWS = 64  # matrix rows per program: BLOCK_Q query tokens x the padded GQA group
BLOCK_N = 64  # keys per inner step


@triton.jit(do_not_specialize=["stride_tab", "group"])  # one compile whatever the table width
def _varlen_kernel(q_ptr, kc_ptr, vc_ptr, out_ptr, tables_ptr, q_start_ptr, ctx_start_ptr, tiles_ptr,
                   scale_log2, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_tab,
                   stride_ot, stride_oh, group,
                   BLOCK_SIZE: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr,
                   BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    c = tl.load(tiles_ptr + 2 * tile)
    t0 = tl.load(tiles_ptr + 2 * tile + 1)
    qs = tl.load(q_start_ptr + c)
    n_q = tl.load(q_start_ptr + c + 1) - qs
    start = tl.load(ctx_start_ptr + c)

    rows = tl.arange(0, BLOCK_Q * G_PAD)
    tok = t0 + rows // G_PAD  # query index within the chunk
    g = rows % G_PAD
    row_ok = (tok < n_q) & (g < group)
    head = kvh * group + g
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    q_rows = (qs + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q_pos = start + tok

    m = tl.full([BLOCK_Q * G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_Q * G_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * G_PAD, D_PAD], tl.float32)
    last_pos = start + tl.minimum(t0 + BLOCK_Q, n_q) - 1  # the tile's last query sees keys 0 .. last_pos
    table = tables_ptr + c.to(tl.int64) * stride_tab
    for k0 in range(0, last_pos + 1, BLOCK_N):
        pos = k0 + tl.arange(0, BLOCK_N)
        pos_ok = pos <= last_pos
        blk = tl.load(table + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        kv_off = blk * stride_kb + (pos % BLOCK_SIZE) * stride_kt + kvh * stride_kh
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(kc_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(vc_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        s = tl.where((pos[None, :] <= q_pos[:, None]) & pos_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing yet (padding rows)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def block_q(num_q_heads: int, num_kv_heads: int) -> int:
    """Query tokens per tile: ROWS over the padded group, at least 1."""
    g_pad = triton.next_power_of_2(num_q_heads // num_kv_heads)
    return max(1, ROWS // g_pad)


def tile_list(chunk_sizes: list[int], bq: int) -> list[int]:
    """(chunk, first query) of every tile, flattened: the kernel's grid, built on the host."""
    out = []
    for c, n in enumerate(chunk_sizes):
        for t0 in range(0, n, bq):
            out += (c, t0)
    return out


# --8<-- [start:launcher]
def varlen_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                           q_start: torch.Tensor, ctx_start: torch.Tensor, tiles: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """(T, Hq, d) causal attention of packed chunks over their cached keys (module docstring).

    q: (T, Hq, d); k_cache, v_cache: (num_blocks, block_size, Hkv, d) in q's dtype;
    block_tables: (n, max_blocks) int32; q_start (n + 1,), ctx_start (n,), tiles
    (n_tiles, 2) int32, tiles from `tile_list` with `block_q(Hq, Hkv)`.
    """
    t, n_heads, d = q.shape
    _, bs, n_kv, d_cache = k_cache.shape
    if d_cache != d or n_heads % n_kv or k_cache.dtype != q.dtype or v_cache.shape != k_cache.shape:
        raise ValueError(f"q {tuple(q.shape)} {q.dtype} does not fit the cache {tuple(k_cache.shape)} {k_cache.dtype}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share strides, and q and the caches be contiguous along head_dim")
    for name, x in (("block_tables", block_tables), ("q_start", q_start), ("ctx_start", ctx_start), ("tiles", tiles)):
        if x.dtype != torch.int32 or not x.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 tensor, got {x.dtype}")
    out = torch.empty_like(q)
    n_tiles = tiles.shape[0]
    if t == 0 or n_tiles == 0:
        return out
    if q.device.type == "cpu":
        from labs.paged_attention.interpreter_compat import patch_interpreter_index

        patch_interpreter_index()
    group = n_heads // n_kv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    _varlen_kernel[(n_tiles, n_kv)](
        q, k_cache, v_cache, out, block_tables, q_start, ctx_start, tiles, scale * math.log2(math.e),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), group,
        BLOCK_SIZE=bs, D=d, D_PAD=triton.next_power_of_2(max(d, 16)), G_PAD=triton.next_power_of_2(group),
        BLOCK_Q=block_q(n_heads, n_kv), BLOCK_N=BLOCK_N,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=2)
    return out
# --8<-- [end:launcher]
