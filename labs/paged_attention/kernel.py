"""PagedAttention decode in Triton: one query token per sequence, KV read through block tables.

Maths. For sequence b and query head h, with n = seq_lens[b] cached tokens,

    out[b, h] = softmax(q[b, h] . K_b^T * scale) V_b

where K_b, V_b (n, head_dim) are gathered from the paged pool through block_tables[b]
(see `cache.py` for the layout). Shapes: q, out (B, Hq, d); k_cache, v_cache
(num_blocks, BLOCK_SIZE, Hkv, d); block_tables (B, max_blocks) int32; seq_lens (B,) int32.
The cache is bf16/fp16/fp32 like q, or float8 e4m3 with one fp32 scale per tensor for K
and one for V (stored value = real value / scale, as vLLM 0.33 stores an fp8 cache).

Designs this follows (the code is written for this lab, not adapted):

* PagedAttention, Kwon et al. 2023, https://arxiv.org/abs/2309.06180v1: KV in fixed-size
  blocks, addressed through a per-sequence block table.
* Online softmax, Milakov and Gimelshein 2018, https://arxiv.org/abs/1805.02867v2, in
  the FlashAttention-2 form (rescale the accumulator, divide once at the end), Dao 2023,
  https://arxiv.org/abs/2307.08691v1. Exponents are base 2: the scale carries log2(e).
* Flash-Decoding, Dao, Haziza, Massa and Sizov, 2023-10-12,
  https://crfm.stanford.edu/2023/10/12/flashdecoding.html: split each sequence's keys
  into chunks that run as separate programs, each writing a partial output and its
  log-sum-exp, then combine them in a second kernel.
* GQA heads as the rows of one matrix product, so a program reads a KV head once for all
  the query heads that share it, as vLLM's grouped Triton decode kernel does
  (`_fwd_grouped_kernel_stage1`, https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/ops/triton_decode_attention.py).

Ragged batches. A serving batch mixes 60-token and 60,000-token sequences. Splitting
every sequence the same number of ways (what the first version did, sized for the
longest) leaves the long sequences' few programs running alone at the end. Here each
sequence gets a split count proportional to its length, computed inside the kernels from
seq_lens (`_split_plan`): n_b = ceil(len_b * target / sum(lens)), at least 1, at most
one per tile. Every split then holds about sum(lens) / target tokens whatever its
sequence, and the sum of the n_b is at most target + B, so the grid size is known on the
host without reading seq_lens: the launcher never synchronises and can be captured in a
CUDA graph, and a replay with new lengths gets a new plan.

An fp8 cache on a CUDA GPU goes, where it can, to a second kernel written in CUDA C++
(`fp8_decode.cu`, launched from `fp8_decode.py`): same maths, same split plan, same
partials and the same reduction kernel as here, but it transposes the 8-bit V tile in
registers, which Triton 3.6 cannot be asked to do, and each of its programs serves several
KV heads, one warp each (`plan_geometry` tells the plan). `resolve_backend` picks.

Caution:

* `tl.dot` needs at least 16 rows, so a group of 4 query heads is padded to 16 and 75%
  of the matrix work is thrown away (94% at 1 head per group). That is cheap only while
  the kernel is bound by memory, which decode is: about 1 FLOP per byte of KV per head.
* Whether the gathered K/V loads are software-pipelined (cp.async) depends on Triton's
  pipeliner for the version in use; the tuning numbers below were measured with Triton
  3.6 on one H200 and may not carry to other versions or GPUs.
* RESIDENT_PROGRAMS was read off ncu for the default configuration; another tile size or
  GPU needs its own value.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import torch
import triton
import triton.language as tl

from labs.paged_attention import fp8_decode
from labs.paged_attention.cache import SUPPORTED_BLOCK_SIZES, V_LAYOUTS

# The fp8 cache format vLLM calls 'fp8' / 'fp8_e4m3' on NVIDIA GPUs.
FP8_DTYPE = torch.float8_e4m3fn

try:  # programmatic dependent launch (Hopper and later): lets the reduction start early
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: the flag below stays off
    gdc_launch_dependents = gdc_wait = None


# --8<-- [start:e4m3]
@triton.jit
def _e4m3_to_f16(x):
    """float8 e4m3 -> fp16, four values per 32-bit register, in the layout x was loaded in.

    For the V tile. Written as `v.to(tl.float16)`, Triton 3.6 moves the cast into the
    matrix unit's operand layout, where a register holds two tokens' values of one
    dimension: two rows of the tile. It then reads V from shared memory a byte at a time
    (64 `ld.shared.b8` per thread per 64-token tile). Here the tile is converted as it was
    loaded, 16 bytes of one token per thread, and transposed in 16 bits by `ldmatrix`, as a
    bf16 tile is. `is_pure=False` is what keeps the compiler from moving it; it also stops
    the compiler from reading past it when it picks the operand's width (NOTES.md, v5).
    Every e4m3 value is exact in fp16, so nothing is rounded.
    """
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b16 lo, hi;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        }""",
        constraints="=r,=r,r",
        args=[x],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )
# --8<-- [end:e4m3]


# --8<-- [start:plan]
@triton.jit
def _split_plan(seq_lens_ptr, batch, target_uniform, target_ragged, split_cap, B_PAD: tl.constexpr,
                TILE_N: tl.constexpr):
    """Every sequence's split count and where its splits end in the work list, with the
    batch's total length and whether all lengths are equal.

    Both kernels call this with the same arguments, so they agree on the plan without
    storing it. target_uniform applies when all lengths are equal (the host's wave
    arithmetic is exact then), target_ragged otherwise.
    """
    offs_b = tl.arange(0, B_PAD)
    in_batch = offs_b < batch
    lens = tl.load(seq_lens_ptr + offs_b, mask=in_batch, other=0)
    # int32 sums: the launcher checks that batch x table capacity stays under 2**31.
    total = tl.maximum(tl.sum(lens, axis=0), 1).to(tl.int64)
    uniform = tl.max(lens, axis=0) == tl.min(tl.where(in_batch, lens, 2147483647), axis=0)
    target = tl.where(uniform, target_uniform, target_ragged).to(tl.int64)
    tiles = tl.cdiv(lens, TILE_N)
    # Proportional to length; never more splits than tiles or split_cap, never fewer than
    # one (a length-0 sequence gets one empty split that writes zeros).
    n = tl.cdiv(lens.to(tl.int64) * target, total)
    n = tl.maximum(tl.minimum(tl.minimum(n, tiles.to(tl.int64)), split_cap), 1).to(tl.int32)
    n = tl.where(in_batch, n, 0)
    ends = tl.cumsum(n, axis=0)  # split `ends[b] - n[b]` is sequence b's first
    return offs_b, lens, tiles, n, ends, total, uniform


