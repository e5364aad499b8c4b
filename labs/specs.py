"""Model and GPU specifications, loaded once from labs/data/*.yaml.

The labs and the site pages both size things from these records, so a model's
geometry or a GPU's memory is typed exactly once (in the YAML). This module is
plain Python (standard library + pyyaml): the site build imports it and must
never need torch.

    get_model("llama-3.1-8b")   -> ModelSpec
    get_gpu("h200")             -> GPUSpec
    all_models(), all_gpus()    -> dict name -> record, in file order
    model_from_hf_config(path)  -> ModelSpec from a local Hugging Face config.json

Each record is a frozen dataclass whose ``__post_init__`` checks the invariants
a wrong number would break (heads divisible into KV groups, a layer pattern
made of known kinds), so a typo in the YAML fails at load, not as a silently
wrong page.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labs import datafile

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS_FILE = DATA_DIR / "models.yaml"
GPUS_FILE = DATA_DIR / "gpus.yaml"

# Bytes per element of the dtypes a config.json's torch_dtype can name.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
LAYER_KINDS = ("full", "sliding")


class SpecError(ValueError):
    """A spec file, a name or a config.json is wrong; the message says which and where."""


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): what one layer caches per token."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self):
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if getattr(self, name) <= 0:
                raise SpecError(f"mla.{name} must be positive, got {getattr(self, name)}")

    @property
    def latent_dim(self) -> int:
        """Elements cached per layer per token: the compressed KV plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoE:
    n_routed_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    n_shared_experts: int = 0
    first_dense_layers: int = 0

    def __post_init__(self):
        if not 0 < self.experts_per_token <= self.n_routed_experts:
            raise SpecError(
                f"moe.experts_per_token ({self.experts_per_token}) must be in "
                f"1..n_routed_experts ({self.n_routed_experts})"
            )


@dataclass(frozen=True)
class SlidingWindow:
    window: int
    layer_pattern: tuple[str, ...]

    def __post_init__(self):
        if self.window <= 0:
            raise SpecError(f"sliding_window.window must be positive, got {self.window}")
        bad = [k for k in self.layer_pattern if k not in LAYER_KINDS]
        if bad or not self.layer_pattern:
            raise SpecError(
                f"sliding_window.layer_pattern must be a non-empty list of {LAYER_KINDS}, got {list(self.layer_pattern)}"
            )


