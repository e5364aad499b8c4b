"""The cost model: FLOPs, bytes and time floors of a forward step, and the KV pool, for one deployment.

Every page, plot and simulator of this project takes these numbers from here, so
a ridge point or a decode floor has one definition. Standard library and pyyaml
only: the site build imports it, and it must never need torch or pydantic.

A `Deployment` is a model spec, a GPU spec, the weight and KV-cache dtypes and a
tensor-parallel degree. For it:

    deployment("llama-3.1-70b", "h100-sxm", tp=4)       -> Deployment (names from labs/data)
    prefill(dep, n)              one sequence's prefill of n tokens     -> StepCost
    decode(dep, batch, L)        one decode step of `batch` sequences   -> StepCost
    mixed(dep, chunks)           one chunked step (prefill chunks + decodes) -> StepCost
    uniform(dep, count, chunk)   `count` identical chunks, in O(1)      -> StepCost
    ridge(dep)                   where a step turns compute-bound       -> Ridge
    largest_batch(dep, L, t)     most sequences a decode step holds within t seconds
    chunked_prefill(dep, n, budget, decodes, L)  a prompt's chunked steps  -> ChunkedPrefill
    weight_bytes(dep)            weights one rank holds
    kv_bytes_per_token(dep)      KV cache one more token costs one rank
    kv_pool(dep, max_model_len)  vLLM 0.33's KV pool (labs.kv_sizing)   -> Budget
    max_context(dep, requests)   the KV wall: longest context each request can reach -> KVWall
    smallest_tp(model, gpu, L)   fewest GPUs whose pool holds one request -> Deployment
    offline_throughput_bound(dep, trace, concurrency)                   -> ThroughputBound
    bandwidth(gpu, source)       datasheet or measured bandwidth        -> Bandwidth
    lora_adapter_bytes(model, rank, targets, dtype, tp)  one LoRA adapter's A and B matrices
    lora_slot_bytes(model, rank, dtype, tp)  one GPU slot vLLM reserves at max_lora_rank
    lora_adapter(dep, rank, targets)  an adapter beside the deployment's weights -> LoraAdapter
    lora_op(gpu, tokens, n_in, n_out, rank, adapters)  a segmented shrink + expand -> OpCost

What counts
-----------
* Matmul FLOPs are 2 per weight per token that passes through it.
* The input embedding is a lookup: no FLOPs, and a step reads only its rows
  (counted as 0 bytes). With tied embeddings the one table is the LM head.
* A weight dtype (fp8, int4-g128) prices the matmul weights and experts; the
  embedding and LM head stay 16-bit, as vLLM 0.33's quantization methods leave
  them (fp8: LinearBase and experts only; GPTQ/AWQ: lm_head only when the
  checkpoint quantized it).
* The LM head is a matmul and counts, but only for rows that sample a token:
  vLLM 0.33 computes logits at the sampling positions only
  (`logits_indices = query_start_loc[1:] - 1` in vllm/v1/worker/gpu_model_runner.py;
  Model Runner V2, vllm/v1/worker/gpu/model_runner.py, runs compute_logits on
  the sampled hidden states). A prefill runs it once per scheduled chunk (vLLM
  computes a partial chunk's row too and discards the sample); a decode step of
  B sequences runs it B times.
* Attention FLOPs are counted per (query, key) pair: QK^T and PV cost
  2 x H_q x d each per layer. A chunk of n new tokens after c cached ones has
  n*c + n(n+1)/2 pairs (causal: about half of n^2 for a fresh prefill). A
  sliding-window layer attends to at most W keys per query.
* MLA (DeepSeek-V3): the cache holds one latent of kv_lora_rank +
  qk_rope_head_dim elements per layer per token (labs/kv_sizing/formula.py),
  replicated on every TP rank. Decode tokens attend in the latent space
  (weights absorbed: 2 x H_q x (kv_lora_rank + rope) for QK^T plus
  2 x H_q x kv_lora_rank for PV per pair); prefill chunks expand the latent to
  per-head K and V (2 x H_q x (nope + rope) + 2 x H_q x v_head_dim per pair) and
  pay kv_b_proj on their cached tokens to do so.
* MoE: FLOPs use the active parameters (experts_per_token of n_routed_experts,
  plus shared experts and everything outside the experts). Bytes use the
  experts a step touches: with T tokens routed independently and uniformly,
  a layer touches 1 - (1 - k/E)^T of its experts on average, so one decode
  token reads the active parameters and a large batch reads nearly all of them.
  Routed-expert parameters come from the geometry; the rest of params_total
  (attention, shared experts, dense layers, routers, norms) is read every step.
* Bytes moved by a step: the weights it touches, read once however many tokens
  share them; the KV of every chunk's cached context, read; the KV of its new
  tokens, written. Activations, norms' arithmetic and communication are left
  out. With TP, FLOPs and weights split evenly over ranks and each rank holds
  its share of the KV heads (formula.kv_heads_per_rank); every number here is
  one rank's, and the floor is one rank's time (ranks run in parallel).

Which bandwidth
---------------
A floor divides bytes by a bandwidth, and there are two, chosen by the explicit
`bandwidth` field of a Deployment so a page says which one it used:

* "datasheet": the HBM bandwidth on the vendor's datasheet (labs/data/gpus.yaml),
  what the spec sheet promises; known for every GPU.
* "measured": the device-to-device copy bandwidth the paged-attention lab
  records per GPU (labs/results/paged_attention.json, `copy_tb_s`), what this
  GPU can do; only for GPUs the labs have run on, else a CostModelError.

The compute rate is the datasheet's dense (no sparsity) tensor FLOP/s of the
compute dtype (fp8 when the weights are fp8 and the GPU has fp8 tensor cores,
else bf16), unless `gemm_tflops` gives a measured GEMM rate. Floors are ideal
lower bounds: real kernels reach a fraction of either roof.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, NamedTuple

from labs.kv_sizing import formula, memory_budget
from labs.specs import GPUSpec, ModelSpec, SpecError, get_gpu, get_model

BANDWIDTH_SOURCES = ("datasheet", "measured")
# Bytes per weight of the weight formats costed here. int4-g128: 4-bit integers
# with one bf16 scale per group of 128 (GPTQ/AWQ style), 4.125 bits a weight.
WEIGHT_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "int4-g128": 4.125 / 8}
WEIGHT_DTYPES = tuple(WEIGHT_BYTES)


class CostModelError(SpecError):
    """A deployment the cost model cannot cost, or a figure it has no source for."""


# ---------------------------------------------------------------------------
# Rates
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bandwidth:
    """A memory bandwidth and where it comes from."""

    bytes_per_s: float
    source: str  # "datasheet" or "measured"
    label: str  # how a page names it: "4.8 TB/s (datasheet HBM bandwidth)"
    date: str | None = None  # when measured

    @property
    def tb_per_s(self) -> float:
        return self.bytes_per_s / 1e12


def _measured_entry(gpu: GPUSpec) -> dict | None:
    """The paged-attention lab's latest run on this GPU (it records `copy_tb_s` and `date`), or None."""
    from labs.paged_attention.report import load_results

    results = load_results() if gpu.cuda_name else None
    if results is None or not results.has(gpu.cuda_name):
        return None
    machine = results.machine(gpu.cuda_name)
    runs = [run for run in machine.runs if run.get("copy_tb_s")]
    if not runs:
        return None
    latest = max(runs, key=lambda run: run.get("date", ""))
    return {**latest, "gpu": machine.label}


