"""A Llama-family decoder over packed tokens: RMSNorm, RoPE (llama3 scaling), GQA, SwiGLU.

The model sees one flat batch of T tokens from many sequences (prefill chunks and decodes
mixed) plus their positions; attention is the only place sequences are told apart, and it
is a callable the runner passes in (it knows the cache and the block tables). Projections
are fused as vLLM fuses them, so a step makes two matmuls where Hugging Face makes five:
q, k and v in one (`qkv`), gate and up in one (`gate_up`).

Rounding follows transformers' LlamaForCausalLM, so the two agree to bf16 noise: RMSNorm in
fp32 then cast back before the weight, RoPE's cos/sin built in fp32 and cast to the
activations' dtype, residual adds in the activations' dtype.

Random weights (`init_random`): a normal per matrix with std 1/sqrt(fan_in), so each
projection keeps its input's scale; the two that write into the residual stream (o and
down) are scaled by a further 1/sqrt(2 * n_layers), so the stream's variance grows by about
1 over the whole model instead of per layer, and every activation stays finite in bf16.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from labs.engine.config import ModelConfig

# attention(layer, q (T, Hq, d), k (T, Hkv, d), v (T, Hkv, d)) -> (T, Hq, d); k = v = None when the fused
# path has already written them into the cache (LlamaModel._forward_fused)
Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies per rotary pair, with Llama 3's scaling when the config has it.

    Llama 3 leaves high frequencies (wavelength below original_len / high_freq_factor) alone,
    divides low ones (wavelength above original_len / low_freq_factor) by `factor`, and blends
    linearly in between (Hugging Face `_compute_llama3_parameters`).
    """
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s is None:
        return inv
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_size, self.kv_size = cfg.n_heads * d, cfg.n_kv_heads * d
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.qkv = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=False)
        self.o = nn.Linear(self.q_size, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.cfg = cfg


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.fused = True  # on CUDA, the elementwise ops run as labs/engine/fused.py's kernels

    # --- weights ---------------------------------------------------------------

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded weights that keep activations finite (module docstring).

        Drawn on the parameters' device (an 8B model's weights take milliseconds on a GPU and
        minutes on a CPU), so one seed gives the same weights on every machine of one kind.
        """
        g = torch.Generator(device=self.embed.weight.device).manual_seed(seed)
        residual = 1 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
                continue
            std = 1.0 if name == "embed.weight" else 1 / math.sqrt(p.shape[1])
            if name.endswith(("o.weight", "down.weight")):
                std *= residual
            p.normal_(0.0, std, generator=g)

    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face Llama weights (model.layers.N.self_attn.q_proj.weight, ...), fusing q/k/v and gate/up."""
        def get(key):
            if key not in sd:
                raise KeyError(f"weights have no tensor {key!r}")
            return sd[key]

        self.embed.weight.copy_(get("model.embed_tokens.weight"))
        self.norm.weight.copy_(get("model.norm.weight"))
        if not self.cfg.tie_word_embeddings:
            self.lm_head.weight.copy_(sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            layer.qkv.weight.copy_(torch.cat([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"]))
            layer.o.weight.copy_(get(p + "self_attn.o_proj.weight"))
            layer.gate_up.weight.copy_(torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]))
            layer.down.weight.copy_(get(p + "mlp.down_proj.weight"))
            layer.input_layernorm.weight.copy_(get(p + "input_layernorm.weight"))
            layer.post_attention_layernorm.weight.copy_(get(p + "post_attention_layernorm.weight"))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The same weights under Hugging Face's names, unfused (for the reference in tests)."""
        sd = {"model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm.weight,
              "lm_head.weight": self.lm_head.weight}
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            q, k, v = layer.qkv.weight.split([layer.q_size, layer.kv_size, layer.kv_size])
            gate, up = layer.gate_up.weight.chunk(2)
            sd.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                       p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": layer.o.weight,
                       p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                       p + "mlp.down_proj.weight": layer.down.weight,
                       p + "input_layernorm.weight": layer.input_layernorm.weight,
                       p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight})
        return sd

    # --- forward -----------------------------------------------------------------

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, (T, 1, head_dim), for the given positions."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        """Hidden states (T, hidden) after the final norm, for T packed tokens."""
        cfg = self.cfg
        x = self.embed(input_ids)
        cos, sin = self.rope(positions, x.dtype)
        if self.fused and x.is_cuda:
            return self._forward_fused(x, cos, sin, attention)
        for i, layer in enumerate(self.layers):
            residual = x
            q, k, v = layer.qkv(layer.input_layernorm(x)).split([layer.q_size, layer.kv_size, layer.kv_size], -1)
            q = q.view(-1, cfg.n_heads, cfg.head_dim)
            k = k.view(-1, cfg.n_kv_heads, cfg.head_dim)
            v = v.view(-1, cfg.n_kv_heads, cfg.head_dim)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            o = attention(i, q, k, v).reshape(-1, layer.q_size)
            x = residual + layer.o(o)
            residual = x
            gate, up = layer.gate_up(layer.post_attention_layernorm(x)).chunk(2, dim=-1)
            x = residual + layer.down(F.silu(gate) * up)
        return self.norm(x)

    def _forward_fused(self, x, cos, sin, attention: Attention) -> torch.Tensor:
        """forward() with fused kernels; each residual add moves into the next norm, as in vLLM.

        When the attention callable has a `kv_target(layer)` that returns (k_cache, v_cache,
        slots), RoPE writes each token's k and v into the cache itself and the callable gets
        k = v = None; a None target (an fp8 cache, which needs scaling) keeps the old split.
        """
        from labs.engine import fused

        cfg, residual, h = self.cfg, None, x
        kv_target = getattr(attention, "kv_target", None)
        for i, layer in enumerate(self.layers):
            normed, residual = fused.add_rms_norm(h, layer.input_layernorm.weight, cfg.rms_norm_eps, residual)
            qkv = layer.qkv(normed)
            target = kv_target(i) if kv_target is not None else None
            if target is not None:  # k and v go straight into the paged cache
                q = fused.rope_and_cache(qkv, cos, sin, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, *target)
                k = v = None
            else:
                q, k = fused.rope(qkv, cos, sin, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
                v = qkv[:, layer.q_size + layer.kv_size:].view(-1, cfg.n_kv_heads, cfg.head_dim)
            h = layer.o(attention(i, q, k, v).reshape(-1, layer.q_size))
            normed, residual = fused.add_rms_norm(h, layer.post_attention_layernorm.weight, cfg.rms_norm_eps, residual)
            h = layer.down(fused.silu_mul(layer.gate_up(normed)))
        return fused.add_rms_norm(h, self.norm.weight, cfg.rms_norm_eps, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
