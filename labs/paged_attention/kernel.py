"""PagedAttention decode in Triton: one query token per sequence, KV read through block tables.

Maths. For sequence b and query head h, with n = seq_lens[b] cached tokens,

    out[b, h] = softmax(q[b, h] . K_b^T * scale) V_b

where K_b, V_b (n, head_dim) are gathered from the paged pool through block_tables[b]
(see `cache.py` for the layout). Shapes: q, out (B, Hq, d); k_cache, v_cache
(num_blocks, BLOCK_SIZE, Hkv, d); block_tables (B, max_blocks) int32; seq_lens (B,) int32.

Designs this follows (the code is written for this lab, not adapted):

* PagedAttention, Kwon et al. 2023, https://arxiv.org/abs/2309.06180v1: KV in fixed-size
  blocks, addressed through a per-sequence block table.
* Online softmax, Milakov and Gimelshein 2018, https://arxiv.org/abs/1805.02867v2, in
  the FlashAttention-2 form (rescale the accumulator, divide once at the end), Dao 2023,
  https://arxiv.org/abs/2307.08691v1. Exponents are base 2: the scale carries log2(e).
* Flash-Decoding, Dao, Haziza, Massa and Sizov, 2023-10-12,
  https://crfm.stanford.edu/2023/10/12/flashdecoding.html: split each sequence's keys
  into chunks that run as separate programs, each writing a partial output and its
  log-sum-exp, then combine them in a second kernel. A batch of 1 with 8 KV heads is
  8 programs on a 132-SM H200 without it.
* GQA heads as the rows of one matrix product, so a program reads a KV head once for all
  the query heads that share it, as vLLM's grouped Triton decode kernel does
  (`_fwd_grouped_kernel_stage1`, https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/ops/triton_decode_attention.py).

Caution:

* `tl.dot` needs at least 16 rows, so a group of 4 query heads is padded to 16 and 75%
  of the matrix work is thrown away (94% at 1 head per group). That is cheap only while
  the kernel is bound by memory, which decode is: about 1 FLOP per byte of KV per head.
* Whether the gathered K/V loads are software-pipelined (cp.async) depends on Triton's
  pipeliner for the version in use; the tuning numbers below were measured with Triton
  3.6 on one H200 and may not carry to other versions or GPUs.
* The split count comes from a heuristic (`choose_num_splits`) that assumes every
  program does the same work. With very ragged batches the long sequences' programs
  dominate and the wave arithmetic is only approximate. RESIDENT_PROGRAMS was read off
  ncu for the default configuration; another tile size or GPU needs its own value.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from labs.paged_attention.cache import SUPPORTED_BLOCK_SIZES


# --8<-- [start:kernel]
@triton.jit
def paged_decode_kernel(
    # Pointers
    q_ptr,  # (B, Hq, d)
    k_cache_ptr,  # (num_blocks, BLOCK_SIZE, Hkv, d)
    v_cache_ptr,  # same shape and strides as k_cache
    block_tables_ptr,  # (B, max_blocks) int32; padding entries are 0, the null block
    seq_lens_ptr,  # (B,) int32, each >= 1
    out_ptr,  # (B, Hq, d), written when SPLIT is False
    part_out_ptr,  # (B, Hq, num_splits, D_PAD) fp32, written when SPLIT is True
    part_lse_ptr,  # (B, Hq, num_splits) fp32, log2-sum-exp of each split's scores
    # Sizes
    group_size,  # query heads per KV head
    num_splits,  # programs per (sequence, KV head) along the keys
    qk_scale,  # softmax scale * log2(e), so exp2 gives the softmax's exp
    # Strides: elements between neighbours along that axis (the last axis is contiguous)
    stride_qb,
    stride_qh,
    stride_cb,  # between physical blocks
    stride_ct,  # between tokens inside a block
    stride_ch,  # between KV heads
    stride_tb,  # between block-table rows
    stride_ob,
    stride_oh,
    # Meta-parameters
    BLOCK_SIZE: tl.constexpr,  # tokens per KV block
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,  # HEAD_DIM rounded up to a power of 2 (tl.arange needs one)
    G_PAD: tl.constexpr,  # group_size rounded up to a power of 2, at least 16 (tl.dot's minimum)
    TILE_N: tl.constexpr,  # tokens per loop step, TILE_N // BLOCK_SIZE blocks when BLOCK_SIZE < TILE_N
    SPLIT: tl.constexpr,  # write partial results for the reduction kernel
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, so no tf32 rounding
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_q_heads = tl.num_programs(1) * group_size

    seq_len = tl.load(seq_lens_ptr + seq)
    # Each split gets a whole number of tiles, so no tile straddles two splits. With more
    # splits than tiles the last splits are empty (start >= end); they still write their
    # (zero output, -inf lse) pair so the reduction never reads an unwritten slot.
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), TILE_N) * TILE_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

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
        v = tl.load(v_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0)

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

    store_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # An empty split has l_i = 0: store 0 and lse = -inf instead of 0/0 = NaN.
        has_keys = l_i > 0
        safe_l = tl.where(has_keys, l_i, 1.0)
        part = acc / safe_l[:, None]
        lse = tl.where(has_keys, m_i + tl.log2(safe_l), float("-inf"))
        row = (seq * num_q_heads + q_heads) * num_splits + split  # (G_PAD,)
        tl.store(part_out_ptr + row[:, None] * D_PAD + offs_d[None, :], part, mask=store_mask)
        tl.store(part_lse_ptr + row, lse, mask=g_mask)
    else:
        out = acc / l_i[:, None]  # l_i >= 1: the max score contributes exp2(0) = 1
        tl.store(
            out_ptr + seq * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=store_mask,
        )
# --8<-- [end:kernel]


# --8<-- [start:reduce]
@triton.jit
def split_reduce_kernel(
    # Pointers
    part_out_ptr,  # (B, Hq, num_splits, D_PAD) fp32
    part_lse_ptr,  # (B, Hq, num_splits) fp32
    out_ptr,  # (B, Hq, d)
    # Sizes
    num_splits,
    # Strides of out (the last axis is contiguous)
    stride_ob,
    stride_oh,
    # Meta-parameters
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    S_PAD: tl.constexpr,  # num_splits rounded up to a power of 2
):
    """out = sum_s w_s * part_s / sum_s w_s, with w_s = exp2(lse_s - max_s lse_s)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * tl.num_programs(1) + head

    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    # Padding splits (past num_splits) read as -inf, the same as empty splits.
    lse = tl.load(part_lse_ptr + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    has_keys = lse > float("-inf")
    lse_max = tl.max(lse, axis=0)  # finite: seq_len >= 1, so split 0 has keys
    # Empty splits weigh exactly 0, and their partial outputs are not even loaded, so no
    # NaN (0 * NaN) can reach the sum.
    w = tl.where(has_keys, tl.exp2(lse - lse_max), 0.0)
    part = tl.load(
        part_out_ptr + (row * num_splits + offs_s[:, None]) * D_PAD + offs_d[None, :],
        mask=has_keys[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
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
# Programs of the default configuration that fit on one SM at once: 106-122 registers x
# 128 threads and 40 KB of shared memory each cap it at 4 (ncu: "Block Limit Registers"
# 4, "Block Limit Shared Mem" 4). 132 SMs x 4 = 528 slots.
RESIDENT_PROGRAMS = 4
# Every program of one shape does the same work, so time goes in whole waves of `slots`
# programs: 768 programs (1.45 waves) took 153.6 us where 512 (0.97 waves) took 138.0
# at (B, L) = (32, 4096). Split until the last wave is at least this full.
MIN_WAVE_FILL = 0.9
# Upper bound on splits: the reduction loads all of one head's splits at once.
MAX_SPLITS = 128


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

    A split gets at least one tile, so short sequences are never split into empty work.
    """
    pairs = batch * num_kv_heads
    slots = programs_per_sm * num_sms
    at_most = max(1, min(-(-max_seq_len // tile_n), MAX_SPLITS))
    best = 1
    for splits in range(1, at_most + 1):
        fill = wave_fill(pairs * splits, slots)
        if fill >= MIN_WAVE_FILL:
            return splits
        if fill > wave_fill(pairs * best, slots):
            best = splits
    return best
# --8<-- [end:heuristics]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# --8<-- [start:launcher]
def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_n: int = DEFAULT_TILE_N,
    num_warps: int = DEFAULT_NUM_WARPS,
    num_stages: int = DEFAULT_NUM_STAGES,
    programs_per_sm: int = RESIDENT_PROGRAMS,
) -> torch.Tensor:
    """Decode attention over a paged KV cache; returns (B, Hq, d) in q's dtype.

    max_seq_len: the largest entry of seq_lens. Pass it when you know it (a serving
    loop does); otherwise it is read from seq_lens, a device-to-host sync that also
    makes the call impossible to capture in a CUDA graph.
    num_splits: keys per (sequence, KV head) are split across this many programs. None
    picks it from the shape and the GPU's SM count (1 under the CPU interpreter, which
    has no SM count). 1 turns the split-K path and its reduction kernel off.
    tile_n, num_warps, num_stages: the kernel's tuning knobs. programs_per_sm: how many
    programs of that configuration fit on one SM at once, for the split heuristic.
    """
    # (1) Checks
    if q.dim() != 3:
        raise ValueError(f"q must be (batch, num_q_heads, head_dim), got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be (num_blocks, block_size, num_kv_heads, head_dim), "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache must share strides, got {k_cache.stride()} and {v_cache.stride()}")
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
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError(f"block_tables and seq_lens must be int32, got {block_tables.dtype} and {seq_lens.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or tuple(seq_lens.shape) != (batch,):
        raise ValueError(
            f"block_tables must be ({batch}, max_blocks) and seq_lens ({batch},), "
            f"got {tuple(block_tables.shape)} and {tuple(seq_lens.shape)}"
        )
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = q.device
    if device.type == "cpu" and not _interpreting():
        raise ValueError("CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1 before importing triton")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or block_tables.stride(-1) != 1:
        raise ValueError("q, k_cache and block_tables must be contiguous along their last axis")
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise ValueError(f"tile_n must be a power of 2 and >= 16 (tl.dot's minimum), got {tile_n}")
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    if max_seq_len > block_tables.shape[1] * block_size:
        raise ValueError(
            f"max_seq_len {max_seq_len} exceeds the block table's capacity "
            f"({block_tables.shape[1]} blocks x {block_size} tokens)"
        )
    if num_splits is None:
        if device.type == "cuda":
            num_sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
            num_splits = choose_num_splits(batch, num_kv_heads, max_seq_len, num_sms, tile_n, programs_per_sm)
        else:
            num_splits = 1
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    if device.type == "cpu":
        from labs.paged_attention.interpreter_compat import patch_interpreter_index

        patch_interpreter_index()

    group_size = num_q_heads // num_kv_heads
    d_pad = triton.next_power_of_2(max(head_dim, 16))
    g_pad = max(16, triton.next_power_of_2(group_size))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    split = num_splits > 1

    # (2) Allocates
    out = torch.empty_like(q)
    if split:
        part_out = torch.empty(batch, num_q_heads, num_splits, d_pad, dtype=torch.float32, device=device)
        part_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=device)
    else:
        part_out = part_lse = out  # unused: the SPLIT=False branch is compiled out

    # (3) Launches
    paged_decode_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse,
        group_size, num_splits, scale * math.log2(math.e),
        q.stride(0), q.stride(1),
        k_cache.stride(0),  # assumes (num_blocks, BLOCK_SIZE, H_KV, D)
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        G_PAD=g_pad,
        TILE_N=tile_n,
        SPLIT=split,
        # fp32 inputs: exact products ("ieee"), not tf32's 10-bit mantissa. 16-bit inputs
        # ignore the setting.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if split:
        split_reduce_kernel[(batch, num_q_heads)](
            part_out, part_lse, out,
            num_splits,
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim,
            D_PAD=d_pad,
            S_PAD=triton.next_power_of_2(num_splits),
            num_warps=4,
        )
    return out
# --8<-- [end:launcher]
