"""Weight-only int8 and int4 GEMM with the dequantisation inside a Triton kernel: Y = X W_hat^T.

At decode sizes (M = 1-256 rows of X) a projection's time is the time to read its weights,
so storing W in 8 or 4 bits and widening it to 16 bits in registers, after the load and
before the tensor-core product, cuts the bytes read 2x or ~3.9x while the product stays
bf16/fp16 (W8A16, W4A16: what Marlin does in vLLM, here without Marlin's reordered layout).

Layouts (W is the Linear's (N, K) weight):
- int8: q (N, K) int8, symmetric, one fp32 scale per output channel (N,).
- int4: q (N, K/2) uint8, two values per byte along K (low nibble = even k), each
  value stored as v + 8 in [0, 15]; one fp32 scale per output channel per group of g
  along K, (N, K/g). Symmetric, as GPTQ's default sym=True checkpoints.
`quantize_int8` / `quantize_int4` build these from a float weight (round to nearest) and
`dequantize_*` undo them: the reference the tests and the benchmark compare with.
"""

from __future__ import annotations

import triton
import triton.language as tl


def quantize_int8(torch, w):
    scale = (w.float().abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.clamp(torch.round(w.float() / scale[:, None]), -128, 127).to(torch.int8)
    return q, scale


def dequantize_int8(torch, q, scale, dtype):
    return (q.float() * scale[:, None]).to(dtype)


def quantize_int4(torch, w, group: int = 128):
    n, k = w.shape
    if k % group or group % 2:
        raise ValueError(f"K = {k} must be a multiple of the group size {group}, itself even")
    g = w.float().reshape(n, k // group, group)
    scale = (g.abs().amax(dim=2) / 7).clamp_min(1e-12)
    v = torch.clamp(torch.round(g / scale[:, :, None]), -8, 7).reshape(n, k).to(torch.int16) + 8
    packed = (v[:, 0::2] | (v[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale


def dequantize_int4(torch, packed, scale, group: int, dtype):
    p = packed.to(torch.int16)
    n = p.shape[0]
    v = torch.stack([p & 0xF, p >> 4], dim=2).reshape(n, -1).float() - 8
    return (v.reshape(n, -1, group) * scale[:, :, None]).reshape(n, -1).to(dtype)


@triton.jit
def _wo_gemm(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_sn, stride_ym,
             BITS: tl.constexpr, GROUP: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BITS == 8:
        col_scale = tl.load(s_ptr + rn, mask=rn < N, other=0.0)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K),
                    other=0.0)
        wmask = (k[:, None] < K) & (rn[None, :] < N)
        if BITS == 8:
            w = tl.load(q_ptr + rn[None, :] * stride_qn + k[:, None], mask=wmask, other=0).to(tl.float32)
        else:
            byte = tl.load(q_ptr + rn[None, :] * stride_qn + (k[:, None] // 2), mask=wmask, other=0).to(tl.int32)
            nibble = (byte >> ((k[:, None] % 2) * 4)) & 0xF
            scale = tl.load(s_ptr + rn[None, :] * stride_sn + (k[:, None] // GROUP), mask=wmask, other=0.0)
            w = (nibble.to(tl.float32) - 8.0) * scale
        acc += tl.dot(x, w.to(x.dtype))
    if BITS == 8:
        acc = acc * col_scale[None, :]  # a per-channel scale factors out of the K sum
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _block_m(m: int) -> int:
    return 16 if m <= 16 else (32 if m <= 32 else 64)


def _block_n(n: int, programs: int = 264) -> int:
    """Narrow column tiles for narrow layers: at decode sizes there is one program row, so the
    grid has N / BLOCK_N programs, and fewer than about two per SM leave HBM bandwidth unused.
    (No split over K here: k_proj's 1,024 columns still give only 64 programs of 16.)"""
    b = 64
    while b > 16 and n / b < programs:
        b //= 2
    return b


def weight_only_gemm(torch, x, q, scale, bits: int, group: int = 128, block_n: int | None = None,
                     block_k: int = 64):
    """Y (M, N) in x's dtype from x (M, K) and an int8 (bits=8) or packed int4 (bits=4) weight."""
    if x.ndim != 2 or not x.is_contiguous():
        raise ValueError("x must be a contiguous (M, K) matrix")
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    m, k = x.shape
    n = q.shape[0]
    if q.shape[1] * (2 if bits == 4 else 1) != k:
        raise ValueError(f"weight holds K = {q.shape[1] * (2 if bits == 4 else 1)}, x has K = {k}")
    if bits == 4 and (group % block_k or k % group):
        raise ValueError(f"group {group} must be a multiple of BLOCK_K {block_k} and divide K = {k}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm = _block_m(m)
    block_n = block_n or _block_n(n)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, block_n))
    _wo_gemm[grid](x, q, scale, y, m, n, k, x.stride(0), q.stride(0), scale.stride(0) if bits == 4 else 0,
                   y.stride(0), BITS=bits, GROUP=group, BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k)
    return y
