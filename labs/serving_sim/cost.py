"""Roofline cost of one engine step: the time model every simulation here uses.

One step of an iteration-level engine runs one forward pass over every token
the scheduler picked, whatever mix of prefill chunks and decode tokens that is.
Its time is bounded below by two roofs:

    t_step = max(bytes moved / HBM bandwidth, FLOPs / dense bf16 FLOP/s) + overhead

* Bytes: the weights are read once per step, however many tokens share them
  (that is why decode is memory-bound and batching is nearly free); each
  scheduled request reads the KV of its context and writes the KV of its new
  tokens.
* FLOPs: 2 per parameter per token for the matmuls (the LM head only for the
  rows that sample a token, as vLLM computes logits only there), plus attention:
  QK^T and PV are 4 * n_layers * H_q * d FLOPs per (query, key) pair, and a
  chunk of n new tokens after c cached ones has n*c + n(n+1)/2 pairs (causal).

What it leaves out, on purpose: kernel efficiency below the roofs, launch and
CPU overhead (a fixed `overhead_s` per step stands in), and communication
(single GPU, TP 1). So its times are ideal lower bounds; compare policies with
it, never quote its milliseconds as measured.

Dense full-attention models only: MoE (which experts a batch touches), MLA and
sliding-window layers change the byte count in ways this model does not track,
so they are refused with a message rather than costed wrongly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from labs.kv_sizing.formula import kv_bytes_per_token
from labs.specs import GPUSpec, ModelSpec, SpecError


class Chunk(NamedTuple):
    """The work one request adds to a step: `new` tokens after `cached` ones.

    `samples` is True when the chunk ends the request's known tokens, so the
    step samples a token for it (a decode token, or the last prefill chunk).
    """

    new: int
    cached: int
    samples: bool = True


def check_dense(model: ModelSpec) -> None:
    """Refuse models whose bytes per step this roofline does not model."""
    kinds = []
    if model.moe is not None:
        kinds.append("MoE")
    if model.mla is not None:
        kinds.append("MLA")
    if model.sliding_window is not None:
        kinds.append("sliding-window layers")
    if kinds:
        raise SpecError(
            f"{model.name} has {' and '.join(kinds)}; the serving simulator models dense "
            "full-attention models only (try llama-3.1-8b, qwen3-8b, mistral-7b)"
        )


@dataclass(frozen=True)
class Roofline:
    """Step-time model for one dense model on one GPU (TP 1)."""

    model: ModelSpec
    gpu: GPUSpec
    kv_cache_dtype: str = "auto"
    overhead_s: float = 0.0

    def __post_init__(self):
        check_dense(self.model)
        if self.gpu.dense_tflops.get("bf16") is None:
            raise SpecError(f"{self.gpu.name} has no dense bf16 FLOP/s in labs/data/gpus.yaml")
        if self.overhead_s < 0:
            raise SpecError(f"step overhead must be >= 0 s, got {self.overhead_s}")

    # --- parameters, split by how a step touches them -----------------------

    @functools.cached_property
    def lm_head_params(self) -> int:
        return self.model.vocab_size * self.model.hidden_size

    @functools.cached_property
    def body_params(self) -> int:
        """Matmul parameters every token passes through: all but the embedding table and LM head."""
        embeddings = self.lm_head_params * (1 if self.model.tie_word_embeddings else 2)
        return self.model.params - embeddings

    @functools.cached_property
    def weight_bytes_per_step(self) -> int:
        """Weights one step reads: the body and the LM head (an embedding lookup reads only its rows)."""
        return (self.body_params + self.lm_head_params) * self.model.weight_bytes_per_param

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model, self.kv_cache_dtype)

    @functools.cached_property
    def bandwidth(self) -> float:
        """HBM bandwidth in bytes/s (datasheet)."""
        return self.gpu.hbm_bandwidth_tbps * 1e12

    @functools.cached_property
    def flops(self) -> float:
        """Dense bf16 tensor FLOP/s (datasheet, no sparsity)."""
        return self.gpu.dense_tflops["bf16"] * 1e12

    # --- one step ------------------------------------------------------------

    def step_bytes(self, chunks: list[Chunk]) -> float:
        kv = sum(c.cached + c.new for c in chunks) * self.kv_bytes_per_token
        return self.weight_bytes_per_step + kv

    def step_flops(self, chunks: list[Chunk]) -> float:
        m = self.model
        tokens = sum(c.new for c in chunks)
        rows = sum(1 for c in chunks if c.samples)
        pairs = sum(c.new * c.cached + c.new * (c.new + 1) // 2 for c in chunks)
        attention = 4 * m.n_layers * m.n_heads * m.head_dim * pairs
        return 2 * self.body_params * tokens + 2 * self.lm_head_params * rows + attention

    @functools.cached_property
    def _attention_flops_per_pair(self) -> int:
        m = self.model
        return 4 * m.n_layers * m.n_heads * m.head_dim

    def step_time(self, chunks: list[Chunk]) -> float:
        """Seconds for one forward pass over `chunks` (0 for an empty step).

        Same arithmetic as step_bytes and step_flops, in one pass: the engines call it every step.
        """
        if not chunks:
            return 0.0
        tokens = rows = kv = pairs = 0
        for c in chunks:
            tokens += c.new
            rows += c.samples
            kv += c.cached + c.new
            pairs += c.new * c.cached + c.new * (c.new + 1) // 2
        nbytes = self.weight_bytes_per_step + kv * self.kv_bytes_per_token
        nflops = (2 * self.body_params * tokens + 2 * self.lm_head_params * rows
                  + self._attention_flops_per_pair * pairs)
        return max(nbytes / self.bandwidth, nflops / self.flops) + self.overhead_s

    def uniform_step_time(self, batch: int, new: int, cached: int) -> float:
        """One step of `batch` identical chunks (static batching's padded rows), in O(1)."""
        if batch < 1:
            return 0.0
        m = self.model
        nbytes = self.weight_bytes_per_step + batch * (cached + new) * self.kv_bytes_per_token
        pairs = batch * (new * cached + new * (new + 1) // 2)
        nflops = (2 * self.body_params * batch * new + 2 * self.lm_head_params * batch
                  + 4 * m.n_layers * m.n_heads * m.head_dim * pairs)
        return max(nbytes / self.bandwidth, nflops / self.flops) + self.overhead_s

    def decode_step_time(self, batch: int, context: int) -> float:
        """One decode step of `batch` requests, each with `context` tokens cached."""
        return self.uniform_step_time(batch, 1, context)

    def ridge_tokens(self) -> float:
        """Tokens per step at which the matmuls turn compute-bound (weights only, no attention)."""
        return self.weight_bytes_per_step / self.bandwidth * self.flops / (2 * self.body_params)
