"""What an engine is built from: a model's geometry and positions, and the engine's limits.

A `ModelConfig` comes from labs/data/models.yaml (`from_spec`, the same record every lab and
page sizes things from) or from a local Hugging Face folder's config.json (`from_hf_folder`).
Only Llama-family decoders run here: RMSNorm, RoPE, GQA, SwiGLU, no biases. A model that
needs more (MoE, MLA, sliding windows, q/k/v bias) is refused by name rather than run wrong.
`hf_config_dict` goes the other way, so a test can build transformers' LlamaForCausalLM with
the very same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from labs import specs
from labs.specs import SpecError


class ConfigError(ValueError):
    """A model or engine setting is wrong; the message names it and what is allowed."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE stretch (`rope_type: llama3` in config.json)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "max_position_embeddings"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{self.name}: {f} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"{self.name}: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"{self.name}: RoPE needs an even head_dim, got {self.head_dim}")
        for f in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{self.name}: {f} must be a positive finite number, got {v!r}")

    @classmethod
    def from_spec(cls, name: str) -> "ModelConfig":
        """A model from labs/data/models.yaml; its RoPE fields are read from the same entry."""
        try:
            m = specs.get_model(name)
        except SpecError as exc:
            raise ConfigError(str(exc)) from None
        why = _unsupported(m)
        if why:
            raise ConfigError(f"{name} {why}; the engine runs {', '.join(supported_models())}")
        return cls(name=name, n_layers=m.n_layers, hidden_size=m.hidden_size, n_heads=m.n_heads,
                   n_kv_heads=m.n_kv_heads, head_dim=m.head_dim, intermediate_size=m.intermediate_size,
                   vocab_size=m.vocab_size, max_position_embeddings=m.max_position_embeddings,
                   rms_norm_eps=float(m.rms_norm_eps if m.rms_norm_eps is not None else 1e-5),
                   rope_theta=float(m.rope_theta),
                   rope_scaling=_rope_scaling(dataclasses.asdict(m.rope_scaling) if m.rope_scaling else None, name),
                   tie_word_embeddings=m.tie_word_embeddings)

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> "ModelConfig":
        """The config.json of a local Hugging Face checkpoint (Llama architecture only)."""
        path = Path(folder) / "config.json"
        if not Path(folder).is_dir():
            raise ConfigError(f"--weights {folder}: not a folder")
        if not path.is_file():
            raise ConfigError(f"--weights {folder}: no config.json in it")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        archs = raw.get("architectures") or []
        if archs and archs[0] != "LlamaForCausalLM":
            raise ConfigError(f"{path}: architecture {archs[0]} is not LlamaForCausalLM")
        if raw.get("attention_bias") or raw.get("mlp_bias"):
            raise ConfigError(f"{path}: biases in attention or MLP are not supported")
        try:
            n_heads = raw["num_attention_heads"]
            rope = raw.get("rope_parameters") or {}  # transformers 5 nests rope_theta here
            eos = raw.get("eos_token_id")
            return cls(name=Path(folder).name, n_layers=raw["num_hidden_layers"], hidden_size=raw["hidden_size"],
                       n_heads=n_heads, n_kv_heads=raw.get("num_key_value_heads", n_heads),
                       head_dim=raw.get("head_dim") or raw["hidden_size"] // n_heads,
                       intermediate_size=raw["intermediate_size"], vocab_size=raw["vocab_size"],
                       max_position_embeddings=raw["max_position_embeddings"],
                       rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
                       rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
                       rope_scaling=_rope_scaling(raw.get("rope_scaling") or rope or None, str(path)),
                       tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                       eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]))
        except KeyError as exc:
            raise ConfigError(f"{path}: missing field {exc.args[0]!r}") from None

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def hf_config_dict(self) -> dict:
        """The config.json transformers' LlamaConfig.from_dict reads (4.x and 5.x both accept it)."""
        d = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=self.vocab_size,
                 hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                 num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads,
                 num_key_value_heads=self.n_kv_heads, head_dim=self.head_dim, hidden_act="silu",
                 max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
                 rope_theta=self.rope_theta, tie_word_embeddings=self.tie_word_embeddings,
                 attention_bias=False, mlp_bias=False)
        if self.rope_scaling is not None:
            d["rope_scaling"] = dict(rope_type="llama3", **dataclasses.asdict(self.rope_scaling))
        return d


def _rope_scaling(raw: dict | None, where: str) -> RopeScaling | None:
    if not raw or raw.get("rope_type", raw.get("type", "default")) == "default":
        return None
    if raw.get("rope_type", raw.get("type")) != "llama3":
        raise ConfigError(f"{where}: rope_scaling type {raw.get('rope_type')!r} is not supported (only llama3)")
    try:
        return RopeScaling(float(raw["factor"]), float(raw["low_freq_factor"]), float(raw["high_freq_factor"]),
                           int(raw["original_max_position_embeddings"]))
    except KeyError as exc:
        raise ConfigError(f"{where}: rope_scaling is missing {exc.args[0]!r}") from None


def _unsupported(m: specs.ModelSpec) -> str | None:
    """Why the engine cannot build this model, or None."""
    if m.moe or m.mla or m.sliding_window or m.qkv_bias:
        return "is not a plain Llama-family decoder (MoE, MLA, sliding windows or q/k/v bias)"
    if m.rope_theta is None:
        return "has no rope_theta in labs/data/models.yaml"
    return None


def supported_models() -> list[str]:
    """Names in labs/data/models.yaml the engine can build: plain decoders whose entry carries RoPE fields."""
    return [n for n, m in specs.all_models().items() if _unsupported(m) is None]


@dataclass(frozen=True)
class EngineConfig:
    """The engine's limits, named as vLLM's flags. num_blocks counts usable blocks (the null block is extra)."""

    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_blocks: int | None = None  # None: enough for max_num_seqs sequences of max_model_len
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    policy: str = "continuous"  # or "static": whole batches, no admission until one drains

    def __post_init__(self):
        for f in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{f} must be a positive integer, got {v!r}")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int) or self.num_blocks < 1):
            raise ConfigError(f"num_blocks must be a positive integer, got {self.num_blocks!r}")
        if self.policy not in ("continuous", "static"):
            raise ConfigError(f"policy must be 'continuous' or 'static', got {self.policy!r}")

    @property
    def token_budget(self) -> int:
        """Tokens per step. Without chunked prefill vLLM raises the budget to max_model_len."""
        if self.enable_chunked_prefill:
            return self.max_num_batched_tokens
        return max(self.max_num_batched_tokens, self.max_model_len)

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks if self.num_blocks is not None else self.max_num_seqs * self.blocks_per_seq
