"""Fused elementwise kernels for the decode step: RMSNorm (with the residual add), RoPE with the K/V cache write, SiLU-and-mul.

Why: at small batch a decode step is a few large matmuls and many tiny elementwise ops. Written
in torch, one Llama layer launches about 40 kernels (RMSNorm alone is seven: cast, square,
mean, rsqrt, multiply, cast, weight); each runs for a few microseconds even inside a CUDA
graph, so 32 layers add milliseconds to a step whose weight read takes 3.5 ms. vLLM fuses the
same three groups (its `fused_add_rms_norm`, `rotary_embedding` and `silu_and_mul` ops).

`rope_and_cache` goes one step further: one launch rotates q and k for every head and stores
the rotated k and the v straight into the paged cache at each token's slot. Unfused, that was
two RoPE launches and two `index_put` writes (plus a copy of the strided v) per layer: at
B = 1 the cache writes alone were most of the non-matmul time of a captured step.

Each kernel rounds where transformers' LlamaForCausalLM rounds, so the fused model keeps the
torch path's numbers to within float32 reduction order:

* add + RMSNorm: the residual sum is rounded to the activations' dtype (it becomes the new
  residual), normalised in float32, cast back, then multiplied by the weight and rounded.
* RoPE: x * cos and rotate_half(x) * sin are each rounded, then their sum (as torch does
  three bf16 ops).
* SiLU-and-mul: silu(gate) is rounded, then its product with up.

The model uses them on CUDA only; the CPU tests check them against the torch ops under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n, eps,
                         HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * n + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n
    y = (xf * (1.0 / tl.sqrt_rn(var + eps))).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * n + cols, out, mask=mask)


# --8<-- [start:add_rms_norm]
def add_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) * weight, x + residual); without residual, (norm(x) * weight, x)."""
    x = x.contiguous()
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    rows = x.numel() // n
    if rows:
        _add_rms_norm_kernel[(rows,)](x, residual.contiguous() if residual is not None else x, weight, out, res_out,
                                      n, eps, HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n))
    return out, res_out
# --8<-- [end:add_rms_norm]


@triton.jit
def _rotate(src, dst, cos_row, sin_row, i, HALF: tl.constexpr):
    """dst = RoPE(src) for one head: halves (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).

    Each product is rounded to dst's dtype before the sum, as the eager x * cos + rotate_half(x) * sin does.
    """
    ty = dst.dtype.element_ty
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    c1 = tl.load(cos_row + i).to(tl.float32)
    c2 = tl.load(cos_row + HALF + i).to(tl.float32)
    s1 = tl.load(sin_row + i).to(tl.float32)
    s2 = tl.load(sin_row + HALF + i).to(tl.float32)
    o1 = (x1 * c1).to(ty).to(tl.float32) + (-x2 * s1).to(ty).to(tl.float32)
    o2 = (x2 * c2).to(ty).to(tl.float32) + (x1 * s2).to(ty).to(tl.float32)
    tl.store(dst + i, o1.to(ty))
    tl.store(dst + HALF + i, o2.to(ty))


@triton.jit
def _rope_kernel(src_ptr, src_row_stride, src_col0, cos_ptr, sin_ptr, dst_ptr, n_heads,
                 D: tl.constexpr, HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    src = src_ptr + t * src_row_stride + src_col0 + h * D
    _rotate(src, dst_ptr + (t * n_heads + h) * D, cos_ptr + t * D, sin_ptr + t * D, i, HALF)


@triton.jit
def _rope_cache_kernel(src_ptr, src_row_stride, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, slot_ptr, slot_stride,
                       n_heads, n_kv_heads, D: tl.constexpr, HALF: tl.constexpr):
    """Program (t, h): h < n_heads rotates query head h into q; else KV head h - n_heads goes to the cache."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    if h < n_heads:
        src = src_ptr + t * src_row_stride + h * D
        dst = q_ptr + (t * n_heads + h) * D
    else:
        j = h - n_heads
        src = src_ptr + t * src_row_stride + (n_heads + j) * D
        slot = tl.load(slot_ptr + t * slot_stride).to(tl.int64)
        dst = kc_ptr + (slot * n_kv_heads + j) * D
        v_src = src_ptr + t * src_row_stride + (n_heads + n_kv_heads + j) * D
        v_dst = vc_ptr + (slot * n_kv_heads + j) * D
        tl.store(v_dst + i, tl.load(v_src + i))
        tl.store(v_dst + HALF + i, tl.load(v_src + HALF + i))
    _rotate(src, dst, cos_ptr + t * D, sin_ptr + t * D, i, HALF)


# --8<-- [start:rope_and_cache]
def rope_and_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int,
                   head_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rotated q (T, Hq, d); the rotated k and the v of token t are stored at cache row slots[t].

    k_cache, v_cache: (num_blocks, block_size, Hkv, d) in qkv's dtype (an fp8 cache needs
    `PagedKVCache.write`, which scales). slots: (T,) int32 or int64, slot = block * block_size + offset.
    """
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    t = qkv.shape[0]
    if k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype:
        raise ValueError(f"the cache must hold qkv's dtype {qkv.dtype}, got {k_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if slots.shape != (t,):
        raise ValueError(f"slots must be ({t},), got {tuple(slots.shape)}")
    cos, sin = cos.reshape(t, head_dim).contiguous(), sin.reshape(t, head_dim).contiguous()
    q = torch.empty(t, n_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if t:
        _rope_cache_kernel[(t, n_heads + n_kv_heads)](qkv, qkv.stride(0), cos, sin, q, k_cache, v_cache, slots,
                                                       slots.stride(0), n_heads, n_kv_heads, D=head_dim,
                                                       HALF=head_dim // 2)
    return q
# --8<-- [end:rope_and_cache]


def rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int,
         head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated q (T, Hq, d) and k (T, Hkv, d), contiguous, from the fused qkv projection (T, (Hq + 2 Hkv) d).

    cos and sin: (T, d) (or (T, 1, d)) in the activations' dtype, as LlamaModel.rope builds them.
    """
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    t = qkv.shape[0]
    cos, sin = cos.reshape(t, head_dim).contiguous(), sin.reshape(t, head_dim).contiguous()
    q = torch.empty(t, n_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, n_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if t:
        for dst, col0, heads in ((q, 0, n_heads), (k, n_heads * head_dim, n_kv_heads)):
            _rope_kernel[(t, heads)](qkv, qkv.stride(0), col0, cos, sin, dst, heads, D=head_dim, HALF=head_dim // 2)
    return q, k


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(x_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * n + n + cols, mask=mask, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    s = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (s * u).to(ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = cat(gate, up) along the last dim, (T, 2I) -> (T, I)."""
    gate_up = gate_up.contiguous()
    t, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(t, n, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    if t:
        _silu_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, n, BLOCK=block)
    return out
