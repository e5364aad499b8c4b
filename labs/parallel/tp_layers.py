"""A Llama-style decoder layer, whole and split Megatron-style over tensor-parallel ranks.

The split is the one vLLM uses (vllm/model_executor/layers/linear.py):

* **Column-parallel first.** q/k/v and gate/up are split by output rows:
  rank r gets its heads (attention) or its slice of the intermediate size
  (MLP). Each rank computes its part from the full input with no
  communication, and the nonlinearity (softmax per head, SiLU x up per
  element) needs only its own part.
* **Row-parallel second.** o_proj and down_proj are split by input columns to
  match, so each rank's product is a partial sum of the full output. One
  all-reduce per block adds the partial sums: two per decoder layer.

KV heads follow QKVParallelLinear: with TP <= H_kv each rank owns H_kv / TP of
them; with TP > H_kv each rank owns one, and TP / H_kv ranks hold copies of
it. TP must divide H_q and either divide H_kv or be a multiple of it, which is
what vLLM checks (vllm/config/model.py verify_with_parallel_config).

Everything here is plain torch (float32 on CPU, bf16 on GPU); the all-reduce
is passed in, so the same code runs under gloo, NCCL, or a test that counts
the calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

AllReduce = Callable[[torch.Tensor], None]


class ShardError(ValueError):
    """A TP degree the layer's head counts cannot be split over."""


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def check_tp(self, tp: int) -> None:
        if tp < 1:
            raise ShardError(f"TP must be at least 1, got {tp}")
        if self.n_heads % tp:
            raise ShardError(f"TP = {tp} does not divide the {self.n_heads} query heads")
        if self.n_kv_heads % tp and tp % self.n_kv_heads:
            raise ShardError(f"TP = {tp} neither divides nor is a multiple of the {self.n_kv_heads} KV heads")
        if self.intermediate % tp:
            raise ShardError(f"TP = {tp} does not divide the intermediate size {self.intermediate}")


def random_weights(shape: LayerShape, seed: int = 0, dtype=torch.float32, device="cpu") -> dict[str, torch.Tensor]:
    """Full (unsplit) weights, scaled so activations stay O(1) through the layer."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    h, i, d = shape.hidden, shape.intermediate, shape.head_dim

    def mat(rows, cols):
        return (torch.randn(rows, cols, generator=g) / math.sqrt(cols)).to(dtype=dtype, device=device)

    return {
        "attn_norm": (1 + 0.1 * torch.randn(h, generator=g)).to(dtype=dtype, device=device),
        "q": mat(shape.n_heads * d, h),
        "k": mat(shape.n_kv_heads * d, h),
        "v": mat(shape.n_kv_heads * d, h),
        "o": mat(h, shape.n_heads * d),
        "mlp_norm": (1 + 0.1 * torch.randn(h, generator=g)).to(dtype=dtype, device=device),
        "gate": mat(i, h),
        "up": mat(i, h),
        "down": mat(h, i),
    }


# ---------------------------------------------------------------------------
# Pieces shared by the whole and the split layer
# ---------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, neox layout (halves rotated), on [tokens, heads, head_dim]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of one sequence: q [T, Hq, d], k and v [T, Hkv, d] -> [T, Hq*d]."""
    t, hq, d = q.shape
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1).reshape(t, hq * d)


# ---------------------------------------------------------------------------
# The whole layer (the reference)
# ---------------------------------------------------------------------------


def attention_block(x, w, shape: LayerShape, positions):
    """Pre-norm attention; returns the block's output (before the residual add)."""
    t = x.shape[0]
    hn = rms_norm(x, w["attn_norm"], shape.eps)
    q = (hn @ w["q"].T).view(t, -1, shape.head_dim)
    k = (hn @ w["k"].T).view(t, -1, shape.head_dim)
    v = (hn @ w["v"].T).view(t, -1, shape.head_dim)
    q, k = rope(q, positions, shape.rope_theta), rope(k, positions, shape.rope_theta)
    return attention_core(q, k, v) @ w["o"].T


def mlp_block(x, w, shape: LayerShape):
    hn = rms_norm(x, w["mlp_norm"], shape.eps)
    return (F.silu(hn @ w["gate"].T) * (hn @ w["up"].T)) @ w["down"].T


def decoder_layer(x, w, shape: LayerShape, positions):
    x = x + attention_block(x, w, shape, positions)
    return x + mlp_block(x, w, shape)


# ---------------------------------------------------------------------------
# The split layer
# ---------------------------------------------------------------------------


def kv_heads_of_rank(shape: LayerShape, tp: int, rank: int) -> range:
    """The KV heads rank `rank` holds (one replicated head when TP > H_kv)."""
    if tp <= shape.n_kv_heads:
        per = shape.n_kv_heads // tp
        return range(rank * per, (rank + 1) * per)
    replicas = tp // shape.n_kv_heads
    return range(rank // replicas, rank // replicas + 1)


def shard(w: dict[str, torch.Tensor], shape: LayerShape, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slices: rows of the column-parallel weights, columns of the row-parallel ones."""
    shape.check_tp(tp)
    d = shape.head_dim
    hq = shape.n_heads // tp
    q_rows = slice(rank * hq * d, (rank + 1) * hq * d)
    kv = kv_heads_of_rank(shape, tp, rank)
    kv_rows = slice(kv.start * d, kv.stop * d)
    per = shape.intermediate // tp
    i_rows = slice(rank * per, (rank + 1) * per)
    return {
        "attn_norm": w["attn_norm"], "mlp_norm": w["mlp_norm"],   # replicated
        "q": w["q"][q_rows].contiguous(),                           # column-parallel
        "k": w["k"][kv_rows].contiguous(),
        "v": w["v"][kv_rows].contiguous(),
        "o": w["o"][:, q_rows].contiguous(),                        # row-parallel
        "gate": w["gate"][i_rows].contiguous(),
        "up": w["up"][i_rows].contiguous(),
        "down": w["down"][:, i_rows].contiguous(),
    }


def tp_attention_block(x, ws, shape: LayerShape, positions, all_reduce: AllReduce):
    """This rank's heads end to end, then one all-reduce of the o_proj partial sums."""
    partial = attention_block(x, ws, shape, positions)
    all_reduce(partial)
    return partial


def tp_mlp_block(x, ws, shape: LayerShape, all_reduce: AllReduce):
    """This rank's slice of the intermediate size, then one all-reduce of the down_proj partial sums."""
    partial = mlp_block(x, ws, shape)
    all_reduce(partial)
    return partial


def tp_decoder_layer(x, ws, shape: LayerShape, positions, all_reduce: AllReduce):
    x = x + tp_attention_block(x, ws, shape, positions, all_reduce)
    return x + tp_mlp_block(x, ws, shape, all_reduce)