@dataclass(frozen=True)
class RopeScaling:
    """config.json's `rope_scaling` for Llama 3's frequency scaling (rope_type llama3)."""

    rope_type: str
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if self.rope_type != "llama3":
            raise SpecError(f"rope_scaling.rope_type must be 'llama3' (the only scaling modelled), got {self.rope_type!r}")
        if min(self.factor, self.low_freq_factor, self.high_freq_factor, self.original_max_position_embeddings) <= 0:
            raise SpecError("rope_scaling values must be positive")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    display_name: str
    hf_id: str
    source: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    dtype: str
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    weight_dtype: str | None = None
    params_total: int | None = None
    params_active: int | None = None
    params_source: str = ""
    mla: MLA | None = None
    moe: MoE | None = None
    sliding_window: SlidingWindow | None = None
    # RoPE and norm constants, for models the engine lab runs (labs/engine/config.py).
    rms_norm_eps: float | None = None
    rope_theta: float | None = None
    rope_scaling: RopeScaling | None = None
    derived: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim",
                     "vocab_size", "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"{self.name}: {name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads != 0:
            raise SpecError(
                f"{self.name}: n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise SpecError(f"{self.name}: dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        if self.weight_dtype is not None and self.weight_dtype not in DTYPE_BYTES:
            raise SpecError(f"{self.name}: weight_dtype {self.weight_dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        if self.mla is not None and self.head_dim != self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim:
            raise SpecError(
                f"{self.name}: for MLA, head_dim ({self.head_dim}) must be qk_nope_head_dim + qk_rope_head_dim "
                f"({self.mla.qk_nope_head_dim} + {self.mla.qk_rope_head_dim})"
            )
        if self.mla is not None and self.sliding_window is not None:
            raise SpecError(f"{self.name}: MLA with sliding-window layers is not modelled")
        if self.params_active is not None and self.params_total is not None and self.params_active > self.params_total:
            raise SpecError(f"{self.name}: params_active exceeds params_total")
        if self.moe is not None and self.moe.first_dense_layers >= self.n_layers:
            raise SpecError(f"{self.name}: moe.first_dense_layers must be below n_layers")

    @property
    def attention(self) -> str:
        """'mla', 'mha' or 'gqa' (MQA is GQA with one KV head)."""
        if self.mla is not None:
            return "mla"
        return "mha" if self.n_kv_heads == self.n_heads else "gqa"

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head: 1 for MHA, n_heads for MQA (MLA: every head reads the one latent)."""
        return self.n_heads if self.mla is not None else self.n_heads // self.n_kv_heads

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Attention kind of every layer, in order."""
        if self.sliding_window is None:
            return ("full",) * self.n_layers
        pattern = self.sliding_window.layer_pattern
        return tuple(pattern[i % len(pattern)] for i in range(self.n_layers))

    @property
    def n_sliding_layers(self) -> int:
        return self.layer_kinds.count("sliding")

    @property
    def n_full_layers(self) -> int:
        return self.layer_kinds.count("full")

    @property
    def serving_dtype(self) -> str:
        """The dtype vLLM 0.33 runs with --dtype auto on CUDA.

        vllm/config/model.py `_resolve_auto_dtype` downcasts float32 configs to
        the platform's first supported dtype (bfloat16 on Ampere and newer).
        """
        return "bfloat16" if self.dtype == "float32" else self.dtype

    @property
    def weight_bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.weight_dtype or self.serving_dtype]

    @property
    def table_bytes_per_param(self) -> int:
        """Bytes per parameter of the embedding and LM head: quantized checkpoints keep them 16-bit.

        vLLM 0.33's fp8 method quantizes LinearBase layers and experts only, and ParallelLMHead is a
        VocabParallelEmbedding (vllm/model_executor/layers/quantization/fp8.py get_quant_method);
        DeepSeek-V3's fp8 checkpoint stores both tables in bf16.
        """
        return DTYPE_BYTES[self.serving_dtype]

    @property
    def table_params(self) -> int:
        """Parameters of the input embedding and the LM head (one table when they are tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def estimated_params(self) -> tuple[int, int]:
        """(total, active) parameters recomputed from the geometry.

        Counts embeddings, attention projections (with q/k/v bias when set),
        gated MLPs (three matrices) or MoE experts plus router, and RMSNorm
        weights. MLA projections are not modelled: returns the stated counts.
        """
        if self.mla is not None:
            return self.params_total or 0, self.params_active or self.params_total or 0
        h, d = self.hidden_size, self.head_dim
        q, kv = self.n_heads * d, self.n_kv_heads * d
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        norms = 2 * h
        dense_mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        if self.moe is None:
            total = self.n_layers * (attn + dense_mlp + norms) + embed + h
            return total, total
        m = self.moe
        expert = 3 * h * m.moe_intermediate_size
        router = h * m.n_routed_experts
        moe_layers = self.n_layers - m.first_dense_layers
        per_moe_total = attn + norms + router + (m.n_routed_experts + m.n_shared_experts) * expert
        per_moe_active = attn + norms + router + (m.experts_per_token + m.n_shared_experts) * expert
        dense_part = m.first_dense_layers * (attn + dense_mlp + norms)
        total = dense_part + moe_layers * per_moe_total + embed + h
        active = dense_part + moe_layers * per_moe_active + embed + h
        return total, active

    @property
    def params(self) -> int:
        """Total parameters: the stated count, else the estimate."""
        return self.params_total if self.params_total is not None else self.estimated_params()[0]

    def weight_bytes_at(self, bytes_per_weight: float) -> float:
        """Bytes of all weights with the matmul weights at `bytes_per_weight` and the embedding and LM head
        at their own 16-bit width (table_bytes_per_param): the one rule the cost model uses too."""
        return ((self.params - self.table_params) * bytes_per_weight
                + self.table_params * self.table_bytes_per_param)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights at the dtypes vLLM loads (estimate for quantized checkpoints: no scales)."""
        return int(self.weight_bytes_at(self.weight_bytes_per_param))


@dataclass(frozen=True)
class GPUSpec:
    name: str
    display_name: str
    source: str
    memory_type: str
    memory_gb_marketed: float
    memory_mib_reported: int
    hbm_bandwidth_tbps: float
    dense_tflops: dict[str, float | None]
    sm_count: int
    l2_mb: float | None
    nvlink_gbps: float | None
    provenance: dict[str, str]
    whitepaper: str = ""
    notes: str = ""
    memory_mib_cuda: int | None = None
    cuda_name: str | None = None  # torch.cuda.get_device_name(), the key lab results are recorded under
    sm_clock_mhz: float | None = None  # the SM clock the driver reports (no datasheet gives one figure)

    def __post_init__(self):
        if self.memory_mib_cuda is not None and not 0 < self.memory_mib_cuda <= self.memory_mib_reported:
            raise SpecError(f"{self.name}: memory_mib_cuda must be positive and at most memory_mib_reported")
        if self.sm_clock_mhz is not None and not 100 <= self.sm_clock_mhz <= 10_000:
            raise SpecError(f"{self.name}: sm_clock_mhz must be in MHz (100 to 10,000), got {self.sm_clock_mhz}")
        if self.memory_mib_reported <= 0 or self.memory_gb_marketed <= 0:
            raise SpecError(f"{self.name}: memory sizes must be positive")
        # The driver never reports more than the marketed decimal GB.
        if self.memory_mib_reported * 2**20 > self.memory_gb_marketed * 1.1e9:
            raise SpecError(
                f"{self.name}: memory_mib_reported ({self.memory_mib_reported} MiB) exceeds the marketed "
                f"{self.memory_gb_marketed} GB by more than 10%: check the units"
            )
        for dtype in ("bf16", "fp8", "fp32"):
            if dtype not in self.dense_tflops:
                raise SpecError(f"{self.name}: dense_tflops is missing {dtype!r} (use null if unsupported)")
        allowed = {"datasheet", "whitepaper", "reported", "measured"}
        bad = {k: v for k, v in self.provenance.items() if v not in allowed}
        if bad:
            raise SpecError(f"{self.name}: provenance values must be in {sorted(allowed)}, got {bad}")

    @property
    def memory_bytes_reported(self) -> int:
        """nvidia-smi's total, in bytes."""
        return self.memory_mib_reported * 2**20

    @property
    def memory_bytes_budget(self) -> int:
        """The total vLLM multiplies by gpu_memory_utilization: cudaMemGetInfo's, else nvidia-smi's."""
        return (self.memory_mib_cuda or self.memory_mib_reported) * 2**20

    @property
    def memory_gib_reported(self) -> float:
        return self.memory_mib_reported / 1024


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _require(mapping: dict, key: str, where: str) -> Any:
    if key not in mapping or mapping[key] is None:
        raise SpecError(f"{where}: missing field {key!r}")
    return mapping[key]


def _entries(path: str, section: str, record: type) -> dict:
    """Every entry of `section` in a data file as a `record`, checked field by field.

    An unknown key is an error, not a value silently dropped: `tie_word_embedings: true`
    would otherwise read as tie_word_embeddings = false. Errors read `file:line: field: message`.
    """
    shown = Path(path).name if Path(path).parent == DATA_DIR else path
    try:
        doc = datafile.load(path, f"labs/data/{shown}" if Path(path).parent == DATA_DIR else shown)
        if not isinstance(doc.data, dict) or set(doc.data) != {section}:
            found = sorted(map(str, doc.data)) if isinstance(doc.data, dict) else type(doc.data).__name__
            raise doc.error((), f"expected one top-level key '{section}', found {found}")
        entries = doc.data[section]
        if not isinstance(entries, dict) or not entries:
            raise doc.error((section,), "expected a mapping of names to entries")
        return {name: datafile.build(record, entry, doc, (section, name), name=str(name))
                for name, entry in entries.items()}
    except datafile.DataError as exc:
        raise SpecError(str(exc)) from None


@functools.lru_cache(maxsize=None)
def _load_models(path: str = str(MODELS_FILE)) -> dict[str, ModelSpec]:
    return _entries(path, "models", ModelSpec)


@functools.lru_cache(maxsize=None)
def _load_gpus(path: str = str(GPUS_FILE)) -> dict[str, GPUSpec]:
    return _entries(path, "gpus", GPUSpec)


def all_models() -> dict[str, ModelSpec]:
    """Every model of labs/data/models.yaml, by name, in file order."""
    return dict(_load_models())


def all_gpus() -> dict[str, GPUSpec]:
    """Every GPU of labs/data/gpus.yaml, by name, in file order."""
    return dict(_load_gpus())


def get_model(name: str) -> ModelSpec:
    models = _load_models()
    if name not in models:
        raise SpecError(f"unknown model {name!r}; known models: {', '.join(models)}")
    return models[name]


def get_gpu(name: str) -> GPUSpec:
    gpus = _load_gpus()
    if name not in gpus:
        raise SpecError(f"unknown GPU {name!r}; known GPUs: {', '.join(gpus)}")
    return gpus[name]


# ---------------------------------------------------------------------------
# Hugging Face config.json
# ---------------------------------------------------------------------------


def _layer_pattern_from_hf(cfg: dict, n_layers: int, where: str) -> SlidingWindow | None:
    """Which layers slide, read the way vLLM 0.33's model files read it.

    gemma2/gemma3 (and newer configs generally) carry `layer_types`; older
    Gemma 3 configs carry `sliding_window_pattern` (every N-th layer global);
    a config with `sliding_window` set and neither (Mistral v0.1) slides on every
    layer, unless `use_sliding_window` is false (Qwen2).
    """
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return None
    if cfg.get("layer_types"):
        kinds = ["sliding" if t == "sliding_attention" else "full" for t in cfg["layer_types"]]
        if len(kinds) != n_layers:
            raise SpecError(f"{where}: layer_types has {len(kinds)} entries for {n_layers} layers")
        if "sliding" not in kinds:
            return None
        return SlidingWindow(window=int(window), layer_pattern=tuple(kinds))
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern")
    if pattern:
        return SlidingWindow(window=int(window), layer_pattern=("sliding",) * (int(pattern) - 1) + ("full",))
    if cfg.get("model_type") == "gemma2":
        return SlidingWindow(window=int(window), layer_pattern=("sliding", "full"))
    return SlidingWindow(window=int(window), layer_pattern=("sliding",))


_HF_INT_FIELDS = frozenset({
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "intermediate_size", "max_position_embeddings", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
    "v_head_dim", "q_lora_rank", "num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "sliding_window", "sliding_window_pattern",
})


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a local Hugging Face config.json.

    Multimodal configs are read through their `text_config`. Parameter counts
    are not in config.json, so they are estimated from the geometry (and left
    unknown for MLA models).
    """
    path = Path(path)
    where = str(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{where}: is a folder; give the path of its config.json") from None
    except OSError as exc:
        raise SpecError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{where}: not UTF-8 text, so not a config.json") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply to be a config.json") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{where}: expected a JSON object at the top level")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**{k: v for k, v in cfg.items() if k != "text_config"}, **cfg["text_config"]}
    try:
        return _model_from_hf_dict(cfg, path, where, name)
    except SpecError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a field of an unexpected shape
        raise SpecError(f"{where}: a field has an unexpected type or shape ({type(exc).__name__}: {exc})") from None


def _model_from_hf_dict(cfg: dict, path: Path, where: str, name: str | None) -> ModelSpec:

    # A config.json is someone else's file: its numbers are checked before any arithmetic on them.
    for key, value in cfg.items():
        if key in _HF_INT_FIELDS and value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise SpecError(f"{where}: field {key!r} must be a non-negative integer, got {value!r}")
    n_layers = _require(cfg, "num_hidden_layers", where)
    hidden = _require(cfg, "hidden_size", where)
    n_heads = _require(cfg, "num_attention_heads", where)
    if not n_heads:
        raise SpecError(f"{where}: num_attention_heads must be at least 1")
    n_kv = cfg.get("num_key_value_heads") or n_heads
    derived = []
    if "num_key_value_heads" not in cfg:
        derived.append("n_kv_heads = n_heads (no num_key_value_heads: MHA)")
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLA(kv_lora_rank=cfg["kv_lora_rank"],
                  qk_rope_head_dim=_require(cfg, "qk_rope_head_dim", where),
                  qk_nope_head_dim=_require(cfg, "qk_nope_head_dim", where),
                  v_head_dim=_require(cfg, "v_head_dim", where),
                  q_lora_rank=cfg.get("q_lora_rank"))
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        derived.append("head_dim = qk_nope_head_dim + qk_rope_head_dim")
    elif cfg.get("head_dim"):
        head_dim = cfg["head_dim"]
    else:
        if hidden % n_heads:
            raise SpecError(f"{where}: no head_dim and hidden_size {hidden} is not divisible by {n_heads} heads")
        head_dim = hidden // n_heads
        derived.append(f"head_dim = hidden_size / n_heads = {hidden} / {n_heads}")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if dtype is None:
        raise SpecError(f"{where}: missing field 'torch_dtype' (or 'dtype')")
    dtype = {"float": "float32", "half": "float16"}.get(dtype, dtype)
    moe = None
    n_experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts")
    if n_experts:
        moe = MoE(n_routed_experts=n_experts,
                  experts_per_token=_require(cfg, "num_experts_per_tok", where),
                  moe_intermediate_size=cfg.get("moe_intermediate_size") or _require(cfg, "intermediate_size", where),
                  n_shared_experts=cfg.get("n_shared_experts") or 0,
                  first_dense_layers=cfg.get("first_k_dense_replace") or 0)
    weight_dtype = None
    quant = cfg.get("quantization_config") or {}
    if quant.get("quant_method") == "fp8":
        weight_dtype = "fp8"
    spec_name = name or (cfg.get("_name_or_path") or path.parent.name or "config")
    return ModelSpec(
        name=str(spec_name),
        display_name=str(spec_name),
        hf_id=str(cfg.get("_name_or_path") or ""),
        source=where,
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=_require(cfg, "vocab_size", where),
        intermediate_size=_require(cfg, "intermediate_size", where),
        dtype=dtype,
        max_position_embeddings=_require(cfg, "max_position_embeddings", where),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", False)) or cfg.get("model_type") == "qwen2",
        weight_dtype=weight_dtype,
        mla=mla,
        moe=moe,
        sliding_window=_layer_pattern_from_hf(cfg, n_layers, where),
        derived=tuple(derived + ["params estimated from the geometry"]),
    )
