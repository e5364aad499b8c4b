"""A FlashAttention forward kernel in Triton: tiles of Q against tiles of K and V, online softmax.

One program owns BLOCK_M query rows of one (sequence, query head). It walks the keys
BLOCK_N at a time, keeping three things on chip: the running row maximum m, the
running sum of exponentials l, and the unnormalised output acc. A new tile of scores
that raises the maximum rescales l and acc by exp(m_old - m_new) before adding its
own terms, so the result equals softmax(QK^T)V without the q_len x kv_len score
matrix ever reaching HBM. Causal attention is bottom-right aligned (query i of q_len
sees keys 0 .. kv_len - q_len + i), the way a chunk after a cached prefix or a
decode step sees its context, and the key loop stops at the tile's last visible key.

Grouped-query attention: query head h reads KV head h // (H_q / H_kv).
Under TRITON_INTERPRET=1 the same kernel runs on the CPU (tests/conftest.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from labs.paged_attention.interpreter_compat import patch_interpreter_index

patch_interpreter_index()

LOG2E = 1.4426950408889634


# --8<-- [start:flash_forward]
@triton.jit
def flash_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, q_len, kv_len, q_heads, group,
                         s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_ob, s_oh, s_om,
                         CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         HEAD_DIM: tl.constexpr):
    pid_m = tl.program_id(0)  # which BLOCK_M query rows
    bh = tl.program_id(1)  # which (sequence, query head)
    b, h = bh // q_heads, bh % q_heads
    kvh = h // group
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * s_qb + h * s_qh + rows[:, None] * s_qm + cols[None, :],
                mask=rows[:, None] < q_len, other=0.0)
    k_base = k_ptr + b * s_kb + kvh * s_kh
    v_base = v_ptr + b * s_kb + kvh * s_kh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running sum of p @ V
    past = kv_len - q_len
    end = kv_len
    if CAUSAL:  # the last key any row of this tile sees
        end = tl.minimum(kv_len, past + (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + keys[:, None] * s_kn + cols[None, :], mask=keys[:, None] < kv_len, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N) scores, log2 units
        visible = keys[None, :] < kv_len
        if CAUSAL:
            visible = visible & (keys[None, :] <= past + rows[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * s_kn + cols[None, :], mask=keys[:, None] < kv_len, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * s_ob + h * s_oh + rows[:, None] * s_om + cols[None, :], out.to(o_ptr.dtype.element_ty),
             mask=rows[:, None] < q_len)
# --8<-- [end:flash_forward]


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                    num_stages: int | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for q (B, H_q, q_len, d), k and v (B, H_kv, kv_len, d); returns q's shape.

    Defaults: 128 x 64 tiles, 8 warps, 3 stages on a GPU; 16 x 16 tiles under the
    interpreter. block_m drops to 16 for a short q_len (decode), where most rows
    of a larger tile would be padding.
    """
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be (B, H_q, q_len, d) and k, v the same (B, H_kv, kv_len, d); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    bsz, hq, q_len, d = q.shape
    _, hkv, kv_len, dk = k.shape
    if k.shape[0] != bsz or dk != d:
        raise ValueError(f"batch and head_dim of k ({k.shape[0]}, {dk}) must match q's ({bsz}, {d})")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if q_len > kv_len or q_len < 1:
        raise ValueError(f"need 1 <= q_len <= kv_len, got q_len={q_len}, kv_len={kv_len}")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride() != k.stride():
        raise ValueError("the last axis must be contiguous and v must have k's strides")
    interpret = not q.is_cuda
    bm = block_m or (16 if interpret or q_len <= 16 else 128)
    bn = block_n or (16 if interpret else 64)
    o = torch.empty_like(q)
    grid = (triton.cdiv(q_len, bm), bsz * hq)
    flash_forward_kernel[grid](
        q, k, v, o, LOG2E / math.sqrt(d), q_len, kv_len, hq, hq // hkv,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d,
        num_warps=num_warps or (8 if bm >= 128 else 4), num_stages=num_stages or (3 if not interpret else 1))
    return o


def causal_drop(q_len: int, kv_len: int, group: int, device) -> torch.Tensor:
    """(group * q_len, kv_len) booleans, True where query i may not see key j (bottom-right aligned).

    Rows repeat per query head of a KV head, matching naive_attention's stacked layout.
    """
    keep = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)
    return (~keep).repeat(group, 1)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    drop: torch.Tensor | None = None) -> torch.Tensor:
    """The textbook version: S = QK^T materialised in HBM, a softmax over it, then PV.

    The passes over S are the ones the cost model counts: QK^T writes S, the softmax
    reads S and writes P, PV reads P; a causal mask (masked_fill, with `keep`
    precomputed or built here) reads S and the mask and writes S once more (pass `drop` from causal_drop
    to keep building the mask out of a timing). The scale
    is applied to q, not to S, and grouped-query heads share their KV head through a
    view, so neither adds a pass over an L-sized tensor.
    """
    b, hq, q_len, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    group = hq // hkv
    qg = (q * (1.0 / math.sqrt(d))).reshape(b, hkv, group * q_len, d)  # a KV head's query heads, stacked
    s = torch.matmul(qg, k.transpose(-1, -2))  # (b, hkv, group * q_len, kv_len)
    if causal:
        drop = causal_drop(q_len, kv_len, group, q.device) if drop is None else drop
        s = s.masked_fill(drop, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v).reshape(b, hq, q_len, d)


def reference_attention(q, k, v, causal: bool = False) -> torch.Tensor:
    """fp32 naive attention: what the tests compare against."""
    return naive_attention(q.float(), k.float(), v.float(), causal)
