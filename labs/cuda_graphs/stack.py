"""A few decoder layers with a real model's shapes, in plain torch: the step the graph lab captures.

Each layer is what an eager engine launches per token: residual add + RMSNorm, the
fused QKV projection, the KV-cache write, attention (SDPA over the cache), the
output projection, residual add + RMSNorm, gate/up projection, SiLU x up, down
projection. Rotary embeddings and Qwen3's q/k norms are left out: they add kernels
of the same kind, not a different cost. Shapes come from labs/data/models.yaml.

A decode step reads its inputs from fixed tensors (token states, cache position),
so one CUDA graph captured once replays every step: the condition vLLM's runner
meets by padding a batch to a captured size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labs.cuda_graphs.fused import fused_add_rmsnorm, unfused_add_rmsnorm


@dataclass(frozen=True)
class Shapes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    eps: float = 1e-6

    @classmethod
    def of(cls, model, layers: int) -> "Shapes":
        return cls(model.hidden_size, model.n_heads, model.n_kv_heads, model.head_dim, model.intermediate_size,
                   layers)


class Stack:
    """Weights and a KV cache for `shapes.layers` layers; decode(x) and prefill(x) run them."""

    def __init__(self, shapes: Shapes, context: int, batch: int, device="cuda", dtype=torch.bfloat16,
                 fused: bool = False, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        s = self.s = shapes
        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim

        def w(*shape):
            return (torch.randn(*shape, device=device, dtype=dtype, generator=g) * shape[0] ** -0.5)

        self.layers = [{"qkv": w(s.hidden, qkv), "o": w(s.heads * s.head_dim, s.hidden),
                        "gate_up": w(s.hidden, 2 * s.intermediate), "down": w(s.intermediate, s.hidden),
                        "n1": torch.ones(s.hidden, device=device, dtype=dtype),
                        "n2": torch.ones(s.hidden, device=device, dtype=dtype)} for _ in range(s.layers)]
        self.k_cache = [torch.randn(batch, s.kv_heads, context, s.head_dim, device=device, dtype=dtype, generator=g)
                        for _ in range(s.layers)]
        self.v_cache = [torch.randn_like(k) for k in self.k_cache]
        self.pos = torch.tensor([context - 1], device=device)  # the slot this step's K and V go to
        self.norm = fused_add_rmsnorm if fused else unfused_add_rmsnorm

    def _layer(self, lw, x, res, k_cache, v_cache, decode: bool):
        s = self.s
        y, res = self.norm(x, res, lw["n1"], s.eps)
        q, k, v = (y @ lw["qkv"]).split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
        if decode:  # x is (B, hidden): one new token per sequence
            b = x.shape[0]
            q = q.view(b, s.heads, 1, s.head_dim)
            k_cache.index_copy_(2, self.pos, k.view(b, s.kv_heads, 1, s.head_dim))
            v_cache.index_copy_(2, self.pos, v.view(b, s.kv_heads, 1, s.head_dim))
            a = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        else:  # x is (T, hidden): one sequence's prompt
            # A batch of one, 4-D: SDPA's fused backends take only 4-D inputs (torch 2.11 sends 3-D ones to
            # its math backend, which writes the whole score matrix).
            t = x.shape[0]
            q = q.view(1, t, s.heads, s.head_dim).transpose(1, 2)
            k = k.view(1, t, s.kv_heads, s.head_dim).transpose(1, 2)
            v = v.view(1, t, s.kv_heads, s.head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        x = a.reshape(x.shape[0], s.heads * s.head_dim) @ lw["o"]
        y, res = self.norm(x, res, lw["n2"], s.eps)
        gate, up = (y @ lw["gate_up"]).chunk(2, -1)
        return (F.silu(gate) * up) @ lw["down"], res

    def forward(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        res = torch.zeros_like(x)
        for i, lw in enumerate(self.layers):
            x, res = self._layer(lw, x, res, self.k_cache[i], self.v_cache[i], decode)
        return x + res


class Captured:
    """One CUDA graph of `fn(static_input)`; replay() reruns every kernel with one launch."""

    def __init__(self, fn, static_input: torch.Tensor):
        self.input = static_input
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: lazy init, autotuning, allocator
            for _ in range(2):
                fn(static_input)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = fn(static_input)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output