def bandwidth(gpu: GPUSpec, source: str = "datasheet") -> Bandwidth:
    """The GPU's datasheet HBM bandwidth, or its measured copy bandwidth."""
    if source == "datasheet":
        return Bandwidth(gpu.hbm_bandwidth_tbps * 1e12, "datasheet",
                         f"{gpu.hbm_bandwidth_tbps:g} TB/s (datasheet HBM bandwidth)")
    if source != "measured":
        raise CostModelError(f"bandwidth source must be one of {', '.join(BANDWIDTH_SOURCES)}, got {source!r}")
    entry = _measured_entry(gpu)
    if entry is None or not entry.get("copy_tb_s"):
        raise CostModelError(
            f"no measured copy bandwidth for {gpu.name}: labs/results/paged_attention.json has no entry "
            f"for it; use bandwidth='datasheet' or run the paged-attention benchmark on that GPU")
    tbps = float(entry["copy_tb_s"])
    return Bandwidth(tbps * 1e12, "measured",
                     f"{tbps:.2f} TB/s (copy bandwidth measured on {entry['gpu']}, {entry['date']})",
                     entry.get("date"))


def has_measured_bandwidth(gpu: GPUSpec) -> bool:
    entry = _measured_entry(gpu)
    return bool(entry and entry.get("copy_tb_s"))


# ---------------------------------------------------------------------------
# Deployment
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    """One model served on `tp` GPUs of one kind, with the dtypes and bandwidth a floor uses.

    weight_dtype None means the dtype vLLM 0.33 loads (ModelSpec.weight_dtype,
    else the serving dtype); kv_dtype takes --kv-cache-dtype's values ('auto'
    is the serving dtype). gemm_tflops, when given, replaces the datasheet's
    dense FLOP/s (a measured GEMM rate).
    """

    model: ModelSpec
    gpu: GPUSpec
    weight_dtype: str | None = None
    kv_dtype: str = "auto"
    tp: int = 1
    bandwidth: str = "datasheet"
    gemm_tflops: float | None = None

    def __post_init__(self):
        formula.check_tensor_parallel(self.model, self.tp)
        formula.resolve_kv_dtype(self.model, self.kv_dtype)
        if self.weight_dtype is not None and self.weight_dtype not in WEIGHT_DTYPES:
            raise CostModelError(f"weight dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {self.weight_dtype!r}")
        if self.bandwidth not in BANDWIDTH_SOURCES:
            raise CostModelError(f"bandwidth source must be one of {', '.join(BANDWIDTH_SOURCES)}, "
                                 f"got {self.bandwidth!r}")
        if self.gemm_tflops is not None and not self.gemm_tflops > 0:
            raise CostModelError(f"gemm_tflops must be positive, got {self.gemm_tflops}")
        if self.gemm_tflops is None and self.gpu.dense_tflops.get(self.compute_dtype) is None:
            raise CostModelError(f"{self.gpu.name} has no dense {self.compute_dtype} FLOP/s in labs/data/gpus.yaml")

    @property
    def bytes_per_weight(self) -> float:
        """Bytes per parameter of the matmul weights that a weight dtype quantizes (not the tables)."""
        return WEIGHT_BYTES[self.weight_dtype] if self.weight_dtype else self.model.weight_bytes_per_param

    @property
    def bytes_per_table_weight(self) -> int:
        """Bytes per parameter of the embedding and LM head, which vLLM keeps 16-bit under any weight dtype."""
        return self.model.table_bytes_per_param

    @property
    def compute_dtype(self) -> str:
        """The tensor-core dtype the matmuls run in: fp8 for fp8 weights where the GPU has it, else bf16.

        int4 weights are dequantized to bf16 for the product (W4A16), so they run at the bf16 rate.
        """
        if self.bytes_per_weight == 1 and self.gpu.dense_tflops.get("fp8"):
            return "fp8"
        return "bf16"

    @property
    def flops_per_s(self) -> float:
        tflops = self.gemm_tflops if self.gemm_tflops is not None else self.gpu.dense_tflops[self.compute_dtype]
        return tflops * 1e12

    @functools.cached_property
    def memory_bandwidth(self) -> Bandwidth:
        return bandwidth(self.gpu, self.bandwidth)

    @functools.cached_property
    def params(self) -> "ParamSplit":
        return param_split(self.model)

    @functools.cached_property
    def _geometry(self) -> "_Geometry":
        return _Geometry(self)

    # The module's functions as methods, so a page template can write d.decode(64, 1024).floor_s.
    def prefill(self, n: int, cached: int = 0) -> "StepCost":
        return prefill(self, n, cached)

    def decode(self, batch: int, context: int) -> "StepCost":
        return decode(self, batch, context)

    def mixed(self, chunks: Iterable["Chunk"]) -> "StepCost":
        return mixed(self, chunks)

    def uniform(self, count: int, chunk: "Chunk") -> "StepCost":
        return uniform(self, count, chunk)

    def ridge(self) -> "Ridge":
        return ridge(self)

    def largest_batch(self, context: int, step_s: float) -> int:
        return largest_batch(self, context, step_s)

    def chunked_prefill(self, prompt: int, budget: int | None, decodes: int = 0, context: int = 0) -> "ChunkedPrefill":
        return chunked_prefill(self, prompt, budget, decodes, context)

    def throughput_gain(self, batch: int, context: int, base: int = 1) -> float:
        """Decode tokens/s at `batch` over tokens/s at `base`, same context: what batching buys."""
        return decode(self, batch, context).tokens_per_s / decode(self, base, context).tokens_per_s

    def step_growth(self, batch: int, context: int, base: int = 1) -> float:
        """Decode floor at `batch` over the floor at `base`, same context: 1 means batching is free.

        It stays near 1 only while batch x context x KV bytes per token is small against the
        weight bytes; pages quote it to say where "step time is flat in batch" holds.
        """
        return decode(self, batch, context).floor_s / decode(self, base, context).floor_s

    def kv_read_limit(self, context: int) -> float:
        """Decode tokens/s as the batch grows without bound at `context`: bandwidth over one sequence's cache.

        The weight read is shared by the whole batch and amortises away; each new token still
        reads its own sequence's KV, so throughput flattens towards this.
        """
        return self.memory_bandwidth.bytes_per_s / self.kv_bytes(context)

    def weight_bytes(self) -> int:
        return weight_bytes(self)

    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self)

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes one rank holds for a context of `tokens` (sliding layers stop at their window)."""
        geo = self._geometry
        held = geo.n_full * tokens + (geo.n_sliding * min(tokens, geo.window) if geo.n_sliding else 0)
        return held * geo.layer_kv

    def attention_flop_per_byte(self) -> float:
        """Decode attention's FLOPs per byte of KV it reads: 2 H_q / (H_kv b), whatever the batch."""
        geo = self._geometry
        return geo.pair_flops_decode / self.tp / geo.layer_kv

    def logits_bytes(self, rows: int) -> int:
        """Bytes of float32 logits for `rows` sampled positions (vocab_size each)."""
        return rows * self.model.vocab_size * 4

    def kv_pool(self, max_model_len: int | None = None, **budget_args) -> memory_budget.Budget:
        return kv_pool(self, max_model_len, **budget_args)

    def max_context(self, requests: int = 1, **budget_args) -> "KVWall":
        return max_context(self, requests, **budget_args)

    def kv_transfer(self, tokens: int, gbit_per_s: float | None = None, gb_per_s: float | None = None,
                    nvlink: bool = False) -> "KVTransfer":
        return kv_transfer(self, tokens, gbit_per_s, gb_per_s, nvlink)

    def throughput_bound(self, trace: Iterable, concurrency: int) -> "ThroughputBound":
        return offline_throughput_bound(self, trace, concurrency)

    def lora_adapter(self, rank: int, targets: Iterable[str] | None = None) -> "LoraAdapter":
        """One LoRA adapter of `rank` beside these weights (all seven projections unless `targets`)."""
        return lora_adapter(self, rank, LORA_TARGETS if targets is None else targets)


