"""Three Triton kernels, each adding one idea to the last, written for the Triton lesson.

vector add: one program per BLOCK elements; program_id, offsets and a mask.
softmax: one program per row; a whole row in registers, so it reads and writes each
  element once, where an unfused softmax (max, subtract, exp, sum, divide) makes
  several passes over memory; fp32 arithmetic whatever the input dtype.
matmul: one program per BLOCK_M x BLOCK_N tile of C; a loop over K in BLOCK_K steps
  with an fp32 accumulator, tl.dot on the tensor cores, masks for ragged edges, and
  programs ordered in groups of GROUP_M rows so neighbouring programs share tiles in L2.

Under TRITON_INTERPRET=1 the same kernels run on the CPU (tests/conftest.py sets it
when there is no GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labs.paged_attention.interpreter_compat import patch_interpreter_index

patch_interpreter_index()


# --8<-- [start:vector_add]
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)  # which block of BLOCK elements this program owns
    offsets = pid * BLOCK + tl.arange(0, BLOCK)  # BLOCK element indices, one vector
    mask = offsets < n  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor, block: int = 1024) -> torch.Tensor:
    _same(x, y)
    out = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, block),)
    add_kernel[grid](x, y, out, n, BLOCK=block)
    return out
# --8<-- [end:vector_add]


# --8<-- [start:softmax]
@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0)  # one program per row
    cols = tl.arange(0, BLOCK)  # BLOCK >= n_cols, a power of two
    mask = cols < n_cols
    # Columns past the end load -inf: exp(-inf) = 0, so they add nothing to the sum.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)  # the largest term becomes exp(0) = 1: no overflow
    num = tl.exp(x)
    out = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D tensor; rows up to MAX_SOFTMAX_COLS long."""
    if x.ndim != 2:
        raise ValueError(f"softmax takes a 2-D tensor, got {x.ndim}-D")
    rows, cols = x.shape
    if not 1 <= cols <= MAX_SOFTMAX_COLS:
        raise ValueError(f"rows must hold 1 to {MAX_SOFTMAX_COLS} columns (one program keeps a row in registers), got {cols}")
    if x.stride(1) != 1:
        raise ValueError("softmax needs contiguous rows (stride 1 along the last dimension)")
    out = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    num_warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=num_warps)
    return out
# --8<-- [end:softmax]


MAX_SOFTMAX_COLS = 32768


# --8<-- [start:matmul]
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Program ids walk the tiles of C in groups of GROUP_M tile-rows, column by column
    # inside a group, so programs running at the same time reuse the same A and B tiles.
    pid = tl.program_id(axis=0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak  # BLOCK_M x BLOCK_K pointers
    b_tile = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn  # BLOCK_K x BLOCK_N pointers

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp32 whatever the inputs
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_tile, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_tile, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)  # zeros past the edges add nothing
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    c = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 128, block_n: int = 128, block_k: int = 64,
           group_m: int = 8, num_warps: int = 8, num_stages: int = 3) -> torch.Tensor:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul takes (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"a and b must share dtype and device, got {a.dtype}/{a.device} and {b.dtype}/{b.device}")
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's minimum), got {v}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                        GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    return c
# --8<-- [end:matmul]


def _same(x: torch.Tensor, y: torch.Tensor) -> None:
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError(f"x and y must share shape, dtype and device, got {tuple(x.shape)} {x.dtype} {x.device} "
                         f"and {tuple(y.shape)} {y.dtype} {y.device}")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("add needs contiguous tensors")