@triton.jit
def _chunked_rows(seq, offs_b, lens, tiles, total, batch, target, split_cap, TILE_N: tl.constexpr,
                  RANK_MAX: tl.constexpr):
    """Where sequence `seq`'s items sit in chunked_plan (unequal lengths, the CUDA kernel):
    (its item count, its first full chunk, its full chunks, its remainder's item). lens,
    tiles and total are _split_plan's."""
    in_batch = offs_b < batch
    chunk = (TILE_N * tl.maximum(tl.cdiv(total, target.to(tl.int64) * TILE_N), 1)).to(tl.int32)
    size = tl.maximum(chunk, TILE_N * tl.cdiv(tiles, split_cap))
    full = tl.where(in_batch, lens // size, 0)
    rest = lens - full * size
    rem = tl.where(in_batch & ((rest > 0) | (lens == 0)), rest, -1)  # -1: no remainder item
    pick = offs_b == seq
    full_seq = tl.sum(tl.where(pick, full, 0), axis=0)
    rem_seq = tl.sum(tl.where(pick, rem, 0), axis=0)
    first = tl.sum(tl.where(offs_b < seq, full, 0), axis=0)
    if batch <= RANK_MAX:
        ahead = (rem > rem_seq) | ((rem == rem_seq) & (offs_b < seq))
    else:
        ahead = (rem >= 0) & (offs_b < seq)
    rank = tl.sum(tl.where(ahead, 1, 0), axis=0)
    n_seq = full_seq + tl.where(rem_seq >= 0, 1, 0)
    return n_seq, first, full_seq, tl.sum(full, axis=0) + rank
# --8<-- [end:plan]


# --8<-- [start:kernel]
@triton.jit
def paged_decode_kernel(
    # Pointers
    q_ptr,  # (B, Hq, d)
    k_cache_ptr,  # (num_blocks, BLOCK_SIZE, Hkv, d)
    v_cache_ptr,  # like k_cache, or (num_blocks, Hkv, d, BLOCK_SIZE) when V_BY_DIM
    block_tables_ptr,  # (B, max_blocks) int32; padding entries are 0, the null block
    seq_lens_ptr,  # (B,) int32
    k_scale_ptr,  # () fp32, read when FP8: real K = stored K * k_scale
    v_scale_ptr,  # () fp32, read when FP8
    out_ptr,  # (B, Hq, d): written here for sequences with one split
    part_out_ptr,  # (max_items, Hq, D_PAD) fp32, one row per split of a split sequence
    part_lse_ptr,  # (max_items, Hq) fp32, log2-sum-exp of each split's scores
    # Sizes
    batch,
    group_size,  # query heads per KV head
    target_uniform,  # splits wanted in all, when all lengths are equal
    target_ragged,  # ... and otherwise
    split_cap,  # most splits any one sequence gets
    qk_scale,  # softmax scale * log2(e), so exp2 gives the softmax's exp
    # Strides: elements between neighbours along that axis (the last axis is contiguous)
    stride_qb,
    stride_qh,
    stride_cb,  # between physical blocks
    stride_ct,  # between tokens inside a block
    stride_ch,  # between KV heads
    stride_vb,  # the same four for v_cache, which may be stored in another order
    stride_vt,
    stride_vh,
    stride_vd,
    stride_tb,  # between block-table rows
    stride_ob,
    stride_oh,
    # Meta-parameters
    BLOCK_SIZE: tl.constexpr,  # tokens per KV block
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,  # HEAD_DIM rounded up to a power of 2 (tl.arange needs one)
    G_PAD: tl.constexpr,  # group_size rounded up to a power of 2, at least 16 (tl.dot's minimum)
    B_PAD: tl.constexpr,  # batch rounded up to a power of 2, for the split plan
    TILE_N: tl.constexpr,  # tokens per loop step, TILE_N // BLOCK_SIZE blocks when BLOCK_SIZE < TILE_N
    SPLIT: tl.constexpr,  # False: one program per (sequence, KV head), no plan, no partials
    FP8: tl.constexpr,  # the cache holds float8 e4m3 with per-tensor scales
    FP8_PTX: tl.constexpr,  # convert the V tile with inline PTX (the interpreter runs no PTX)
    V_BY_DIM: tl.constexpr,  # V tile loaded as (d, tokens), tokens contiguous, then transposed
    USE_GDC: tl.constexpr,  # let the reduction kernel launch while the last wave runs
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, so no tf32 rounding
):
    # KV head on axis 0, so the GPU hands out every head's first splits before any
    # item past the plan's end: the grid's empty tail runs last.
    kv_head = tl.program_id(0)
    item = tl.program_id(1)
    num_q_heads = tl.num_programs(0) * group_size
    if USE_GDC:
        gdc_launch_dependents()

    if SPLIT:
        offs_b, lens, tiles, n, ends, _, _ = _split_plan(seq_lens_ptr, batch, target_uniform, target_ragged,
                                                         split_cap, B_PAD, TILE_N)
        seq = tl.sum((ends <= item).to(tl.int32), axis=0)  # the sequence whose splits hold `item`
        if seq >= batch:
            return  # the grid is sized for the worst case; this item has no work
        pick = offs_b == seq
        seq_len = tl.sum(tl.where(pick, lens, 0), axis=0)
        n_seq = tl.sum(tl.where(pick, n, 0), axis=0)
        n_tiles = tl.sum(tl.where(pick, tiles, 0), axis=0)
        split = item - (tl.sum(tl.where(pick, ends, 0), axis=0) - n_seq)
        # Whole tiles per split, spread evenly: splits differ by at most one tile.
        start = (split * n_tiles // n_seq) * TILE_N
        end = tl.minimum(((split + 1) * n_tiles // n_seq) * TILE_N, seq_len)
        direct = n_seq == 1
    else:
        seq = item
        seq_len = tl.load(seq_lens_ptr + seq)
        start = 0
        end = seq_len
        direct = True

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, TILE_N)
    q_heads = kv_head * group_size + offs_g
    # Rows past the group are padding for tl.dot: loaded as 0, never stored.
    g_mask = offs_g < group_size
    # Columns past HEAD_DIM exist only when HEAD_DIM is not a power of 2; this mask is
    # all-true and folds away at compile time when it is.
    d_mask = offs_d < HEAD_DIM

    q = tl.load(
        q_ptr + seq * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if FP8:
        # The K scale multiplies every score: fold it into the softmax scale once.
        qk_scale = qk_scale * tl.load(k_scale_ptr)
        # The products run in fp16: e4m3 -> fp16 is one instruction per pair (bf16
        # would need a second conversion per element), and q in fp16 keeps more
        # mantissa than bf16 for any |q| < 65504.
        q = q.to(tl.float16)

    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)  # running max of scores (log2 units)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)  # running sum of p * V
    table_row = block_tables_ptr + seq * stride_tb
    head_off = kv_head * stride_ch

    for tile_start in range(start, end, TILE_N):
        tok = tile_start + offs_n
        # Tokens past this split's end (the tail of the last tile) are not loaded: their
        # slots may hold another sequence's data or NaN.
        t_mask = tok < end
        # Integer addressing: logical block tok // BLOCK_SIZE -> physical block from the
        # table, then slot offset tok % BLOCK_SIZE. Masked lanes get block 0, the null block.
        block = tl.load(table_row + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        row_off = block * stride_cb + (tok % BLOCK_SIZE) * stride_ct + head_off
        if HEAD_DIM == D_PAD:
            kv_mask = t_mask[:, None]  # a row mask only: nothing along d stands between 16-byte loads
        else:
            kv_mask = t_mask[:, None] & d_mask[None, :]
        kv_ptrs = row_off[:, None] + offs_d[None, :]  # (TILE_N, D_PAD), contiguous along d
        k = tl.load(k_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        if V_BY_DIM:
            # (D_PAD, blocks, tokens of a block), tokens contiguous: P.V's operand arrives in
            # the order the matrix unit reads it (along its reduction axis, the tokens), so no
            # 8-bit tile is transposed in shared memory (cache.py says why that costs). The
            # block ids are loaded once per block, and the mask is per block, so every row of
            # a block is one aligned run of BLOCK_SIZE elements the compiler loads as vectors
            # (first form, one block id per token: byte loads, 622 us; NOTES.md, v4).
            if BLOCK_SIZE <= TILE_N:
                blk_tok = tile_start + tl.arange(0, TILE_N // BLOCK_SIZE) * BLOCK_SIZE
                in_blk = tl.arange(0, BLOCK_SIZE)
            else:  # the whole tile lies in one block
                blk_tok = tile_start + tl.arange(0, 1)
                in_blk = tile_start % BLOCK_SIZE + tl.arange(0, TILE_N)
            blk_ok = blk_tok < end
            vblock = tl.load(table_row + blk_tok // BLOCK_SIZE, mask=blk_ok, other=0).to(tl.int64)
            v_off = (vblock * stride_vb + kv_head * stride_vh)[None, :, None] + in_blk[None, None, :] * stride_vt
            vt = tl.load(v_cache_ptr + v_off + offs_d[:, None, None] * stride_vd,
                         mask=blk_ok[None, :, None] & d_mask[:, None, None], other=0.0)
            v = tl.trans(tl.reshape(vt, (D_PAD, TILE_N)))
        else:
            v = tl.load(v_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        if FP8:
            # Every e4m3 value is exact in fp16 (3 mantissa bits, exponents -9..8): this
            # conversion rounds nothing. The scales are applied in fp32.
            # K is converted by Triton's cast, in the operand layout: for q.K^T the reduction
            # axis is d, along which K is stored, so each thread's values arrive as 4-byte
            # loads. V's reduction axis is the tokens, across rows, so V is converted where
            # it was loaded and transposed in 16 bits (`_e4m3_to_f16` says why). Doing K the
            # same way was slower: 247.7 against 206.1 us at (64, 4,096) (NOTES.md, v5).
            k = k.to(q.dtype)
            if FP8_PTX:
                v = _e4m3_to_f16(v.to(tl.uint8, bitcast=True))
            else:
                v = v.to(q.dtype)
        if V_BY_DIM:
            # Slots past the sequence's end in its last block were loaded (the mask is per
            # block) and may hold anything, NaN included: replace them, don't multiply them.
            v = tl.where(t_mask[:, None], v, 0.0)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (G_PAD, TILE_N) fp32
        # Masked tokens must get zero weight: -inf makes exp2 return exactly 0.
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every tile has >= 1 valid token
        alpha = tl.exp2(m_i - m_new)  # rescales old sums; 0 on the first tile (m_i = -inf)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # P is rounded to the input dtype for the second product, as FlashAttention does.
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # l_i = 0 only for a length-0 sequence: store 0, and lse = -inf, not 0/0 = NaN.
    has_keys = l_i > 0
    safe_l = tl.where(has_keys, l_i, 1.0)
    if FP8:
        safe_l = safe_l / tl.load(v_scale_ptr)  # out = v_scale * acc / l
    store_mask = g_mask[:, None] & d_mask[None, :]
    if direct:
        tl.store(
            out_ptr + seq * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :],
            (acc / safe_l[:, None]).to(out_ptr.dtype.element_ty),
            mask=store_mask,
        )
    else:
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        row = item * num_q_heads + q_heads  # (G_PAD,)
        tl.store(part_out_ptr + row[:, None] * D_PAD + offs_d[None, :], acc / safe_l[:, None], mask=store_mask)
        tl.store(part_lse_ptr + row, lse, mask=g_mask)
# --8<-- [end:kernel]


# --8<-- [start:reduce]
@triton.jit
def _combine_splits(part_out_ptr, part_lse_ptr, first, n_first, last_row, n_seq, stride, head, num_heads,
                    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, S_CHUNK: tl.constexpr):
    """(sum_s w_s * part_s, sum_s w_s) over the n_seq splits of one query head, S_CHUNK per
    step, with w_s = exp2(lse_s - max lse) kept relative to a running max. Split s < n_first
    is row first + s * stride (stride > 1: the groups the CUDA kernel folded); a split past
    them (the chunked plan's remainder, the flat plan's first piece) is row last_row."""
    offs_s = tl.arange(0, S_CHUNK)
    offs_d = tl.arange(0, D_PAD)
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([D_PAD], dtype=tl.float32)
    for s0 in range(0, n_seq, S_CHUNK):
        valid = s0 + offs_s < n_seq
        rows = tl.where(s0 + offs_s < n_first, first + (s0 + offs_s) * stride, last_row) * num_heads + head
        # Both loads are issued at once: the partials' mask does not wait for the lse.
        lse = tl.load(part_lse_ptr + rows, mask=valid, other=float("-inf"))
        part = tl.load(
            part_out_ptr + rows[:, None] * D_PAD + offs_d[None, :],
            mask=valid[:, None] & (offs_d[None, :] < HEAD_DIM),
            other=0.0,
        )
        has_keys = lse > float("-inf")
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        # A split with no keys (lse = -inf) weighs exactly 0, and its partial is replaced,
        # not multiplied, so no NaN (0 * NaN) can reach the sum. m_new is finite: every
        # split the plan makes holds at least one token.
        w = tl.where(has_keys, tl.exp2(lse - m_new), 0.0)
        part = tl.where(has_keys[:, None], part, 0.0)
        alpha = tl.exp2(m - m_new)
        acc = acc * alpha + tl.sum(w[:, None] * part, axis=0)
        w_sum = w_sum * alpha + tl.sum(w, axis=0)
        m = m_new
    return acc, w_sum


@triton.jit
def _plan_rows(seq_lens_ptr, seq, batch, target_uniform, target_ragged, split_cap, B_PAD: tl.constexpr,
               TILE_N: tl.constexpr, CHUNKED: tl.constexpr, RANK_MAX: tl.constexpr):
    """(n_seq, first, n_first, last_row) of sequence seq under _split_plan or chunked_plan:
    its splits are rows first .. first + n_first - 1, and last_row for any past those."""
    offs_b, lens, tiles, n, ends, total, uniform = _split_plan(seq_lens_ptr, batch, target_uniform, target_ragged,
                                                               split_cap, B_PAD, TILE_N)
    pick = offs_b == seq
    n_seq = tl.sum(tl.where(pick, n, 0), axis=0)
    first = tl.sum(tl.where(pick, ends, 0), axis=0) - n_seq
    n_first = n_seq
    last_row = first
    if CHUNKED:
        if not uniform:
            n_seq, first, n_first, last_row = _chunked_rows(seq, offs_b, lens, tiles, total, batch,
                                                            target_ragged, split_cap, TILE_N, RANK_MAX)
    return n_seq, first, n_first, last_row


@triton.jit
def _flat_rows(seq_lens_ptr, seq, batch, target_uniform, split_cap, programs, min_units, weight,
               B_PAD: tl.constexpr, TILE_N: tl.constexpr, FOLD: tl.constexpr):
    """(n_seq, first, n_first, last_row, stride) of sequence seq under the CUDA kernel's flat
    plan (flat_plan), from one pass over the lengths. Equal lengths: the proportional closed
    form, every sequence the same count of splits, as _split_plan gives it. Unequal: sequence
    seq holds units [first_unit, end_unit) of the batch's U; program p of p_eff holds
    [p U / p_eff, (p+1) U / p_eff). Programs p0 .. p1 hold a piece of it each: rows
    p0 + 1 .. p1 (the piece that starts each of them), and p0's own row, which is p0 if the
    sequence starts p0's range and programs + p0 (p0's last piece) if it starts inside it.
    With FOLD, a sequence of n > FOLD pieces was folded by the decode kernel in groups of
    g = ceil(n / FOLD) (fold_groups): its rows are then p0's own and p0 + g, p0 + 2g, ...

    Every one of the B x Hq reduction programs runs this, most only to find one piece and
    exit, so its cost grows as B squared. Run after _split_plan, as it was, it took 13.9 us
    more at B = 256 and 0.8 us more at (64, 4,096) (NOTES.md, v14)."""
    offs_b = tl.arange(0, B_PAD)
    inside = offs_b < batch
    lens = tl.load(seq_lens_ptr + offs_b, mask=inside, other=0)
    longest = tl.max(tl.where(inside, lens, 0), axis=0)
    shortest = tl.min(tl.where(inside, lens, 2**31 - 1), axis=0)
    # int32 sums, as in _split_plan: the launcher holds batch x table capacity under 2**31.
    units = tl.where(lens > 0, (lens + TILE_N - 1) // TILE_N + weight, 1)
    units = tl.where(inside, units, 0)
    total = tl.sum(units, axis=0).to(tl.int64)
    first_unit = tl.sum(tl.where(offs_b < seq, units, 0), axis=0).to(tl.int64)
    end_unit = first_unit + tl.sum(tl.where(offs_b == seq, units, 0), axis=0)
    if longest == shortest:
        # splits_of(longest, target_uniform, longest * batch): at least 1, at most tiles and split_cap.
        each = tl.minimum(tl.minimum((target_uniform + batch - 1) // batch, (longest + TILE_N - 1) // TILE_N),
                          split_cap)
        n_seq = tl.maximum(each, 1)
        first = seq * n_seq
        n_first = n_seq
        last_row = first
    else:
        p_eff = tl.minimum((total + min_units - 1) // min_units, programs)
        p0 = ((first_unit + 1) * p_eff + total - 1) // total - 1  # the program holding first_unit
        p1 = (end_unit * p_eff + total - 1) // total - 1  # ... and end_unit - 1
        own = tl.where(p0 * total // p_eff == first_unit, p0, programs + p0)
        n_seq = (p1 - p0 + 1).to(tl.int32)
        first = (p0 + 1).to(tl.int32)
        n_first = n_seq - 1
        last_row = own.to(tl.int32)
    if FOLD > 0:
        g = tl.where((longest != shortest) & (n_seq > FOLD), (n_seq + FOLD - 1) // FOLD, 1)
        first = first - 1 + g  # the group after p0's: unchanged where g = 1
        n_seq = (n_seq + g - 1) // g
        n_first = tl.where(g > 1, n_seq - 1, n_first)
        stride = g
    else:
        stride = 1
    return n_seq, first, n_first, last_row, stride


@triton.jit
def split_reduce_kernel(
    # Pointers
    part_out_ptr,  # (max_items, Hq, D_PAD) fp32
    part_lse_ptr,  # (max_items, Hq) fp32
    out_ptr,  # (B, Hq, d)
    seq_lens_ptr,  # (B,) int32, to rebuild the decode kernel's plan
    # Sizes
    batch,
    target_uniform,
    target_ragged,
    split_cap,
    flat_programs,  # FLAT: the decode grid's programs per head group, and flat_plan's other two
    flat_min_units,
    flat_weight,
    # Strides of out (the last axis is contiguous)
    stride_ob,
    stride_oh,
    # Meta-parameters
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    B_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    S_CHUNK: tl.constexpr,  # splits combined per loop step
    S_SMALL: tl.constexpr,  # a sequence of at most this many splits takes one step of this many
    CHUNKED: tl.constexpr,  # unequal lengths follow chunked_plan (the CUDA kernel's), not _split_plan
    RANK_MAX: tl.constexpr,  # chunked_plan's rank_max
    FLAT: tl.constexpr,  # unequal lengths follow flat_plan (the CUDA kernel's)
    FOLD: tl.constexpr,  # FLAT: ... and the CUDA kernel folded longer sequences (fold_groups); 0: not
    USE_GDC: tl.constexpr,
):
    """out = sum_s w_s * part_s / sum_s w_s, with w_s = exp2(lse_s - max_s lse_s).

    One program per (sequence, query head). Sequences with one split were written by the
    decode kernel and are skipped. The splits are combined S_CHUNK at a time with a
    running maximum, so any number of splits fits in registers. With CHUNKED, unequal
    lengths find their splits where chunked_plan (the CUDA kernel's forced-count plan) put
    them; with FLAT, every length finds them where flat_plan did (_flat_rows), and CHUNKED
    is not read.
    """
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    if FLAT:
        n_seq, first, n_first, last_row, stride = _flat_rows(seq_lens_ptr, seq, batch, target_uniform, split_cap,
                                                             flat_programs, flat_min_units, flat_weight, B_PAD,
                                                             TILE_N, FOLD)
    else:
        n_seq, first, n_first, last_row = _plan_rows(seq_lens_ptr, seq, batch, target_uniform, target_ragged,
                                                     split_cap, B_PAD, TILE_N, CHUNKED, RANK_MAX)
        stride = 1
    if n_seq == 1:
        return
    if USE_GDC:
        gdc_wait()  # the decode kernel's partials are complete and visible after this

    if n_seq <= S_SMALL:
        acc, w_sum = _combine_splits(part_out_ptr, part_lse_ptr, first, n_first, last_row, n_seq, stride, head,
                                     num_heads, HEAD_DIM, D_PAD, S_SMALL)
    else:
        acc, w_sum = _combine_splits(part_out_ptr, part_lse_ptr, first, n_first, last_row, n_seq, stride, head,
                                     num_heads, HEAD_DIM, D_PAD, S_CHUNK)
    offs_d = tl.arange(0, D_PAD)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + offs_d,
        (acc / w_sum).to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )
# --8<-- [end:reduce]


# --8<-- [start:heuristics]
# Fixed configuration, no autotune: one sweep (tile 32/64/128 x 4/8 warps x 2/3 stages, every
# useful split count; H200, Triton 3.6, 2026-11-29, in NOTES.md) found tile 64, 4 warps,
# 3 stages fastest on 5 of the 6 bench shapes and within 3% on the sixth
# (B=1, 17.6 vs 17.2 us, where launch and memory latency, not bandwidth, set the time).
# 64 tokens = 4 blocks of 16 per step; K and V tiles of 64 x 128 bf16 are 16 KiB each.
DEFAULT_TILE_N = 64
DEFAULT_NUM_WARPS = 4
# 3 stages: the gathered K/V loads of the next two tiles are in flight while one is used.
# At 2 stages (best split count each) the same tile ran 5% slower on 2 of the 6 shapes
# (267.6 vs 254.3 us at B=128, 516.9 vs 490.3 us without GQA) and within 1% on the rest.
DEFAULT_NUM_STAGES = 3
# fp8: tiles of 32 tokens (4 KiB per K or V tile), 2 warps, 2 stages, 8 programs per SM
# (128 registers x 64 threads; 21 KB of shared memory each). With half the bytes
# per token, a 64-token tile of 4 warps was bound by each program's chain of waits
# (shared-memory round trips and barriers between its warps), not by bytes: 206.1 us at
# (64, 4,096), where 32 / 2 / 2 took 187.9 and 32 / 2 / 3 196.6 (NOTES.md, v5).
FP8_TILE_N = 32
FP8_NUM_WARPS = 2
FP8_NUM_STAGES = 2
FP8_RESIDENT_PROGRAMS = 8
# Programs of the default configuration that fit on one SM at once: 106-122 registers x
# 128 threads and 40 KB of shared memory each cap it at 4 (ncu: "Block Limit Registers"
# 4, "Block Limit Shared Mem" 4). 132 SMs x 4 = 528 slots.
RESIDENT_PROGRAMS = 4
# When every sequence has the same length, every split does the same work and time goes in
# whole waves of `slots` programs: 768 programs (1.45 waves) took 153.6 us where 512 (0.97
# waves) took 138.0 at (B, L) = (32, 4096). Split until the last wave is at least this full.
MIN_WAVE_FILL = 0.9
# When lengths differ, splits differ in size and the GPU's scheduler hands each free slot
# the next program: the finish time is about (work / slots) + (largest split). Aiming for
# this many waves keeps the largest split at a fraction of one slot's share (NOTES.md, v3).
RAGGED_WAVES = 4
# The CUDA fp8 kernel runs one program per SM and cuts unequal lengths into equal chunks
# (chunked_plan), so its items come close to the target and time goes in whole waves of 132:
# 1.5 and 2.5 waves were 1-13% slower than 2 on every ragged batch timed but the one-long one.
# 2 waves beat 4 on the uniform and lognormal batches (284.8 against 292.5 us, 236.7 / 249.0)
# and on 5 held-out batches of 32-256 sequences, by 2.6-22% in all; the one-long batch lost
# 4% (118.5 / 113.9), NOTES.md, v11.
CUDA_FP8_RAGGED_WAVES = 2
# ... but with no split count forced it plans unequal lengths flat (flat_plan): one wave of
# programs, each the same share of the batch's tiles laid end to end, so a program's range
# may hold the end of one sequence and the start of the next. Against chunked_plan at 2 waves
# (same run, µs): uniform 274.5 / 284.9, lognormal 228.4 / 236.5, one-long 105.6 / 118.7; of
# four held-out batches three 1.4-7.6% faster, one 0.1% slower. 2 waves of flat programs were
# slower on 12 of 13 rows (NOTES.md, v13). Equal lengths keep the proportional closed form: flat, b32-l4k took 86.8
# against 83.4, since every program then holds two pieces.
CUDA_FP8_FLAT_WAVES = 1
# A sequence counts as its tiles plus this many: what a piece costs at its two ends (the
# queries' load, the warps' merge, the stores), about two tiles' loads. 0 / 1 / 2 / 4 (µs):
# lognormal 236.7 / 231.2 / 228.4 / 228.7, one-long 109.9 / 106.8 / 105.6 / 106.9 (v13).
CUDA_FP8_FLAT_WEIGHT = 2
# Fewest units per flat program, so a short batch is not cut into one-tile pieces.
CUDA_FP8_FLAT_MIN_UNITS = 2
# Upper bound on the forced split count per sequence (num_splits=...).
MAX_SPLITS = 128
# Most splits the plan gives one sequence unless forced: a 128K-token sequence among short
# ones would get 212 at RAGGED_WAVES = 4, and its reduction then reads them in 7 serial
# steps after everything else has finished; 64 splits of 2,048 tokens still fill the
# GPU with the short sequences beside them (NOTES.md, v3).
SPLIT_CAP = 64
# The fp8 tile is half as long (FP8_TILE_N), so the same cap left the 131,072-token
# sequence of the one-long batch 64 splits of 64 tiles: 166.4 us, against 136.7 at 128
# splits of 32 tiles; the other ragged batches moved by under 0.2% (NOTES.md, v5).
# bf16 keeps 64: 128 took it from 176.6 to 185.1 us on the same batch.
FP8_SPLIT_CAP = 128
# The CUDA fp8 kernel gives each split two warps per head where the Triton kernels give it
# 4 or 2, so a sequence needs 2x the splits for the same work per warp. With one warp per
# head the one-long batch took 177.5 us at 64 and 124.1 at 256 (NOTES.md, v9); with two,
# 110.4 at 128 and 120.3 at 256 (v10).
CUDA_FP8_SPLIT_CAP = 128

# Splits the reduction combines per loop step: SPLIT_CAP, so an unforced plan takes one
# step. At 32, the 60 splits of a B = 1 batch took two dependent steps (NOTES.md, v3).
REDUCE_CHUNK = 64
# ... but only up to this batch. With more sequences there are B x Hq reduction programs
# of a few splits each, and what each program costs counts: at (16, 4,096, 128 heads) the
# 64-split chunk took 93.7 us in all, 8 splits 87.6 (NOTES.md, v4).
REDUCE_WIDE_MAX_BATCH = 4
REDUCE_CHUNK_BATCHED = 8
# One warp per reduction program at those batches: a program combines one head's 128
# values over 8 splits, and 1 warp beat 2, 4 and 8 on every split shape timed (g16-b16:
# 82.1 / 82.8 / 87.7 / 102.2 us; b32-l4k: 142.8 / 144.6 / 145.6 / 152.7; NOTES.md, v4).
# Up to REDUCE_WIDE_MAX_BATCH the 64-split chunk keeps 4 warps, as recorded at B = 1.
REDUCE_NUM_WARPS_BATCHED = 1
# The CUDA fp8 kernel's plan gives a long sequence up to CUDA_FP8_SPLIT_CAP splits, which
# REDUCE_CHUNK_BATCHED per step reduce in 16 dependent steps: the one-long batch took
# 116.2 us at 8 and 110.4 at 32 (NOTES.md, v10). But a one-warp program holding 32 x 128
# fp32 needs about twice the registers (probably two waves of (128, 2,048)'s 4,096 programs):
# 153.0 us there against 146.9 at 8 (v10, v9's kernel). So a sequence of up to
# REDUCE_SMALL_CUDA_FP8 splits takes one step of that many, and longer ones 32 per step.
# Each Config holds its kernel's chunks.
REDUCE_CHUNK_CUDA_FP8 = 32
REDUCE_SMALL_CUDA_FP8 = 4
# The one-long batch's 104 pieces still take 4 of those steps after the decode grid, about
# 1 us each, on that batch's critical path (NOTES.md, v15, v16 and v19). With a fold of
# REDUCE_CHUNK_CUDA_FP8, the decode kernel combines a longer sequence's pieces in groups as
# they finish, and the reduction takes one step (fp8_decode.cu, fold_piece). Timed with
# `--fold 32` it was slower: the one-long batch 103.2 -> 104.3 us, every other row 0.2-0.6 us
# (H200, NOTES.md, v21). Off; the option stays for the bench.
CUDA_FP8_FOLD = 0
FOLD_MAX = 1024
# Counts the device's fold tensor holds at least (16 KiB): a launch needs 2 per program of the
# flat plan's wave, at most 16 per SM (8 one-head programs), so any pool on up to 256 SMs.
FOLD_COUNTS = 4096


@dataclasses.dataclass(frozen=True)
class Config:
    """The kernel's tuning for one cache dtype: what a launch uses when it is not told otherwise."""

    tile_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int
    split_cap: int
    reduce_chunk: int  # splits the reduction combines per step from REDUCE_WIDE_MAX_BATCH + 1 sequences up
    reduce_small: int = 0  # ... except a sequence of at most this many splits, in one step of this many
    chunked: bool = False  # unequal lengths follow chunked_plan, not the proportional plan_splits
    ragged_waves: float = RAGGED_WAVES  # waves of programs the plan aims for when lengths differ
    flat: bool = False  # unequal lengths follow flat_plan (the CUDA kernel's), not chunked_plan, unless forced
    flat_waves: int = 1  # ... over this many programs per SM slot
    flat_min_units: int = 2  # ... of at least this many units each
    flat_weight: int = 0  # ... where a sequence is this many units more than its tiles
    fold: int = 0  # ... and a sequence of more than this many pieces is folded in the decode kernel (0: never)


BF16_CONFIG = Config(DEFAULT_TILE_N, DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES, RESIDENT_PROGRAMS, SPLIT_CAP,
                     REDUCE_CHUNK_BATCHED)
FP8_CONFIG = Config(FP8_TILE_N, FP8_NUM_WARPS, FP8_NUM_STAGES, FP8_RESIDENT_PROGRAMS, FP8_SPLIT_CAP,
                    REDUCE_CHUNK_BATCHED)


# The CUDA fp8 kernel (fp8_decode.py): its split plan's unit, its KV heads per program and
# its programs per SM are that module's, for an 8-head pool (plan_geometry gives them for any
# other).
# Stages do not apply (it loads into registers): 1.
CUDA_FP8_CONFIG = Config(fp8_decode.TILE_N, fp8_decode.HEADS_MAX * fp8_decode.WARPS_PER_HEAD, 1,
                         fp8_decode.programs_per_sm(fp8_decode.HEADS_MAX),
                         CUDA_FP8_SPLIT_CAP, REDUCE_CHUNK_CUDA_FP8, REDUCE_SMALL_CUDA_FP8, chunked=True,
                         ragged_waves=CUDA_FP8_RAGGED_WAVES, flat=True, flat_waves=CUDA_FP8_FLAT_WAVES,
                         flat_min_units=CUDA_FP8_FLAT_MIN_UNITS, flat_weight=CUDA_FP8_FLAT_WEIGHT,
                         fold=CUDA_FP8_FOLD)
# Which kernel serves an fp8 cache: "auto" takes the CUDA one wherever it applies.
BACKENDS = ("auto", "triton", "cuda")


def default_config(fp8: bool, backend: str = "triton") -> Config:
    """The tuning a launch uses: the CUDA kernel's for backend "cuda", else FP8_CONFIG for a
    float8 cache and BF16_CONFIG otherwise (which also serves fp16 and fp32)."""
    if backend == "cuda":
        return CUDA_FP8_CONFIG
    return FP8_CONFIG if fp8 else BF16_CONFIG


def plan_geometry(backend: str, num_kv_heads: int, programs_per_sm: int | None = None,
                  config: Config = BF16_CONFIG) -> tuple[int, int]:
    """(programs per split, programs per SM): what the split plan counts for a pool of
    num_kv_heads heads. A Triton program serves one KV head; a CUDA one serves
    fp8_decode.heads_per_program of them, one warp each, so it has fewer, wider programs."""
    if backend == "cuda":
        heads = fp8_decode.heads_per_program(num_kv_heads)
        return num_kv_heads // heads, programs_per_sm or fp8_decode.programs_per_sm(heads)
    return num_kv_heads, programs_per_sm or config.programs_per_sm


# The split plan holds one lane per sequence in every program.
MAX_BATCH = 4096
# Registers per thread for the decode kernel: 128 x 128 threads x 4 programs = the SM's
# 65,536, so RESIDENT_PROGRAMS holds. Left to itself, Triton 3.6 gave the split variant
# 124-155 registers (3 programs per SM) and the fp8 one 199 (2 per SM); at 128 the
# compiler's report shows no spills for the default tiles (NOTES.md, v3).
MAX_REGISTERS = 128
# Fewest tiles per split for equal lengths: at B = 1, L = 4,096 (64 tiles), 32 splits of 2
# tiles took 18.6 us and 60-64 splits of 1-2 tiles 21.0-22.4 (NOTES.md, v3).
MIN_SPLIT_TILES = 2
# Don't split when the unsplit programs already fill this much of one wave: at (96, 1024,
# 28 heads, 4 KV heads), 384 programs (0.73 of a wave) took 63.2 us unsplit and 82.2 us
# split 4 ways to fill the wave, whose 4-tile splits cost more than the idle slots.
NO_SPLIT_FILL = 0.5
# Programmatic dependent launch for the reduction from this batch size up: it hid 2-9 us
# of the reduction's launch at B >= 16 and cost 2-3 us at B = 1 (NOTES.md, v3).
PDL_MIN_BATCH = 8


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def wave_fill(programs: int, slots: int) -> float:
    """Work done over time spent, when `programs` equal programs run `slots` at a time."""
    waves = programs / slots
    return waves / math.ceil(waves)


def choose_num_splits(
    batch: int,
    num_kv_heads: int,
    max_seq_len: int,
    num_sms: int,
    tile_n: int = DEFAULT_TILE_N,
    programs_per_sm: int = RESIDENT_PROGRAMS,
) -> int:
    """Fewest splits per (sequence, KV head) whose programs fill their last wave >= MIN_WAVE_FILL.

    For a batch of equal lengths. A split gets at least one tile, so short sequences are
    never split into empty work; a batch that already fills NO_SPLIT_FILL of a wave is
    not split at all.
    """
    pairs = batch * num_kv_heads
    slots = programs_per_sm * num_sms
    if pairs >= NO_SPLIT_FILL * slots:
        return 1
    at_most = max(1, min(-(-max_seq_len // tile_n) // MIN_SPLIT_TILES, MAX_SPLITS))
    best = 1
    for splits in range(1, at_most + 1):
        fill = wave_fill(pairs * splits, slots)
        if fill >= MIN_WAVE_FILL:
            return splits
        if fill > wave_fill(pairs * best, slots):
            best = splits
    return best


def split_targets(
    batch: int,
    num_kv_heads: int,
    num_sms: int,
    max_seq_len: int | None = None,
    tile_n: int = DEFAULT_TILE_N,
    programs_per_sm: int = RESIDENT_PROGRAMS,
    ragged_waves: float = RAGGED_WAVES,
) -> tuple[int, int]:
    """(target_uniform, target_ragged): splits wanted in all, per KV head, for the plan.

    Uniform: the wave heuristic's per-sequence count times the batch. Ragged: enough
    splits for `ragged_waves` waves, never fewer than the uniform target, and for a batch
    below RAGGED_WAVES' target, more than one per sequence. Neither needs the lengths, so
    the host computes both without reading the GPU.
    """
    longest = MAX_SPLITS * tile_n if max_seq_len is None else max_seq_len
    uniform = batch * choose_num_splits(batch, num_kv_heads, longest, num_sms, tile_n, programs_per_sm)
    if batch == 1:  # one sequence is always uniform: no grid tail for a ragged plan
        return uniform, uniform
    per_wave = programs_per_sm * num_sms / num_kv_heads
    # A ragged target at or below the batch runs the launch unsplit, and a long sequence among
    # the others is then one program's. Aiming for fewer waves than RAGGED_WAVES (the CUDA fp8
    # kernel's 2) must not make that happen at a smaller batch than RAGGED_WAVES does, so up to
    # that target the plan still gets one split more than the batch. 300 sequences, one of
    # 65,536 tokens: 2,472.9 us unsplit at 2 waves, 381.4 split (NOTES.md, v11). Past it the
    # launch stays unsplit: every program of a split launch rebuilds the plan over the whole
    # batch, and at B = 4,096 equal lengths that took 31,880.7 us against 558.4 unsplit (bf16).
    floor = min(batch + 1, math.ceil(RAGGED_WAVES * per_wave))
    ragged = max(uniform, math.ceil(ragged_waves * per_wave), floor)
    return uniform, ragged


def plan_splits(lens: list[int], targets: tuple[int, int], tile_n: int, split_cap: int = SPLIT_CAP) -> list[int]:
    """The split count per sequence that `_split_plan` computes on the GPU, in plain Python.

    For reports and tests; the kernels never call it.
    """
    total = max(sum(lens), 1)
    target = targets[0] if total == max(lens) * len(lens) else targets[1]
    if max(targets) <= len(lens):
        return [1] * len(lens)
    return [max(min(-(-n * target // total), -(-n // tile_n), split_cap), 1) for n in lens]


def chunked_plan(lens: list[int], targets: tuple[int, int], tile_n: int, split_cap: int,
                 rank_max: int = fp8_decode.RANK_MAX_BATCH) -> list[tuple[int, int, int]]:
    """The CUDA fp8 kernel's work items, (sequence, start, end) in launch order, in plain Python.

    Equal lengths split as plan_splits says. Unequal ones are cut into chunks of one size
    (`chunk`, a multiple of tile_n, about total / target; longer for a sequence that would
    otherwise get more than split_cap) and a remainder each. The full chunks come first, in
    sequence order; then the remainders, longest first, so that the slots that free up last
    take the shortest work (up to rank_max sequences; beyond, in sequence order). A
    proportional split, as the Triton kernels use, leaves each item 0.5-1 chunk long and the
    last wave that uneven (NOTES.md, v10). fp8_decode.cu and the reduction's _chunked_rows
    compute the same plan on the GPU; the tests hold the three together.
    """
    total = max(sum(lens), 1)
    if max(targets) <= len(lens):
        return [(b, 0, n) for b, n in enumerate(lens)]
    if max(lens) == min(lens):  # the kernel's test: longest == shortest
        n = plan_splits(lens, targets, tile_n, split_cap)[0]
        tiles = -(-lens[0] // tile_n)
        return [(b, (j * tiles // n) * tile_n, min(((j + 1) * tiles // n) * tile_n, lens[b]))
                for b in range(len(lens)) for j in range(n)]
    chunk = tile_n * max(1, -(-total // (targets[1] * tile_n)))
    full, rems = [], []
    for b, n in enumerate(lens):
        tiles = -(-n // tile_n)
        size = max(chunk, tile_n * -(-tiles // split_cap))
        full += [(b, j * size, (j + 1) * size) for j in range(n // size)]
        rest = n % size
        if rest or n == 0:
            rems.append((b, n - rest, n))
    if len(lens) <= rank_max:
        rems.sort(key=lambda item: (-(item[2] - item[1]), item[0]))
    return full + rems


def launch_targets(batch: int, num_kv_heads: int, num_sms: int | None, config: Config, backend: str, *,
                   max_seq_len: int | None = None, num_splits: int | None = None, tile_n: int | None = None,
                   programs_per_sm: int | None = None,
                   ragged_waves: float | None = None) -> tuple[tuple[int, int], int]:
    """(targets, split_cap) that paged_decode hands the kernels, for a launch of `config` on
    `backend`; the bench mirrors a launch's plan with it. num_sms None (the CPU interpreter)
    plans no split unless num_splits asks for one."""
    if num_splits is None and num_sms is not None:
        heads, per_sm = plan_geometry(backend, num_kv_heads, programs_per_sm, config)
        targets = split_targets(batch, heads, num_sms, max_seq_len, tile_n or config.tile_n, per_sm,
                                config.ragged_waves if ragged_waves is None else ragged_waves)
    elif num_splits is None or num_splits == 1:
        targets = (batch, batch)  # one split per sequence: the plan is skipped
    else:
        targets = (batch * num_splits, batch * num_splits)
    return targets, config.split_cap if num_splits is None else MAX_SPLITS


def flat_plan_programs(num_kv_heads: int, num_sms: int, config: Config) -> int:
    """Programs per head group the CUDA kernel's flat plan launches: config.flat_waves per
    SM slot, shared by the head groups."""
    heads, per_sm = plan_geometry("cuda", num_kv_heads)
    return max(1, config.flat_waves * num_sms * per_sm // heads)


def flat_plan(lens: list[int], targets: tuple[int, int], tile_n: int, split_cap: int, programs: int,
              min_units: int, weight: int) -> list[tuple[int, int, int, int]]:
    """The CUDA kernel's flat plan in plain Python: (row, sequence, start, end) pieces in
    launch order, row being where a split piece's partial goes.

    Equal lengths split as chunked_plan says, piece i at row i. Unequal ones: a sequence is
    `weight` units (standing for a piece's fixed cost at its two ends; they hold no tokens)
    plus one per tile of its tokens, a length-0 sequence one unit; the units are laid end to
    end, U in all, and program p of p_eff = min(programs, ceil(U / min_units)) takes units
    [p U / p_eff, (p + 1) U / p_eff), so each program has the same work to a unit whatever
    the lengths. Its first piece goes to row p, its last (when another) to programs + p; the
    pieces between are whole sequences. fp8_decode.cu and the reduction's _flat_rows
    compute the same plan on the GPU; the tests hold the three together.
    """
    if max(lens) == min(lens) or max(targets) <= len(lens):
        return [(i, *item) for i, item in enumerate(chunked_plan(lens, targets, tile_n, split_cap))]
    units = [-(-n // tile_n) + weight if n else 1 for n in lens]
    total = sum(units)
    p_eff = min(programs, -(-total // min_units))
    starts = [0]
    for u in units:
        starts.append(starts[-1] + u)
    pieces = []
    seq = 0
    for p in range(p_eff):
        t0, t1 = p * total // p_eff, (p + 1) * total // p_eff
        while starts[seq + 1] <= t0:
            seq += 1
        b = seq
        while b < len(lens) and starts[b] < t1:
            lo, hi = max(starts[b], t0), min(starts[b + 1], t1)
            skip = weight if lens[b] else 0
            start = max(0, lo - starts[b] - skip) * tile_n
            end = min(max(0, hi - starts[b] - skip) * tile_n, lens[b])
            pieces.append((p if lo == t0 else programs + p, b, min(start, end), end))
            b += 1
    return pieces


def fold_groups(lens: list[int], pieces: list[tuple[int, int, int, int]], fold: int) -> dict[int, list[list[int]]]:
    """The CUDA kernel's fold over flat_plan's pieces, in plain Python: for each sequence, its
    rows in groups, each group's combination written to the group's first row. With unequal
    lengths, a sequence of n > fold pieces (consecutive programs' pieces) is grouped
    ceil(n / fold) at a time; any other sequence, and every sequence of an equal-length batch,
    keeps one group per piece. fp8_decode.cu (fold_of) and the reduction (_flat_rows) compute
    the same groups; the tests hold the three together."""
    rows_of: dict[int, list[int]] = {}
    for row, seq, _, _ in pieces:
        rows_of.setdefault(seq, []).append(row)
    unequal = max(lens) != min(lens)
    groups = {}
    for seq, rows in rows_of.items():
        g = -(-len(rows) // fold) if fold and unequal and len(rows) > fold else 1
        groups[seq] = [rows[i:i + g] for i in range(0, len(rows), g)]
    return groups


def splits_per_sequence(lens: list[int], targets: tuple[int, int], tile_n: int, split_cap: int,
                        chunked: bool, flat: tuple[int, int, int] | None = None) -> list[int]:
    """Items per sequence under the plan a launch uses: plan_splits; the count of each
    sequence's items in chunked_plan (a Config's `chunked`); or, with flat = (programs,
    min_units, weight), its pieces in flat_plan."""
    if flat is not None:
        items = [(seq, a, z) for _, seq, a, z in flat_plan(lens, targets, tile_n, split_cap, *flat)]
    elif chunked:
        items = chunked_plan(lens, targets, tile_n, split_cap)
    else:
        return plan_splits(lens, targets, tile_n, split_cap)
    counts = [0] * len(lens)
    for seq, _, _ in items:
        counts[seq] += 1
    return counts


# --8<-- [end:heuristics]


def resolve_backend(q: torch.Tensor, k_cache: torch.Tensor, v_layout: str = "token", backend: str = "auto",
                    tile_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None) -> str:
    """The kernel a call runs: "cuda" (fp8_decode.py) or "triton" (this file).

    "auto" takes the CUDA kernel for an fp8 cache wherever it applies, unless a Triton knob
    (tile_n, num_warps, num_stages) was given; "cuda" is an error where it does not apply,
    with the reason.
    """
    triton_knobs = bool(tile_n or num_warps or num_stages)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    fp8 = k_cache.dtype == FP8_DTYPE
    if backend == "cuda" and not fp8:
        raise ValueError(f"backend='cuda' serves an fp8 cache only; this one is {k_cache.dtype}")
    if not fp8 or backend == "triton" or (backend == "auto" and triton_knobs):
        return "triton"
    why_not = fp8_decode.unsupported_reason(q, k_cache, q.shape[1] // k_cache.shape[2], v_layout)
    if why_not and backend == "cuda":
        raise ValueError(f"backend='cuda' cannot take this call: {why_not}")
    return "triton" if why_not else "cuda"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


_PDL = {"ok": None}  # None: not tried yet on this process; then True/False


def _launch_reduce(grid, args, kwargs) -> None:
    """Launch the reduction with programmatic dependent launch where Triton and the GPU take it."""
    if _PDL["ok"] is not False:
        try:
            split_reduce_kernel[grid](*args, **kwargs, USE_GDC=True, launch_pdl=True)
            _PDL["ok"] = True
            return
        except Exception:  # noqa: BLE001 - an older Triton or driver: plain launch from now on
            if _PDL["ok"]:
                raise
            _PDL["ok"] = False
    split_reduce_kernel[grid](*args, **kwargs, USE_GDC=False)


_FOLD_COUNTS: dict[torch.device, torch.Tensor] = {}


def _device_fold_counts(device: torch.device, needed: int) -> torch.Tensor:
    """The device's int32 zeros for the fold, made at the first launch that folds and kept for
    the process: every later launch, and every graph captured after it, reads that tensor,
    which each launch leaves zeroed, so no launch pays for a zeroing. It is never replaced,
    since a graph may hold it. A launch that needs more than it holds (on more than 256 SMs)
    gets zeros of its own each time, and so does a first launch made during a capture: the
    graph then owns them and replays their zeroing."""
    held = _FOLD_COUNTS.get(device)
    if held is not None and held.numel() >= needed:
        return held
    counts = torch.zeros(max(needed, FOLD_COUNTS), dtype=torch.int32, device=device)
    if held is None and not torch.cuda.is_current_stream_capturing():
        _FOLD_COUNTS[device] = counts
    return counts


# --8<-- [start:launcher]
def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    programs_per_sm: int | None = None,
    ragged_waves: float | None = None,
    v_layout: str = "token",
    backend: str = "auto",
    fold: int | None = None,
    fold_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention over a paged KV cache; returns (B, Hq, d) in q's dtype.

    Capturable in a CUDA graph: nothing is read back from the GPU. The split plan is
    rebuilt inside the kernels from seq_lens at every launch, so a graph captured once
    and replayed after seq_lens and block_tables change in place computes the new batch.
    The grid depends only on B, the head counts and the GPU, never on the lengths.

    seq_lens: int32, each >= 0 (0 gives a zero output row) and within the block table.
    k_scale, v_scale: fp32 tensors of one element, required when the cache is float8
    e4m3 (real value = stored value * scale, as vLLM's layer._k_scale and _v_scale).
    They stay on the GPU, so new scales need no new capture.
    max_seq_len: optional; when given, it is checked against the block table's capacity
    and caps the uniform split count. It is never read from seq_lens.
    num_splits: None picks the plan from the GPU's SM count (no split under the CPU
    interpreter); 1 turns split-K and its reduction off; k > 1 asks for k splits per
    sequence on average, each sequence's share proportional to its length.
    tile_n, num_warps, num_stages: the kernel's tuning knobs (None: the defaults for the
    cache's dtype). programs_per_sm: programs of that configuration that fit on one SM
    at once (None: the default configuration's, per dtype). ragged_waves: waves of
    programs to aim for when lengths differ (None: the kernel's, RAGGED_WAVES or
    CUDA_FP8_RAGGED_WAVES).
    v_layout: "token" when v_cache is shaped like k_cache (vLLM's order); "dim" when it is
    (num_blocks, num_kv_heads, head_dim, block_size), as `PagedKVCache(v_layout="dim")`
    stores it (cache.py says why one would, and why it is not the default).
    backend: for an fp8 cache, "cuda" runs the CUDA kernel (fp8_decode.py; an error if it
    cannot take the call), "triton" this file's kernel, "auto" the CUDA one wherever it
    applies and no Triton knob (tile_n, num_warps, num_stages) was given. Other dtypes
    always run the Triton kernel.
    fold: CUDA kernel only. Under its flat plan (unequal lengths), a sequence cut into n >
    fold pieces is combined in groups of ceil(n / fold) pieces inside the decode kernel as
    they finish, so the reduction reads at most fold rows for it; 0 never folds (None: the
    kernel's, CUDA_FP8_FOLD). fold_counts: the int32 zeros the fold counts pieces in, at least
    fp8_decode.fold_counts_needed of them, zeros again after every launch. None uses one
    tensor per device, so two launches that may run at once (on two streams) each need their
    own.
    """
    # (1) Checks
    if q.dim() != 3:
        raise ValueError(f"q must be (batch, num_q_heads, head_dim), got shape {tuple(q.shape)}")
    if v_layout not in V_LAYOUTS:
        raise ValueError(f"v_layout must be one of {V_LAYOUTS}, got {v_layout!r}")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(f"k_cache and v_cache must be 4-D, got shapes {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    # v_by_token: v_cache viewed as (num_blocks, block_size, num_kv_heads, head_dim), like k_cache.
    v_by_token = v_cache if v_layout == "token" else v_cache.permute(0, 3, 1, 2)
    if k_cache.shape != v_by_token.shape:
        want = "(num_blocks, block_size, num_kv_heads, head_dim)" if v_layout == "token" else \
            "(num_blocks, num_kv_heads, head_dim, block_size)"
        raise ValueError(f"with v_layout={v_layout!r}, v_cache must be {want} matching k_cache "
                         f"{tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if v_layout == "token" and k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache must share strides, got {k_cache.stride()} and {v_cache.stride()}")
    if v_layout == "dim" and v_cache.stride(-1) != 1:
        raise ValueError("with v_layout='dim', v_cache must be contiguous along its last axis (block_size)")
    batch, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"head_dim differs: q has {head_dim}, the cache has {cache_head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size {block_size} is not one of {SUPPORTED_BLOCK_SIZES}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    fp8 = k_cache.dtype == FP8_DTYPE
    if k_cache.dtype != v_cache.dtype or (k_cache.dtype != q.dtype and not fp8):
        raise ValueError(
            f"k_cache and v_cache must share q's dtype, or both be {FP8_DTYPE}; "
            f"got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if fp8:
        if q.dtype == torch.float32:
            raise ValueError("an fp8 cache needs float16 or bfloat16 queries (the products run in 16 bits)")
        for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
            if t is None or t.numel() != 1 or t.dtype != torch.float32 or t.device != q.device:
                raise ValueError(f"an fp8 cache needs {name}: a one-element float32 tensor on {q.device}")
    elif k_scale is not None or v_scale is not None:
        raise ValueError(f"k_scale and v_scale apply only to an fp8 cache; this one is {k_cache.dtype}")
    backend = resolve_backend(q, k_cache, v_layout, backend, tile_n, num_warps, num_stages)
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError(f"block_tables and seq_lens must be int32, got {block_tables.dtype} and {seq_lens.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or tuple(seq_lens.shape) != (batch,):
        raise ValueError(
            f"block_tables must be ({batch}, max_blocks) and seq_lens ({batch},), "
            f"got {tuple(block_tables.shape)} and {tuple(seq_lens.shape)}"
        )
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be in [1, {MAX_BATCH}], got {batch}")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = q.device
    if device.type == "cpu" and not _interpreting():
        raise ValueError("CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1 before importing triton")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or (v_layout == "token" and v_cache.stride(-1) != 1) or block_tables.stride(-1) != 1 or seq_lens.stride(0) != 1:
        raise ValueError("q, k_cache, block_tables and seq_lens must be contiguous along their last axis")
    config = default_config(fp8, backend)
    if fold and not 2 <= fold <= FOLD_MAX:
        raise ValueError(f"fold must be 0 (never) or in [2, {FOLD_MAX}], got {fold}")
    if fold and backend != "cuda":
        raise ValueError(f"fold applies to the CUDA fp8 kernel (backend 'cuda'); this call runs {backend!r}")
    fold = config.fold if fold is None else fold
    tile_n = tile_n or config.tile_n
    num_warps = num_warps or config.num_warps
    num_stages = num_stages or config.num_stages
    if ragged_waves is not None and not ragged_waves > 0:
        raise ValueError(f"ragged_waves must be > 0, got {ragged_waves}")
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise ValueError(f"tile_n must be a power of 2 and >= 16 (tl.dot's minimum), got {tile_n}")
    if max_seq_len is not None and max_seq_len > block_tables.shape[1] * block_size:
        raise ValueError(
            f"max_seq_len {max_seq_len} exceeds the block table's capacity "
            f"({block_tables.shape[1]} blocks x {block_size} tokens)"
        )
    if batch * block_tables.shape[1] * block_size >= 2**31:
        raise ValueError(
            f"batch ({batch}) x block-table capacity ({block_tables.shape[1] * block_size} tokens) must stay "
            "under 2**31: the split plan sums the lengths in int32"
        )
    if num_splits is not None and not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    num_sms = None  # the interpreter: no split unless num_splits asks for one
    if device.type == "cuda":
        num_sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
    targets, split_cap = launch_targets(batch, num_kv_heads, num_sms, config, backend, max_seq_len=max_seq_len,
                                        num_splits=num_splits, tile_n=tile_n, programs_per_sm=programs_per_sm,
                                        ragged_waves=ragged_waves)
    split = max(targets) > batch
    if device.type == "cpu":
        from labs.paged_attention.interpreter_compat import patch_interpreter_index

        patch_interpreter_index()

    group_size = num_q_heads // num_kv_heads
    d_pad = triton.next_power_of_2(max(head_dim, 16))
    g_pad = max(16, triton.next_power_of_2(group_size))
    b_pad = triton.next_power_of_2(batch)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    use_gdc = (device.type == "cuda" and gdc_wait is not None and _PDL["ok"] is not False
               and batch >= PDL_MIN_BATCH)

    # (2) Allocates: the plan gives every sequence at most one split more than its share
    # of the target, so max(targets) + batch rows hold any plan. The flat plan's programs
    # write at most two rows each.
    out = torch.empty_like(q)
    items = max(targets) + batch if split else batch
    flat = backend == "cuda" and config.flat and split and num_splits is None  # a forced count: chunked_plan
    flat_programs = 0
    if flat:  # equal lengths keep the proportional items; unequal ones take 2 rows per program at most
        flat_programs = flat_plan_programs(num_kv_heads, num_sms, config)
        items = max(targets[0] + batch, 2 * flat_programs)
    if fold_counts is not None:
        if not fold:
            raise ValueError("fold_counts is read only by the CUDA kernel's fold, and this call's fold is 0")
        # A launch the host does not split never folds; the tensor is still checked.
        needed = fp8_decode.fold_counts_needed(num_kv_heads, flat_programs) if flat else 1
        if (fold_counts.dtype != torch.int32 or fold_counts.device != device or fold_counts.dim() != 1
                or not fold_counts.is_contiguous() or fold_counts.numel() < needed):
            raise ValueError(f"fold_counts must be a contiguous 1-D int32 tensor of at least {needed} zeros on "
                             f"{device}, got {fold_counts.dtype}, shape {tuple(fold_counts.shape)} on "
                             f"{fold_counts.device}")
    fold = fold if flat else 0  # this launch's
    if fold and fold_counts is None:
        fold_counts = _device_fold_counts(device, fp8_decode.fold_counts_needed(num_kv_heads, flat_programs))
    if split:
        part_out = torch.empty(items, num_q_heads, d_pad, dtype=torch.float32, device=device)
        part_lse = torch.empty(items, num_q_heads, dtype=torch.float32, device=device)
    else:
        part_out = part_lse = out  # unused: no sequence writes partials
    scales = (k_scale, v_scale) if fp8 else (seq_lens, seq_lens)  # unused pointers when not FP8

    # (3) Launches
    if backend == "cuda":
        fp8_decode.launch(q, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, out, part_out, part_lse,
                          fold_counts, items=flat_programs if flat else items, group_size=group_size,
                          targets=targets, split_cap=split_cap, qk_scale=scale * math.log2(math.e), split=split,
                          flat=flat, flat_programs=flat_programs, min_units=config.flat_min_units,
                          unit_weight=config.flat_weight, fold=fold)
    else:
        compile_options = {} if device.type == "cpu" else {"maxnreg": MAX_REGISTERS}
        paged_decode_kernel[(num_kv_heads, items)](
            q, k_cache, v_cache, block_tables, seq_lens, *scales, out, part_out, part_lse,
            batch, group_size, targets[0], targets[1], split_cap, scale * math.log2(math.e),
            q.stride(0), q.stride(1),
            k_cache.stride(0),  # assumes (num_blocks, BLOCK_SIZE, H_KV, D)
            k_cache.stride(1),
            k_cache.stride(2),
            *v_by_token.stride(),
            block_tables.stride(0),
            out.stride(0), out.stride(1),
            BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim,
            D_PAD=d_pad,
            G_PAD=g_pad,
            B_PAD=b_pad,
            TILE_N=tile_n,
            SPLIT=split,
            FP8=fp8,
            # Before sm_89 there is no cvt from e4m3: Triton's own cast runs there.
            FP8_PTX=fp8 and device.type == "cuda" and fp8_decode.has_e4m3_cvt(device),
            V_BY_DIM=v_layout == "dim",
            USE_GDC=split and use_gdc,
            # fp32 inputs: exact products ("ieee"), not tf32's 10-bit mantissa. 16-bit inputs
            # ignore the setting.
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            num_warps=num_warps,
            num_stages=num_stages,
            **compile_options,
        )
    if split:
        args = (part_out, part_lse, out, seq_lens, batch, targets[0], targets[1], split_cap,
                flat_programs, config.flat_min_units, config.flat_weight,
                out.stride(0), out.stride(1))
        wide = batch <= REDUCE_WIDE_MAX_BATCH
        s_chunk = REDUCE_CHUNK if wide else config.reduce_chunk
        kwargs = dict(HEAD_DIM=head_dim, D_PAD=d_pad, B_PAD=b_pad, TILE_N=tile_n, S_CHUNK=s_chunk,
                      # no small step: both branches take s_chunk (a zero-wide step does not compile)
                      S_SMALL=(0 if wide else config.reduce_small) or s_chunk,
                      CHUNKED=config.chunked,
                      RANK_MAX=fp8_decode.RANK_MAX_BATCH, FLAT=flat, FOLD=fold,
                      num_warps=4 if wide else REDUCE_NUM_WARPS_BATCHED, num_stages=2)
        if use_gdc:
            _launch_reduce((batch, num_q_heads), args, kwargs)
        else:
            split_reduce_kernel[(batch, num_q_heads)](*args, **kwargs, USE_GDC=False)
    return out
# --8<-- [end:launcher]
