"""Step time of an iteration-level engine, from the project's one cost model (labs/roofline.py).

One step of an engine runs one forward pass over every token the scheduler
picked, whatever mix of prefill chunks and decode tokens that is. Its time is

    t_step = max(bytes moved / bandwidth, FLOPs / dense FLOP/s) + overhead

with the bytes and FLOPs of `labs.roofline.mixed` (what counts is stated once,
in that module's docstring: weights read once per step, LM head only on rows
that sample, causal attention pairs, the embedding a lookup). This module only
adapts it to the engines: a fixed `overhead_s` per step stands in for launch
and CPU time, and the simulators call `step_time` every step. Its times are
ideal lower bounds: compare policies with them, never quote them as measured.

The simulator's KV accounting (blocks of a uniform per-token size) models dense
full-attention models only, so MoE, MLA and sliding-window models are refused
here with a message, although the cost model itself costs them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from labs import roofline
from labs.roofline import Chunk
from labs.specs import GPUSpec, ModelSpec, SpecError

__all__ = ["Chunk", "Roofline", "check_dense"]


def check_dense(model: ModelSpec) -> None:
    """Refuse models whose KV the serving simulator does not account for."""
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
    """Step-time model for one dense model on one GPU (TP 1), as the engines call it."""

    model: ModelSpec
    gpu: GPUSpec
    kv_cache_dtype: str = "auto"
    overhead_s: float = 0.0
    bandwidth_source: str = "datasheet"  # or "measured": the copy bandwidth the labs recorded

    def __post_init__(self):
        check_dense(self.model)
        if self.overhead_s < 0:
            raise SpecError(f"step overhead must be >= 0 s, got {self.overhead_s}")
        self.deployment  # validates dtype, bandwidth source and compute rate now, not at the first step

    @functools.cached_property
    def deployment(self) -> roofline.Deployment:
        return roofline.Deployment(self.model, self.gpu, kv_dtype=self.kv_cache_dtype,
                                   bandwidth=self.bandwidth_source)

    # --- what spec_decode and the scenarios read -----------------------------

    @property
    def lm_head_params(self) -> int:
        return self.deployment.params.lm_head

    @property
    def body_params(self) -> int:
        """Matmul parameters every token passes through: all but the embedding table and LM head."""
        return self.deployment.params.body

    @property
    def weight_bytes_per_step(self) -> float:
        """Weights one step reads: the body and the LM head (an embedding lookup reads only its rows)."""
        return roofline.decode(self.deployment, 1, 0).weight_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return roofline.kv_bytes_per_token(self.deployment)

    @property
    def bandwidth(self) -> float:
        """Bytes/s of the chosen bandwidth source."""
        return self.deployment.memory_bandwidth.bytes_per_s

    @property
    def flops(self) -> float:
        """Dense tensor FLOP/s (datasheet, no sparsity)."""
        return self.deployment.flops_per_s

    # --- one step ------------------------------------------------------------

    def step_bytes(self, chunks: list[Chunk]) -> float:
        return roofline.mixed(self.deployment, chunks).bytes

    def step_flops(self, chunks: list[Chunk]) -> float:
        return roofline.mixed(self.deployment, chunks).flops

    def step_time(self, chunks: list[Chunk]) -> float:
        """Seconds for one forward pass over `chunks` (0 for an empty step)."""
        if not chunks:
            return 0.0
        return roofline.mixed(self.deployment, chunks).floor_s + self.overhead_s

    def uniform_step_time(self, batch: int, new: int, cached: int) -> float:
        """One step of `batch` identical chunks (static batching's padded rows), in O(1)."""
        if batch < 1:
            return 0.0
        return roofline.uniform(self.deployment, batch, Chunk(new, cached)).floor_s + self.overhead_s

    def decode_step_time(self, batch: int, context: int) -> float:
        """One decode step of `batch` requests, each with `context` tokens cached."""
        return self.uniform_step_time(batch, 1, context)

    def ridge_tokens(self) -> float:
        """Prompt tokens at which a prefill's matmuls turn compute-bound (labs.roofline.ridge)."""
        return roofline.ridge(self.deployment).prefill_tokens