def deployment(model: str | ModelSpec, gpu: str | GPUSpec, **fields) -> Deployment:
    """A Deployment from names of labs/data/*.yaml (or specs), e.g. deployment("llama-3.1-70b", "h100-sxm", tp=4)."""
    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    return Deployment(m, g, **fields)


# ---------------------------------------------------------------------------
# Parameters, split by how a step touches them
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSplit:
    """A model's parameters, whole model (not per rank)."""

    total: int
    embedding: int  # the input table when it is separate from the LM head (0 when tied)
    lm_head: int  # vocab_size x hidden_size
    routed_experts: int  # all routed experts of all MoE layers (0 for dense)
    routed_fraction: float  # experts_per_token / n_routed_experts (1 for dense)

    @property
    def body(self) -> int:
        """Weights every token passes through: attention, dense MLPs, shared experts, routers, norms."""
        return self.total - self.embedding - self.lm_head - self.routed_experts

    def bytes_read(self, dep: "Deployment", experts_touched: float) -> float:
        """Weight bytes one step reads, whole model: the body, the LM head at its own 16-bit width, and the
        fraction of routed experts the step's tokens touch (the input embedding reads only its rows: 0)."""
        return ((self.body + self.routed_experts * experts_touched) * dep.bytes_per_weight
                + self.lm_head * dep.bytes_per_table_weight)

    @property
    def active(self) -> float:
        """Parameters one token's forward pass multiplies by, LM head included, input embedding excluded.

        Model cards' "active" counts include the input table (Mixtral's 12.9B is
        this plus 0.13B of embedding).
        """
        return self.body + self.lm_head + self.routed_experts * self.routed_fraction


def param_split(model: ModelSpec) -> ParamSplit:
    table = model.vocab_size * model.hidden_size
    routed, fraction = 0, 1.0
    if model.moe is not None:
        m = model.moe
        routed = (model.n_layers - m.first_dense_layers) * m.n_routed_experts * 3 * model.hidden_size \
            * m.moe_intermediate_size
        fraction = m.experts_per_token / m.n_routed_experts
    split = ParamSplit(model.params, 0 if model.tie_word_embeddings else table, table, routed, fraction)
    if split.body <= 0:
        raise CostModelError(f"{model.name}: params_total is smaller than its embeddings and experts")
    return split


def weight_bytes(dep: Deployment) -> int:
    """Bytes of weights one rank holds, split over TP: the matmul weights at the weight dtype, the
    embedding and LM head 16-bit (no vLLM 0.33 method quantizes them by default).

    fp8 checkpoints' block scales are not counted (under 0.1% of the bytes); int4-g128 counts its group scales.
    """
    return math.ceil(dep.model.weight_bytes_at(dep.bytes_per_weight) / dep.tp)


def kv_bytes_per_token(dep: Deployment) -> int:
    """KV-cache bytes one more token of context costs one rank (labs/kv_sizing/formula.py)."""
    return formula.kv_bytes_per_token(dep.model, dep.kv_dtype, dep.tp)


# ---------------------------------------------------------------------------
# One step
# ---------------------------------------------------------------------------


class Chunk(NamedTuple):
    """The work one sequence adds to a step: `new` tokens after `cached` ones.

    `samples` counts the rows the LM head runs on (True is one, False none). One for a
    decode token, and in vLLM 0.33 for every scheduled prompt chunk too (gpu_model_runner
    computes logits at each request's last position and discards a partial chunk's
    sample). A speculative verify chunk of k drafts plus one bonus position has k + 1:
    the rejection sampler needs the target's logits at every one of them
    (GPUModelRunner._calc_spec_decode_metadata's logits_indices).
    """

    new: int
    cached: int
    samples: int = 1


class _Roofs:
    """The two roofs of a piece of work that has `flops`, `bytes`, `flops_per_s` and `bytes_per_s`.

    One definition for a whole step (StepCost) and one operator (OpCost), so "floor" and
    "bound" mean the same thing everywhere the site prints them.
    """

    @property
    def compute_s(self) -> float:
        return self.flops / self.flops_per_s

    @property
    def memory_s(self) -> float:
        return self.bytes / self.bytes_per_s

    @property
    def floor_s(self) -> float:
        """The work can take no less than this: the slower of the two roofs."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    @property
    def attained_flops_per_s(self) -> float:
        """FLOP/s the work would sustain running at its floor: min(peak, intensity x bandwidth)."""
        return self.flops / self.floor_s


@dataclass(frozen=True)
class StepCost(_Roofs):
    """One rank's work in one forward step, and its two time floors."""

    flops: float
    weight_bytes: float  # weights read
    kv_read_bytes: float  # cached context read
    kv_write_bytes: float  # new tokens' KV written
    flops_per_s: float
    bytes_per_s: float
    bandwidth_source: str
    tokens: int  # new tokens in the step
    sequences: int

    @property
    def bytes(self) -> float:
        """Bytes moved: weights and KV read, KV written."""
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def compute_fraction(self) -> float:
        """Share of the floor the tensor cores are busy (1 when compute-bound)."""
        return self.compute_s / self.floor_s

    @property
    def weight_s(self) -> float:
        """Time to read the weights alone at the bandwidth."""
        return self.weight_bytes / self.bytes_per_s

    @property
    def kv_read_s(self) -> float:
        """Time to read the cached KV alone at the bandwidth: the attention kernel's floor."""
        return self.kv_read_bytes / self.bytes_per_s

    @property
    def kv_fraction(self) -> float:
        """Share of the bytes moved that is KV cache (read and written) rather than weights."""
        return (self.kv_read_bytes + self.kv_write_bytes) / self.bytes

    @property
    def kv_to_weights(self) -> float:
        """KV bytes the step reads over the weight bytes it reads: above 1, the caches set the floor."""
        return self.kv_read_bytes / self.weight_bytes

    @property
    def tokens_per_s(self) -> float:
        """New tokens this step processes per second of its floor (a decode step: tokens generated)."""
        return self.tokens / self.floor_s

    @property
    def per_sequence_tokens_per_s(self) -> float:
        """Tokens per second each sequence gets (a decode step: one user's stream)."""
        return self.tokens / self.sequences / self.floor_s


