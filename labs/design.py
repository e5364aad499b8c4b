"""Worked system designs, every figure from the cost model (labs/roofline.py).

The system-design lesson sizes three services: a chat API, a multi-tenant LoRA
platform and a long-context RAG service. A page must not do arithmetic, so the
figures a design quotes (replicas, GPUs, pool sizes, cost per million tokens,
what a 2x error would change) are computed here from the cost model's floors
and pools, and tested. Prices and the network bandwidth are assumptions kept in
one data file (labs/data/design.yaml) that a reader can change.

The cost model gives floors: a real engine reaches a fraction of them. A design
plans each replica at `headroom` of its floor capacity, which has to cover both
that gap and the queueing a p99 target needs; the lesson says so where it uses it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from labs import roofline, specs
from labs.kv_sizing import memory_budget

ASSUMPTIONS_FILE = Path(__file__).resolve().parent / "data" / "design.yaml"


class DesignError(specs.SpecError):
    """A design asked for something the model cannot give (no TP fits, bad input)."""


# ---------------------------------------------------------------------------
# Assumptions (labs/data/design.yaml)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Assumptions:
    checked: str
    basis: str
    note: str
    gpu_hour_usd: dict
    network_gb_per_s: float


def load_assumptions(path: Path = ASSUMPTIONS_FILE) -> Assumptions:
    """Read and check the design assumptions: known GPUs, positive prices, a positive bandwidth."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise DesignError(f"{path}: not valid YAML ({err.__class__.__name__})") from None
    if not isinstance(raw, dict):
        raise DesignError(f"{path}: expected a mapping at the top level")
    allowed = {"checked", "basis", "note", "gpu_hour_usd", "network_gb_per_s"}
    unknown = sorted(set(raw) - allowed)
    missing = sorted(allowed - set(raw))
    if unknown or missing:
        raise DesignError(f"{path}: unknown keys {unknown}, missing keys {missing}; allowed: {sorted(allowed)}")
    prices = raw["gpu_hour_usd"]
    if not isinstance(prices, dict) or not prices:
        raise DesignError(f"{path}: gpu_hour_usd must map GPU names to prices")
    gpus = specs.all_gpus()
    for name, price in prices.items():
        if name not in gpus:
            raise DesignError(f"{path}: gpu_hour_usd.{name}: not a GPU of labs/data/gpus.yaml ({', '.join(gpus)})")
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price <= 0:
            raise DesignError(f"{path}: gpu_hour_usd.{name}: must be a positive number of USD, got {price!r}")
    bw = raw["network_gb_per_s"]
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0:
        raise DesignError(f"{path}: network_gb_per_s: must be a positive number, got {bw!r}")
    return Assumptions(checked=str(raw["checked"]), basis=str(raw["basis"]), note=str(raw["note"]),
                       gpu_hour_usd={k: float(v) for k, v in prices.items()}, network_gb_per_s=float(bw))


@lru_cache(maxsize=1)
def assumptions() -> Assumptions:
    return load_assumptions()


def gpu_hour_usd(gpu: str) -> float:
    prices = assumptions().gpu_hour_usd
    if gpu not in prices:
        raise DesignError(f"no GPU-hour price for {gpu!r} in {ASSUMPTIONS_FILE.name}; priced: {', '.join(prices)}")
    return prices[gpu]


