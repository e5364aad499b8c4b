"""Residual add + RMSNorm in one Triton kernel, and the same in plain torch ops.

A transformer layer does `h = x + residual; y = rmsnorm(h) * weight` twice. In torch
eager that is an add, a cast, a square, a mean, an rsqrt, two multiplies and a cast:
several kernels, each reading and writing a hidden-size row from HBM. Fused, one
program per row reads x and residual once and writes h and y once. At decode sizes
the win is launches; at prefill sizes it is bytes.

Under TRITON_INTERPRET=1 the kernel runs on the CPU (tests/conftest.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labs.paged_attention.interpreter_compat import patch_interpreter_index

patch_interpreter_index()


# --8<-- [start:fused_add_rmsnorm]
@triton.jit
def add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    h = x + r
    tl.store(h_ptr + row * hidden + cols, h.to(h_ptr.dtype.element_ty), mask=mask)  # the new residual
    inv_rms = 1.0 / tl.sqrt(tl.sum(h * h, 0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * hidden + cols, (h * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)
# --8<-- [end:fused_add_rmsnorm]


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual) * weight, x + residual) for x, residual (rows, hidden) contiguous."""
    if x.dim() != 2 or x.shape != residual.shape or weight.shape != (x.shape[1],):
        raise ValueError(f"x and residual must be (rows, hidden) and weight (hidden,); got {tuple(x.shape)}, "
                         f"{tuple(residual.shape)}, {tuple(weight.shape)}")
    if not (x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()):
        raise ValueError("x, residual and weight must be contiguous")
    rows, hidden = x.shape
    y, h = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(hidden)
    add_rmsnorm_kernel[(rows,)](x, residual, weight, y, h, hidden, eps, BLOCK=block,
                                num_warps=4 if block <= 2048 else 8)
    return y, h


def unfused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """The same in torch ops, as an eager model writes it: one kernel per op."""
    h = x + residual
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype), h


def rmsnorm_bytes(rows: int, hidden: int, element_bytes: int = 2) -> int:
    """What the fused kernel must move: x and residual read, h and y written, the weight read once."""
    return (4 * rows + 1) * hidden * element_bytes