def _causal_keys(cached: int, new: int, window: int | None = None) -> int:
    """(query, key) pairs of `new` queries after `cached` tokens: sum of min(p, window) for p in cached+1..cached+new."""
    lo, hi = cached + 1, cached + new
    if window is None or hi <= window:
        return (lo + hi) * new // 2
    if lo > window:
        return new * window
    return (lo + window) * (window - lo + 1) // 2 + (hi - window) * window


class _Geometry:
    """Per-layer constants of one deployment, computed once."""

    def __init__(self, dep: Deployment):
        m = dep.model
        self.dep = dep
        self.split = dep.params
        self.layer_kv = formula.layer_bytes_per_token(m, dep.kv_dtype, dep.tp)
        self.n_full = m.n_full_layers
        self.n_sliding = m.n_sliding_layers
        self.window = m.sliding_window.window if m.sliding_window else None
        h = m.n_heads
        if m.mla is not None:
            a = m.mla
            self.pair_flops_decode = 2 * h * (a.kv_lora_rank + a.qk_rope_head_dim) + 2 * h * a.kv_lora_rank
            self.pair_flops_prefill = 2 * h * (a.qk_nope_head_dim + a.qk_rope_head_dim) + 2 * h * a.v_head_dim
            # kv_b_proj applied to one cached latent to expand it to per-head K (nope part) and V.
            self.expand_flops = 2 * a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)
        else:
            self.pair_flops_decode = self.pair_flops_prefill = 4 * h * m.head_dim
            self.expand_flops = 0

    def cost(self, groups: Iterable[tuple[int, Chunk]]) -> StepCost:
        """`groups`: (count, chunk) pairs, `count` identical chunks each.

        The loop only sums token counts (the engines call this every step); the
        per-layer constants multiply the sums once at the end.
        """
        mla, sliding, window = self.dep.model.mla is not None, self.n_sliding > 0, self.window
        tokens = rows = seqs = 0
        pairs_full = pairs_sliding = pairs_latent = 0  # latent: MLA decode tokens, attended in the latent space
        read_full = read_sliding = expanded = 0  # expanded: cached tokens an MLA prefill chunk decompresses
        for count, c in groups:
            new, cached = c[0], c[1]
            if count <= 0:
                continue
            if new < 1 or cached < 0:
                raise CostModelError(f"a chunk needs new >= 1 and cached >= 0, got {tuple(c)}")
            seqs += count
            tokens += count * new
            rows += count * _lm_head_rows(c)
            full = count * (new * cached + new * (new + 1) // 2)
            if mla and new == 1:
                pairs_latent += full
            else:
                pairs_full += full
                if mla:
                    expanded += count * cached
            read_full += count * cached
            if sliding:
                pairs_sliding += count * _causal_keys(cached, new, window)
                read_sliding += count * min(cached, window)
        if seqs == 0:
            raise CostModelError("a step needs at least one chunk")
        return self._finish(tokens, rows, seqs, pairs_full, pairs_sliding, pairs_latent, read_full, read_sliding,
                            expanded)

    def cost_chunks(self, chunks: Iterable) -> StepCost:
        """One step over single chunks: the engines' hot path, a tighter loop for dense full-attention models."""
        if self.dep.model.mla is not None or self.n_sliding:
            return self.cost((1, c) for c in chunks)
        tokens = rows = seqs = pairs = read = 0
        for c in chunks:
            new, cached = c[0], c[1]
            if new < 1 or cached < 0:
                raise CostModelError(f"a chunk needs new >= 1 and cached >= 0, got {tuple(c)}")
            seqs += 1
            tokens += new
            read += cached
            pairs += new * cached + (new * (new + 1) >> 1)
            rows += _lm_head_rows(c)
        if seqs == 0:
            raise CostModelError("a step needs at least one chunk")
        return self._finish(tokens, rows, seqs, pairs, 0, 0, read, 0, 0)

    def _finish(self, tokens, rows, seqs, pairs_full, pairs_sliding, pairs_latent, read_full, read_sliding,
                expanded) -> StepCost:
        dep, split, m = self.dep, self.split, self.dep.model
        attn = (self.pair_flops_prefill * (self.n_full * pairs_full + self.n_sliding * pairs_sliding)
                + self.pair_flops_decode * self.n_full * pairs_latent
                + self.expand_flops * m.n_layers * expanded)
        kv_read = (self.n_full * read_full + self.n_sliding * read_sliding) * self.layer_kv
        kv_write = tokens * m.n_layers * self.layer_kv
        matmul = 2 * (split.body + split.routed_experts * split.routed_fraction) * tokens + 2 * split.lm_head * rows
        touched = 1.0 - (1.0 - split.routed_fraction) ** tokens if split.routed_experts else 0.0
        weights = split.bytes_read(dep, touched)
        tp = dep.tp
        bw = dep.memory_bandwidth
        return StepCost(flops=(matmul + attn) / tp, weight_bytes=weights / tp, kv_read_bytes=kv_read,
                        kv_write_bytes=kv_write, flops_per_s=dep.flops_per_s, bytes_per_s=bw.bytes_per_s,
                        bandwidth_source=bw.source, tokens=tokens, sequences=seqs)


def _lm_head_rows(chunk) -> int:
    if len(chunk) < 3:
        return 1
    rows = int(chunk[2])
    if not 0 <= rows <= chunk[0]:
        raise CostModelError(f"a chunk samples 0 to `new` rows, got {rows} of {chunk[0]} new tokens")
    return rows


def _geometry(dep: Deployment) -> _Geometry:
    return dep._geometry


def mixed(dep: Deployment, chunks: Iterable[Chunk]) -> StepCost:
    """One step over any mix of prefill chunks and decode tokens (vLLM's chunked, mixed batch)."""
    return _geometry(dep).cost_chunks(chunks)


def uniform(dep: Deployment, count: int, chunk: Chunk) -> StepCost:
    """One step of `count` identical chunks, in O(1)."""
    if count < 1:
        raise CostModelError(f"a step needs at least one sequence, got {count}")
    return _geometry(dep).cost([(count, Chunk(*chunk))])


def prefill(dep: Deployment, n: int, cached: int = 0) -> StepCost:
    """One sequence's prefill of `n` tokens (after `cached` ones), sampling its first output token."""
    return uniform(dep, 1, Chunk(n, cached, True))


def decode(dep: Deployment, batch: int, context: int) -> StepCost:
    """One decode step of `batch` sequences, each with `context` tokens already cached."""
    return uniform(dep, batch, Chunk(1, context, True))


@dataclass(frozen=True)
class ChunkedPrefill:
    """A prompt prefilled in chunks of a token budget, each step also carrying running decodes."""

    steps: tuple[StepCost, ...]
    decode_only_s: float  # the floor of the same decodes without the prompt (0 when there are none)

    @property
    def stall_ratio(self) -> float:
        """The worst step over a decode-only step: how many normal token gaps a running stream waits."""
        return self.worst_s / self.decode_only_s if self.decode_only_s else float("inf")

    @property
    def count(self) -> int:
        return len(self.steps)

    @property
    def worst_s(self) -> float:
        """The longest step's floor: what every running decode waits for at worst (its ITL bound)."""
        return max(s.floor_s for s in self.steps)

    @property
    def total_s(self) -> float:
        """Sum of the steps' floors: the prompt's time to first token, queueing aside."""
        return sum(s.floor_s for s in self.steps)

    def tpot_rise(self, every: int) -> float:
        """How much each running decode's mean TPOT grows when this prefill arrives once per `every` steps.

        The time the prefill's steps add over decode-only steps, spread over `every` tokens: a
        mean that hides a worst gap of `stall_ratio` normal ones.
        """
        if every < self.count:
            raise CostModelError(f"the prefill takes {self.count} steps; it cannot arrive once per {every}")
        return sum(s.floor_s - self.decode_only_s for s in self.steps) / every

    def tpot_rise_fraction(self, every: int) -> float:
        """`tpot_rise(every)` over a decode-only step."""
        return self.tpot_rise(every) / self.decode_only_s if self.decode_only_s else float("inf")


def chunked_prefill(dep: Deployment, prompt: int, budget: int | None, decodes: int = 0,
                    context: int = 0) -> ChunkedPrefill:
    """A `prompt`-token prefill under a per-step token `budget` shared with `decodes` decode tokens at `context`.

    Decode tokens are scheduled first (as vLLM 0.33's scheduler does with running
    requests), the prompt takes the rest of each step's budget; every chunk runs
    the LM head on its last row, as vLLM's runner does (only the last chunk's sample
    is kept). budget None: no chunking, the whole prompt rides in one step.
    """
    if budget is None:
        budget = prompt + decodes
    if budget <= decodes:
        raise CostModelError(f"a budget of {budget} tokens leaves no room for a prompt next to {decodes} decodes")
    steps, done = [], 0
    while done < prompt:
        new = min(prompt - done, budget - decodes)
        groups = [(1, Chunk(new, done, True))]
        if decodes:
            groups.append((decodes, Chunk(1, context)))
        steps.append(_geometry(dep).cost(groups))
        done += new
    alone = decode(dep, decodes, context).floor_s if decodes else 0.0
    return ChunkedPrefill(tuple(steps), alone)


def largest_batch(dep: Deployment, context: int, step_s: float) -> int:
    """The most sequences at `context` a decode step can hold and still finish within `step_s` (0 if none)."""
    if decode(dep, 1, context).floor_s > step_s:
        return 0
    lo, hi = 1, 2
    while decode(dep, hi, context).floor_s <= step_s:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if decode(dep, mid, context).floor_s <= step_s else (lo, mid)
    return lo


# ---------------------------------------------------------------------------
# Ridge point
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ridge:
    """Where the roofline's two roofs meet, for one deployment.

    flop_per_byte: the compute rate over the bandwidth: a step doing more FLOPs
    per byte moved than this is compute-bound.
    prefill_tokens: the prompt length of one sequence at which its prefill's
    matmul time equals the time to read the weights it touches (attention and
    KV left out; the LM head runs once): longer prefills are compute-bound.
    decode_batch: the same for a decode step of B sequences (LM head B times)
    with the KV reads left out: a lower bound on the batch at which decode
    turns compute-bound (with any real context's KV counted it is higher, or
    never comes).
    Both are real numbers, not counts: the crossing, not a batch that fits.
    """

    flop_per_byte: float
    prefill_tokens: float
    decode_batch: float


def _crossing(dep: Deployment, lm_rows_per_token: bool) -> float:
    """Tokens n at which matmul FLOPs / FLOP/s = weight bytes touched / bandwidth (bisection; MoE is not linear)."""
    split = dep.params
    rate, bw = dep.flops_per_s, dep.memory_bandwidth.bytes_per_s

    def gap(n: float) -> float:
        rows = n if lm_rows_per_token else 1.0
        flops = 2 * (split.body + split.routed_experts * split.routed_fraction) * n + 2 * split.lm_head * rows
        touched = 1.0 - (1.0 - split.routed_fraction) ** n if split.routed_experts else 0.0
        nbytes = split.bytes_read(dep, touched)
        return flops / rate - nbytes / bw

    lo, hi = 0.0, 1.0
    while gap(hi) < 0:
        lo, hi = hi, hi * 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return hi


def ridge(dep: Deployment) -> Ridge:
    """The ridge point of `dep`, as FLOP/byte and as tokens per step (see Ridge)."""
    return Ridge(flop_per_byte=dep.flops_per_s / dep.memory_bandwidth.bytes_per_s,
                 prefill_tokens=_crossing(dep, lm_rows_per_token=False),
                 decode_batch=_crossing(dep, lm_rows_per_token=True))


# ---------------------------------------------------------------------------
# KV pool
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KVTransfer:
    """One request's KV moved over a link (host PCIe for a swap, a NIC for disaggregated serving).

    `seconds` is the link-speed bound: the bytes at the link's rate as one copy. vLLM keeps
    one KV tensor per layer (keys and values apart), so a block-by-block copy is `copies`
    pieces of `copy_bytes` each; small pieces run well below link speed, so the real time of
    a block-wise copy is longer than the bound.
    """

    bytes: int
    copies: int
    link_bytes_per_s: float

    @property
    def seconds(self) -> float:
        return self.bytes / self.link_bytes_per_s

    @property
    def copy_bytes(self) -> float:
        return self.bytes / self.copies


def kv_transfer(dep: Deployment, tokens: int, gbit_per_s: float | None = None,
                gb_per_s: float | None = None, nvlink: bool = False) -> KVTransfer:
    """The KV of one `tokens`-token request on one rank, over a link given in Gb/s (NICs) or GB/s (PCIe),
    or `nvlink=True`: one direction of the GPU's NVLink, half the bidirectional figure in labs/data/gpus.yaml."""
    if sum(x is not None and x is not False for x in (gbit_per_s, gb_per_s, nvlink or None)) != 1:
        raise SpecError("kv_transfer: give the link speed once, as gbit_per_s, gb_per_s or nvlink=True")
    if nvlink:
        if not dep.gpu.nvlink_gbps:
            raise SpecError(f"kv_transfer: {dep.gpu.name} has no NVLink")
        rate = dep.gpu.nvlink_gbps / 2 * 1e9
    else:
        rate = gbit_per_s * 1e9 / 8 if gbit_per_s is not None else gb_per_s * 1e9
    if rate <= 0:
        raise SpecError(f"kv_transfer: link speed must be > 0, got {gbit_per_s or gb_per_s}")
    m = dep.model
    block = formula.default_block_size(m)
    blocks = -(-tokens // block)
    tensors_per_layer = 1 if m.attention == "mla" else 2  # MLA caches one latent; others keys and values apart
    return KVTransfer(dep.kv_bytes(tokens), blocks * m.n_layers * tensors_per_layer, rate)


def kv_pool(dep: Deployment, max_model_len: int | None = None, **budget_args) -> memory_budget.Budget:
    """One rank's memory itemised and its KV pool sized as vLLM 0.33 does (labs.kv_sizing.budget).

    total (cudaMemGetInfo's, else nvidia-smi's: see Budget.total_measured) x
    gpu_memory_utilization - weights - non-torch memory - activation peak -
    CUDA-graph estimate. `budget_args` are memory_budget.budget's keywords
    (gpu_memory_utilization, block_size, max_num_batched_tokens, ...).
    """
    return memory_budget.budget(dep.model, dep.gpu, max_model_len, kv_cache_dtype=dep.kv_dtype,
                                tensor_parallel_size=dep.tp, weights=weight_bytes(dep), **budget_args)


# Upper end of max_context's search: past any model's positions, and far below an int32 overflow.
MAX_CONTEXT_SEARCH = 1 << 30


@dataclass(frozen=True)
class KVWall:
    """The longest context a deployment's KV pool gives each of `requests` requests at once.

    tokens: found by vLLM's own rule (the blocks one request of L tokens needs, per KV-cache
    group, times bytes per block, against the pool less its null block), not capped by the
    model's positions. positions: what the model config allows (max_position_embeddings,
    already scaled by rope_scaling for llama3-style configs). max_model_len: the smaller of
    the two, what a server can actually offer; bound says which of the two sets it.
    """

    tokens: int
    requests: int
    positions: int
    kv_pool: int
    kv_bytes_per_token: int
    block_size: int

    @property
    def max_model_len(self) -> int:
        return min(self.tokens, self.positions)

    @property
    def bound(self) -> str:
        return "memory" if self.tokens < self.positions else "positions"

    @property
    def of_positions(self) -> float:
        """tokens over the model's positions: below 1, memory is the wall."""
        return self.tokens / self.positions


def max_context(dep: Deployment, requests: int = 1, **budget_args) -> KVWall:
    """The KV wall: the longest context `requests` concurrent requests can each reach in one rank's pool.

    Uses the pool of kv_pool(dep) (vLLM 0.33's budget; `budget_args` as there) and vLLM's
    block accounting (labs.kv_sizing.formula.blocks_per_request), so sliding-window layers
    stop growing at their window. It rounds down: the answer fits, one block more does not.
    """
    if requests < 1:
        raise CostModelError(f"max_context: requests must be >= 1, got {requests}")
    pool = kv_pool(dep, **budget_args)
    bpb = pool.bytes_per_block
    room = pool.kv_pool - bpb  # the null block is never handed out
    in_flight = 2 * pool.max_num_batched_tokens

    def fits(n: int) -> bool:
        return requests * formula.blocks_per_request(dep.model, n, pool.block_size, in_flight) * bpb <= room

    tokens = 0
    if room > 0 and fits(1):
        lo, hi = 1, MAX_CONTEXT_SEARCH
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        tokens = lo
    return KVWall(tokens, requests, dep.model.max_position_embeddings, pool.kv_pool, pool.kv_bytes_per_token,
                  pool.block_size)


def smallest_tp(model: ModelSpec, gpu: GPUSpec, max_model_len: int, choices: Iterable[int] = (1, 2, 4, 8),
                **fields) -> Deployment | None:
    """The deployment with the fewest GPUs whose pool holds one `max_model_len` request; None if none does."""
    for tp in choices:
        try:
            dep = Deployment(model, gpu, tp=tp, **fields)
        except SpecError:
            continue
        if kv_pool(dep, max_model_len).fits_one_request:
            return dep
    return None


# ---------------------------------------------------------------------------
# Offline throughput bound
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputBound:
    """The most a deployment can do with a trace at a concurrency (an upper bound on throughput).

    Prefill: every prompt's FLOPs at the GEMM rate. Decode: every output token
    after the first, in steps of a batch kept full at `concurrency`, each step
    reading the weights it touches plus its sequences' KV, at the bandwidth,
    or its FLOPs at the GEMM rate where those take longer.
    """

    requests: int
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    prefill_flops: float
    prefill_s: float
    decode_steps: float
    decode_bytes: float
    decode_flops: float
    decode_s: float
    flops_per_s: float
    bytes_per_s: float
    bandwidth_label: str

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.total_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.total_s

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.total_s


def _lengths(request) -> tuple[int, int]:
    if hasattr(request, "prompt_len"):
        return int(request.prompt_len), int(request.output_len)
    prompt, output = request
    return int(prompt), int(output)


def offline_throughput_bound(dep: Deployment, trace: Iterable, concurrency: int) -> ThroughputBound:
    """Upper bound on a trace's offline throughput at `concurrency` sequences in flight.

    `trace`: requests with prompt_len and output_len (labs.serving_sim.trace.Request)
    or (prompt_len, output_len) pairs. The GEMM rate is dep.flops_per_s (pass
    gemm_tflops to the Deployment for a measured one), the bandwidth
    dep.bandwidth (use "measured" for the copy bandwidth). The engine's
    measured throughput divided by this is its efficiency.
    """
    if concurrency < 1:
        raise CostModelError(f"concurrency must be >= 1, got {concurrency}")
    geo = _geometry(dep)
    split, m, tp = geo.split, dep.model, dep.tp
    requests = prompt_tokens = output_tokens = decode_tokens = 0
    prefill_flops = attn_flops = kv_bytes = 0.0
    for request in trace:
        p, o = _lengths(request)
        if p < 1 or o < 1:
            raise CostModelError(f"a request needs prompt_len >= 1 and output_len >= 1, got {p}, {o}")
        requests += 1
        prompt_tokens += p
        output_tokens += o
        prefill_flops += geo.cost([(1, Chunk(p, 0, True))]).flops
        d = o - 1  # the prefill samples the first output token
        if d == 0:
            continue
        decode_tokens += d
        # decode token j (1..d) runs with p + j - 1 tokens cached, reads them and writes one
        attn_keys = geo.n_full * _causal_keys(p, d)
        read = geo.n_full * _causal_keys(p - 1, d)
        if geo.n_sliding:
            attn_keys += geo.n_sliding * _causal_keys(p, d, geo.window)
            read += geo.n_sliding * _causal_keys(p - 1, d, geo.window)
        attn_flops += geo.pair_flops_decode * attn_keys / tp
        kv_bytes += (read + d * m.n_layers) * geo.layer_kv
    if requests == 0:
        raise CostModelError("the trace holds no requests")
    batch = min(concurrency, requests)
    steps = decode_tokens / batch
    touched = 1.0 - (1.0 - split.routed_fraction) ** batch if split.routed_experts else 0.0
    step_weights = split.bytes_read(dep, touched) / tp
    decode_bytes = steps * step_weights + kv_bytes
    decode_flops = 2 * split.active * decode_tokens / tp + attn_flops
    bw = dep.memory_bandwidth
    decode_s = max(decode_bytes / bw.bytes_per_s, decode_flops / dep.flops_per_s)
    return ThroughputBound(
        requests=requests, concurrency=batch, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        prefill_flops=prefill_flops, prefill_s=prefill_flops / dep.flops_per_s, decode_steps=steps,
        decode_bytes=decode_bytes, decode_flops=decode_flops, decode_s=decode_s,
        flops_per_s=dep.flops_per_s, bytes_per_s=bw.bytes_per_s, bandwidth_label=bw.label)


# ---------------------------------------------------------------------------
# One operator: a GEMM, an attention forward (the Part 2 labs measure these)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OpCost(_Roofs):
    """FLOPs and HBM bytes of one kernel, and its floors at the given rates."""

    flops: float
    bytes: float
    flops_per_s: float
    bytes_per_s: float


GEMM_DTYPES = {"bf16": 2, "fp8": 1}  # input bytes per element; the output is bf16 either way


def _rates(gpu: str | GPUSpec, dtype: str, tflops: float | None, tb_s: float | None) -> tuple[float, float]:
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if dtype not in GEMM_DTYPES:
        raise CostModelError(f"GEMM dtype must be one of {', '.join(GEMM_DTYPES)}, got {dtype!r}")
    peak = tflops if tflops is not None else g.dense_tflops.get(dtype)
    if peak is None:
        raise CostModelError(f"{g.name} has no dense {dtype} FLOP/s in labs/data/gpus.yaml")
    return peak * 1e12, (tb_s if tb_s is not None else g.hbm_bandwidth_tbps) * 1e12


# --8<-- [start:gemm]
def gemm(gpu: str | GPUSpec, m: int, n: int, k: int, dtype: str = "bf16", tflops: float | None = None,
         tb_s: float | None = None) -> OpCost:
    """Y (m x n, bf16) = X (m x k) @ W (k x n): 2mnk FLOPs; X and W read once, Y written once.

    The byte count is the least any kernel can move; rates default to the datasheet's
    (tflops / tb_s replace them with measured ones).
    """
    if min(m, n, k) < 1:
        raise CostModelError(f"GEMM sizes must be positive, got m={m}, n={n}, k={k}")
    a = GEMM_DTYPES.get(dtype, 0)
    flops_per_s, bytes_per_s = _rates(gpu, dtype, tflops, tb_s)
    return OpCost(2.0 * m * n * k, a * (m * k + k * n) + 2.0 * m * n, flops_per_s, bytes_per_s)


def gemm_ridge_m(gpu: str | GPUSpec, n: int, k: int, dtype: str = "bf16", tflops: float | None = None,
                 tb_s: float | None = None) -> float:
    """The M (rows of X: tokens in the batch) at which the GEMM's intensity equals peak / bandwidth.

    From 2MNK / (a(MK + KN) + 2MN) = R: M = R a K N / (2NK - R a K - 2 R N); inf when
    the weight shape can never reach the ridge.
    """
    a = GEMM_DTYPES.get(dtype, 0)
    flops_per_s, bytes_per_s = _rates(gpu, dtype, tflops, tb_s)
    r = flops_per_s / bytes_per_s
    denom = 2.0 * n * k - r * a * k - 2.0 * r * n
    return math.inf if denom <= 0 else r * a * k * n / denom
# --8<-- [end:gemm]


ATTENTION_IO = ("naive", "flash", "flash_min")


def attention_forward(gpu: str | GPUSpec, batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int,
                      head_dim: int, causal: bool, io: str, block_m: int = 128, tflops: float | None = None,
                      tb_s: float | None = None) -> OpCost:
    """One attention forward's FLOPs (useful pairs only) and the HBM bytes each implementation moves.

    FLOPs: 4 d per (query, key) pair and head (QK^T and PV), pairs counted causally
    (query i of q_len sees the first kv_len - q_len + i + 1 keys) or all q_len x kv_len.
    Bytes, bf16 tensors (b = 2):
      io="naive": Q, K, V read and O written once, plus the score matrix S
        (q_len x kv_len per head) written by QK^T, read and P written by the softmax,
        P read by PV: 4 b x heads x q_len x kv_len; a causal mask (masked_fill) adds
        one more read and write of S and a one-byte read of the mask per score.
      io="flash": Q read and O written once; K and V read once per query tile of
        block_m rows and per query head (causal: only the tiles at or left of the
        diagonal), the upper bound when nothing stays in L2 for a kernel that runs one
        program per tile and query head, as labs/flash_attention's does: the heads of a
        GQA group each read their shared K and V. S never leaves the chip.
      io="flash_min": Q, K, V read and O written once: what a flash kernel moves when
        the programs sharing a head's K and V run together and re-read them from L2.
    """
    b = 2
    if io not in ATTENTION_IO:
        raise CostModelError(f"attention io must be one of {', '.join(ATTENTION_IO)}, got {io!r}")
    if q_len > kv_len:
        raise CostModelError(f"q_len ({q_len}) must not exceed kv_len ({kv_len})")
    past = kv_len - q_len
    pairs = q_len * past + q_len * (q_len + 1) // 2 if causal else q_len * kv_len
    flops = 4.0 * batch * heads * head_dim * pairs
    q_o = 2.0 * batch * heads * q_len * head_dim * b
    kv_once = 2.0 * batch * kv_heads * kv_len * head_dim * b
    if io == "naive":
        s = batch * heads * q_len * kv_len * b
        nbytes = q_o + kv_once + (6.5 if causal else 4) * s
    elif io == "flash_min":
        nbytes = q_o + kv_once
    else:
        tiles = -(-q_len // block_m)
        if causal:  # tile t sees keys up to past + (t + 1) block_m
            keys = sum(min(kv_len, past + (t + 1) * block_m) for t in range(tiles))
        else:
            keys = tiles * kv_len
        nbytes = q_o + 2.0 * batch * heads * keys * head_dim * b
    flops_per_s, bytes_per_s = _rates(gpu, "bf16", tflops, tb_s)
    return OpCost(flops, nbytes, flops_per_s, bytes_per_s)


# ---------------------------------------------------------------------------
# LoRA adapters: bytes of one adapter, and the floor of applying many in one step
# ---------------------------------------------------------------------------

# The projections of a Llama-style layer an adapter can target, and how vLLM 0.33 runs each
# layer under TP: column-parallel layers split their output, row-parallel ones their input.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}


def lora_projections(model: str | ModelSpec) -> dict[str, tuple[int, int, str]]:
    """{projection: (input width, output width, "column" or "row")} of one layer of a dense model."""
    m = get_model(model) if isinstance(model, str) else model
    if m.moe is not None or m.mla is not None:
        raise CostModelError(f"{m.name}: LoRA sizing covers dense models with plain attention only")
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    h, f = m.hidden_size, m.intermediate_size
    return {"q_proj": (h, q, "column"), "k_proj": (h, kv, "column"), "v_proj": (h, kv, "column"),
            "o_proj": (q, h, "row"), "gate_proj": (h, f, "column"), "up_proj": (h, f, "column"),
            "down_proj": (f, h, "row")}


# --8<-- [start:lora_bytes]
def lora_adapter_bytes(model: str | ModelSpec, rank: int, targets: Iterable[str] = LORA_TARGETS,
                       dtype: str = "bfloat16", tp: int = 1) -> int:
    """Bytes of one adapter on one rank: A (r x in) and B (out x r) per targeted projection per layer.

    An adapter replaces no weight: it adds r x (in + out) parameters beside an in x out
    matrix, which is why it stays small against the base: for Llama-3.1-8B on all seven
    projections about 0.5% at rank 16 and 2% at rank 64, less for q and v alone.
    Sharding follows vLLM 0.33 without --fully-sharded-loras (vllm/lora/layers/base_linear.py):
    a column-parallel layer keeps A whole and splits B's rows; a row-parallel one splits A's
    input and keeps B whole.
    """
    m = get_model(model) if isinstance(model, str) else model
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise CostModelError(f"LoRA rank must be a positive integer, got {rank!r}")
    if dtype not in LORA_DTYPES:
        raise CostModelError(f"LoRA dtype must be one of {', '.join(LORA_DTYPES)}, got {dtype!r}")
    formula.check_tensor_parallel(m, tp)
    shapes, targets = lora_projections(m), tuple(targets)
    unknown = [t for t in targets if t not in shapes]
    if unknown or not targets:
        raise CostModelError(f"LoRA targets must be some of {', '.join(LORA_TARGETS)}, got {list(targets)}")
    per_layer = 0
    for name in dict.fromkeys(targets):
        n_in, n_out, kind = shapes[name]
        per_layer += rank * (n_in + n_out // tp) if kind == "column" else rank * (n_in // tp + n_out)
    return per_layer * m.n_layers * LORA_DTYPES[dtype]
# --8<-- [end:lora_bytes]


def lora_slot_bytes(model: str | ModelSpec, rank: int, dtype: str = "bfloat16", tp: int = 1) -> int:
    """Bytes of one GPU slot at `rank` (vLLM's max_lora_rank) on one rank, as vLLM 0.33 allocates it with
    --lora-target-modules unset: every linear projection, plus the model's embedding modules.

    Llama-style models list embed_tokens and lm_head as embedding_modules, and LoRA wraps both
    (vllm/lora/utils.py get_supported_lora_modules): embed_tokens holds A (vocab, r) and B (hidden, r)
    per slot (vllm/lora/layers/vocab_parallel_embedding.py), lm_head A (r, hidden) and B (vocab, r)
    (vllm/lora/layers/logits_processor.py), whole on every rank. For Llama-3.1-8B that is about a tenth
    of the slot: a trained adapter's size (lora_adapter_bytes) undercounts what the slots reserve.
    """
    m = get_model(model) if isinstance(model, str) else model
    tables = 2 * rank * (m.vocab_size + m.hidden_size) * LORA_DTYPES[dtype]
    return lora_adapter_bytes(m, rank, LORA_TARGETS, dtype, tp) + tables


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter beside the base weights of a deployment, per rank."""

    rank: int
    targets: tuple[str, ...]
    bytes: int
    base_bytes: int  # the deployment's weight bytes on one rank
    slot_bytes: int  # one GPU slot of this rank on one rank (lora_slot_bytes), whatever the adapter targets

    @property
    def fraction(self) -> float:
        """Adapter bytes over base weight bytes."""
        return self.bytes / self.base_bytes

    @property
    def per_base(self) -> int:
        """Whole adapters that fit in the bytes of the base weights (rounded down)."""
        return self.base_bytes // self.bytes

    def fit_gib(self, gib: float) -> int:
        """Whole adapters that fit in `gib` GiB (rounded down): a host cache or a slot budget."""
        return int(gib * 2**30 // self.bytes)

    def slots_bytes(self, slots: int) -> int:
        """Bytes of `slots` GPU slots of this rank (vLLM allocates max_loras slots at max_lora_rank)."""
        return slots * self.slot_bytes


def lora_adapter(dep: Deployment, rank: int, targets: Iterable[str] = LORA_TARGETS) -> LoraAdapter:
    """An adapter in the deployment's serving dtype (vLLM's lora_dtype "auto" is the model dtype)."""
    targets = tuple(targets)
    nbytes = lora_adapter_bytes(dep.model, rank, targets, dep.model.serving_dtype, dep.tp)
    slot = lora_slot_bytes(dep.model, rank, dep.model.serving_dtype, dep.tp)
    return LoraAdapter(rank, targets, nbytes, weight_bytes(dep), slot)


# --8<-- [start:lora_op]
def lora_op(gpu: str | GPUSpec, tokens: int, n_in: int, n_out: int, rank: int, adapters: int,
            tflops: float | None = None, tb_s: float | None = None) -> OpCost:
    """The LoRA term of one projection for a batch of `tokens` rows using `adapters` distinct adapters.

    FLOPs: 2 r (in + out) per row (shrink x A^T to r columns, expand by B^T). Bytes, bf16:
    each distinct adapter's A and B read once, X read once, Y read and written once (the
    delta is added to the base output). The r-wide intermediate is left out: a fused
    kernel keeps it on chip, and at r <= 64 it is under r / out of Y's bytes.
    """
    if min(tokens, n_in, n_out, rank, adapters) < 1:
        raise CostModelError(f"LoRA op sizes must be positive, got tokens={tokens}, in={n_in}, out={n_out}, "
                             f"rank={rank}, adapters={adapters}")
    if adapters > tokens:
        raise CostModelError(f"{adapters} distinct adapters need at least as many rows, got {tokens}")
    b = 2
    flops_per_s, bytes_per_s = _rates(gpu, "bf16", tflops, tb_s)
    nbytes = b * (adapters * rank * (n_in + n_out) + tokens * n_in + 2 * tokens * n_out)
    return OpCost(2.0 * tokens * rank * (n_in + n_out), float(nbytes), flops_per_s, bytes_per_s)
# --8<-- [end:lora_op]