def _positive(name: str, value, kind=int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise DesignError(f"{name} must be a positive number, got {value!r}")
    if kind is int and int(value) != value:
        raise DesignError(f"{name} must be a whole number, got {value!r}")


def _deployment(model: str, gpu: str, max_model_len: int, tp: int | None,
                kv_dtype: str = "auto") -> roofline.Deployment:
    m, g = specs.get_model(model), specs.get_gpu(gpu)
    if tp is not None:
        return roofline.deployment(m, g, tp=tp, kv_dtype=kv_dtype)
    dep = roofline.smallest_tp(m, g, max_model_len, kv_dtype=kv_dtype)
    if dep is None:
        raise DesignError(f"{model} on {gpu}: no TP of 1, 2, 4 or 8 holds one {max_model_len}-token request")
    return dep


# ---------------------------------------------------------------------------
# Design 1: a chat API at a QPS and an SLO
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatDesign:
    """A chat service sized from its load, its lengths and its latency targets.

    Per replica: the batch is the smallest of what the TPOT target allows (the
    largest decode batch whose floor at the longest context fits in tpot_s),
    what the KV pool holds at full length, and max_num_seqs. Its floor capacity
    is the cost model's throughput bound for that batch; the plan runs it at
    `headroom`. TTFT: one prompt prefilled in chunks of the default token budget
    next to a full batch of decodes (queueing excluded).
    """

    model: str
    gpu: str
    qps: float
    prompt: int
    output: int
    ttft_s: float
    tpot_s: float
    max_model_len: int = 8192
    headroom: float = 0.5
    tp: int | None = None

    def __post_init__(self):
        for name in ("prompt", "output", "max_model_len"):
            _positive(name, getattr(self, name))
        for name in ("qps", "ttft_s", "tpot_s", "headroom"):
            _positive(name, getattr(self, name), float)
        if self.headroom > 1:
            raise DesignError(f"headroom is the fraction of floor capacity planned, at most 1, got {self.headroom}")
        if self.prompt + self.output > self.max_model_len:
            raise DesignError(f"prompt + output ({self.prompt + self.output}) exceeds max_model_len "
                              f"({self.max_model_len})")

    # --- the deployment ---
    @property
    def dep(self) -> roofline.Deployment:
        return _deployment(self.model, self.gpu, self.max_model_len, self.tp)

    @property
    def pool(self) -> memory_budget.Budget:
        return self.dep.kv_pool(self.max_model_len)

    @property
    def context(self) -> int:
        """The longest context a request decodes at: its prompt plus its output."""
        return self.prompt + self.output

    @property
    def batch_by_tpot(self) -> int:
        return self.dep.largest_batch(self.context, self.tpot_s)

    @property
    def batch_by_kv(self) -> int:
        return self.pool.requests_of(self.context)

    @property
    def batch(self) -> int:
        return min(self.batch_by_tpot, self.batch_by_kv, self.pool.max_num_seqs)

    @property
    def limit(self) -> str:
        """What caps the batch: 'tpot', 'kv' or 'max_num_seqs'."""
        caps = {"tpot": self.batch_by_tpot, "kv": self.batch_by_kv, "max_num_seqs": self.pool.max_num_seqs}
        return min(caps, key=caps.get)

    @property
    def decode_step(self) -> roofline.StepCost:
        return self.dep.decode(max(self.batch, 1), self.context)

    @property
    def prefill(self) -> roofline.ChunkedPrefill:
        """The prompt's chunked prefill next to a full batch of decodes at the longest context."""
        return self.dep.chunked_prefill(self.prompt, self.pool.max_num_batched_tokens,
                                        decodes=max(self.batch - 1, 0), context=self.context)

    @property
    def ttft_floor_s(self) -> float:
        return self.prefill.total_s

    @property
    def meets_ttft(self) -> bool:
        return self.ttft_floor_s <= self.ttft_s

    @property
    def bound(self) -> roofline.ThroughputBound:
        if self.batch < 1:
            raise DesignError(f"{self.model} on {self.gpu}: no batch meets a TPOT of {self.tpot_s} s at "
                              f"{self.context} tokens of context")
        return self.dep.throughput_bound([(self.prompt, self.output)] * (self.batch * 4), self.batch)

    # --- the plan ---
    @property
    def floor_rps(self) -> float:
        """Requests per second one replica serves at its floor (an upper bound)."""
        return self.bound.requests_per_s

    @property
    def planned_rps(self) -> float:
        return self.floor_rps * self.headroom

    @property
    def replicas(self) -> int:
        return math.ceil(self.qps / self.planned_rps - 1e-9)

    @property
    def gpus(self) -> int:
        return self.replicas * self.dep.tp

    @property
    def utilisation(self) -> float:
        """The load as a fraction of the fleet's floor capacity."""
        return self.qps / (self.replicas * self.floor_rps)

    @property
    def gpu_hour_usd(self) -> float:
        return gpu_hour_usd(self.gpu)

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.gpu_hour_usd

    @property
    def usd_per_million_output(self) -> float:
        return self.usd_per_hour / (self.qps * 3600 * self.output) * 1e6

    @property
    def usd_per_million_tokens(self) -> float:
        """Prompt and output tokens together, the way most price lists blend them."""
        return self.usd_per_hour / (self.qps * 3600 * self.context) * 1e6

    def doubled(self, name: str) -> "ChatDesign":
        """The same design with one input doubled (qps, prompt, output, tpot_s, ttft_s)."""
        if name not in ("qps", "prompt", "output", "tpot_s", "ttft_s"):
            raise DesignError(f"doubled({name!r}): choose qps, prompt, output, tpot_s or ttft_s")
        value = getattr(self, name) * 2
        changes = {name: value}
        if name in ("prompt", "output") and self.prompt + self.output + getattr(self, name) > self.max_model_len:
            changes["max_model_len"] = self.max_model_len * 2
        return dataclasses.replace(self, **changes)

    def tp_options(self, choices=(1, 2, 4, 8)) -> list["ChatDesign"]:
        """The design at every TP that holds a request and meets the TPOT target, fewest GPUs first."""
        found = []
        for tp in choices:
            try:
                option = dataclasses.replace(self, tp=tp)
                if not option.pool.fits_one_request or option.batch < 1:
                    continue
            except specs.SpecError:
                continue
            found.append(option)
        return sorted(found, key=lambda o: (o.gpus, o.dep.tp))

    def at_tp(self, tp: int) -> "ChatDesign":
        """The same design at another tensor-parallel size."""
        return dataclasses.replace(self, tp=tp)

    def half_speed(self) -> "ChatDesign":
        """The same design if the engine reached half the floor capacity assumed (headroom halved)."""
        return dataclasses.replace(self, headroom=self.headroom / 2)


# ---------------------------------------------------------------------------
# Design 2: a multi-tenant LoRA platform
# ---------------------------------------------------------------------------

def lora_adapter_bytes(model: str, rank: int, tp: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes of one adapter on all seven projections on one rank (the cost model's roofline.lora_adapter_bytes)."""
    _positive("rank", rank)
    _positive("tp", tp)
    dtype = {2: "bfloat16", 4: "float32"}.get(dtype_bytes)
    if dtype is None:
        raise DesignError(f"dtype_bytes must be 2 or 4, got {dtype_bytes}")
    try:
        return roofline.lora_adapter_bytes(model, rank, roofline.LORA_TARGETS, dtype, tp)
    except roofline.CostModelError as err:
        raise DesignError(str(err)) from None


@dataclass(frozen=True)
class LoraDesign:
    """Many adapters on one base model: GPU slots, host cache, pool and step cost.

    vLLM allocates max_loras GPU slots, each max_lora_rank wide, at start-up; the
    profiler counts them before the KV pool is sized, so they come out of the pool.
    A step reads the slots its batch uses on top of the base weights.
    """

    model: str
    gpu: str
    adapters: int            # adapters registered on the platform
    typical_rank: int        # the rank most adapters use
    max_loras: int           # --max-loras: distinct adapters one batch may hold
    max_lora_rank: int       # --max-lora-rank: the slot width
    max_cpu_loras: int       # --max-cpu-loras: adapters kept in host memory
    batch: int = 64
    context: int = 2048
    max_model_len: int = 8192
    tp: int | None = None

    def __post_init__(self):
        for name in ("adapters", "typical_rank", "max_loras", "max_lora_rank", "max_cpu_loras", "batch",
                     "context", "max_model_len"):
            _positive(name, getattr(self, name))
        if self.max_cpu_loras < self.max_loras:
            raise DesignError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}), "
                              "as vLLM requires")
        if self.typical_rank > self.max_lora_rank:
            raise DesignError(f"typical_rank {self.typical_rank} exceeds max_lora_rank {self.max_lora_rank}")

    @property
    def dep(self) -> roofline.Deployment:
        return _deployment(self.model, self.gpu, self.max_model_len, self.tp)

    @property
    def adapter_bytes(self) -> int:
        """One typical adapter on one rank, at its own rank."""
        return lora_adapter_bytes(self.model, self.typical_rank, self.dep.tp)

    @property
    def slot_bytes(self) -> int:
        """One GPU slot on one rank, at max_lora_rank: the projections and the embedding modules' slots."""
        return roofline.lora_slot_bytes(self.model, self.max_lora_rank, tp=self.dep.tp)

    @property
    def gpu_slots_bytes(self) -> int:
        return self.max_loras * self.slot_bytes

    @property
    def host_cache_bytes(self) -> int:
        """Host memory for max_cpu_loras typical adapters (whole, all ranks)."""
        return self.max_cpu_loras * lora_adapter_bytes(self.model, self.typical_rank)

    @property
    def pool_without(self) -> memory_budget.Budget:
        return self.dep.kv_pool(self.max_model_len)

    @property
    def pool_with(self) -> memory_budget.Budget:
        dep = self.dep
        return memory_budget.budget(dep.model, dep.gpu, self.max_model_len, kv_cache_dtype=dep.kv_dtype,
                                    tensor_parallel_size=dep.tp,
                                    weights=roofline.weight_bytes(dep) + self.gpu_slots_bytes)

    @property
    def pool_loss(self) -> float:
        """Fraction of the KV pool the slots take."""
        return 1 - self.pool_with.kv_pool / self.pool_without.kv_pool

    @property
    def base_step(self) -> roofline.StepCost:
        return self.dep.decode(self.batch, self.context)

    @property
    def step_extra_bytes(self) -> int:
        """Bytes a decode step reads for adapters when its batch uses every slot."""
        return min(self.max_loras, self.batch, self.adapters) * self.slot_bytes

    @property
    def step_overhead(self) -> float:
        """Decode-step floor with the adapters' reads over the floor without (memory-bound step)."""
        base = self.base_step
        extra_s = self.step_extra_bytes / self.dep.memory_bandwidth.bytes_per_s
        return (base.floor_s + extra_s) / base.floor_s

    @property
    def resident_fraction(self) -> float:
        """Fraction of registered adapters the host cache holds; the rest load from disk on first use."""
        return min(1.0, self.max_cpu_loras / self.adapters)

    def doubled(self, name: str) -> "LoraDesign":
        if name not in ("max_loras", "max_lora_rank", "max_cpu_loras", "adapters", "typical_rank"):
            raise DesignError(f"doubled({name!r}): choose max_loras, max_lora_rank, max_cpu_loras, adapters "
                              "or typical_rank")
        return dataclasses.replace(self, **{name: getattr(self, name) * 2})


# ---------------------------------------------------------------------------
# Design 3: a long-context RAG service
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RagDesign:
    """Long prompts built from shared documents: the KV wall, prefix hits, chunk stalls, disaggregation.

    A prompt is `document` tokens of retrieved text (shared by many queries when
    prefix caching hits) plus `question` tokens, and the answer is `output` tokens.
    """

    model: str
    gpu: str
    document: int
    question: int
    output: int
    tpot_s: float
    hit_rate: float = 0.8    # fraction of prompts whose document is already in the prefix cache
    max_model_len: int = 32768
    tp: int | None = None
    kv_dtype: str = "auto"
    max_num_seqs: int | None = None   # the design's cap on running requests (None: vLLM's default)
    chunk_budget: int | None = None   # --max-num-batched-tokens (None: vLLM's default for the GPU)

    def __post_init__(self):
        for name in ("document", "question", "output", "max_model_len"):
            _positive(name, getattr(self, name))
        _positive("tpot_s", self.tpot_s, float)
        if not 0 <= self.hit_rate <= 1:
            raise DesignError(f"hit_rate is a fraction between 0 and 1, got {self.hit_rate}")
        if self.prompt + self.output > self.max_model_len:
            raise DesignError(f"prompt + output ({self.prompt + self.output}) exceeds max_model_len "
                              f"({self.max_model_len})")

    @property
    def prompt(self) -> int:
        return self.document + self.question

    @property
    def context(self) -> int:
        return self.prompt + self.output

    @property
    def dep(self) -> roofline.Deployment:
        return _deployment(self.model, self.gpu, self.max_model_len, self.tp, self.kv_dtype)

    @property
    def pool(self) -> memory_budget.Budget:
        return self.dep.kv_pool(self.max_model_len)

    @property
    def kv_per_request(self) -> int:
        """KV bytes of one full request on one rank."""
        return self.dep.kv_bytes(self.context)

    @property
    def batch_by_kv(self) -> int:
        return self.pool.requests_of(self.context)

    @property
    def batch_by_tpot(self) -> int:
        return self.dep.largest_batch(self.context, self.tpot_s)

    @property
    def batch(self) -> int:
        return min(self.batch_by_kv, self.batch_by_tpot, self.max_num_seqs or self.pool.max_num_seqs)

    @property
    def decode_step(self) -> roofline.StepCost:
        return self.dep.decode(max(self.batch, 1), self.context)

    @property
    def cold_prefill(self) -> roofline.StepCost:
        return self.dep.prefill(self.prompt)

    @property
    def warm_prefill(self) -> roofline.StepCost:
        """The question alone, with the document's KV already in the prefix cache."""
        return self.dep.prefill(self.question, cached=self.document)

    @property
    def prefill_saving(self) -> float:
        return self.cold_prefill.floor_s / self.warm_prefill.floor_s

    @property
    def prefill_s_per_request(self) -> float:
        """Expected prefill floor per request at the design's hit rate."""
        return self.hit_rate * self.warm_prefill.floor_s + (1 - self.hit_rate) * self.cold_prefill.floor_s

    @property
    def chunked(self) -> roofline.ChunkedPrefill:
        """A cold prompt in chunks of the default token budget, next to a full decode batch."""
        return self.chunked_at(self.chunk_budget or self.pool.max_num_batched_tokens)

    def chunked_at(self, budget: int) -> roofline.ChunkedPrefill:
        """A cold prompt in chunks of `budget` tokens per step, next to a full decode batch."""
        return self.dep.chunked_prefill(self.prompt, budget, decodes=max(self.batch - 1, 0), context=self.context)

    @property
    def cached_documents(self) -> int:
        """Documents the pool can keep cached beside a full batch of running requests."""
        blocks = -(-self.context // self.pool.block_size)
        spare = self.pool.num_blocks - 1 - self.batch * blocks
        return max(spare, 0) // -(-self.document // self.pool.block_size)

    @property
    def transfer_bytes(self) -> int:
        """KV bytes a disaggregated prefill node ships per cold prompt (all ranks)."""
        return self.dep.kv_bytes(self.prompt) * self.dep.tp

    @property
    def transfer_s(self) -> float:
        return self.transfer_bytes / (assumptions().network_gb_per_s * 1e9)

    def with_(self, **changes) -> "RagDesign":
        """The same design with some inputs changed (kv_dtype="fp8", hit_rate=0.4, tp=2, ...)."""
        return dataclasses.replace(self, **changes)

    def doubled(self, name: str) -> "RagDesign":
        """One input doubled (output, tpot_s); max_model_len grows to hold a longer answer."""
        if name not in ("output", "tpot_s"):
            raise DesignError(f"doubled({name!r}): choose output or tpot_s (a longer document may not fit the "
                              "model's context: build it with with_(document=..., max_model_len=...))")
        changes = {name: getattr(self, name) * 2}
        if name == "output" and self.context + self.output > self.max_model_len:
            changes["max_model_len"] = specs.get_model(self.model).max_position_embeddings
        return dataclasses.replace(self, **changes)

    def halved(self, name: str) -> "RagDesign":
        """One input halved (hit_rate, document)."""
        if name not in ("hit_rate", "document"):
            raise DesignError(f"halved({name!r}): choose hit_rate or document")
        value = getattr(self, name) / 2
        return dataclasses.replace(self, **{name: value if name == "hit_rate" else int(value)})


# The three designs the lesson and the bank's design questions work through.
DESIGNS = {
    "chat": lambda: ChatDesign(model="llama-3.1-70b", gpu="h100-sxm", qps=20, prompt=1500, output=300,
                               ttft_s=1.0, tpot_s=0.05, max_model_len=8192, tp=4),
    "lora": lambda: LoraDesign(model="llama-3.1-8b", gpu="a100-80gb", adapters=400, typical_rank=16,
                               max_loras=16, max_lora_rank=64, max_cpu_loras=128, batch=64, context=2048,
                               max_model_len=8192),
    "rag": lambda: RagDesign(model="qwen3-8b", gpu="h200", document=24000, question=1000, output=500,
                             tpot_s=0.04, max_model_len=32768, kv_dtype="fp8", max_num_seqs=32,
                             chunk_budget=2048),
}


def design(name: str):
    """One of the worked designs by name (chat, lora, rag)."""
    if name not in DESIGNS:
        raise DesignError(f"design({name!r}): the worked designs are {', '.join(DESIGNS)}")
    return DESIGNS[name]()
