"""RoPE's rotation frequencies under each context-extension rule, and what they do to attention.

Plain Python (math only): the site draws its figures from these functions at build time,
and the GPU machine never needs them.

Notation. A head of width d rotates d/2 pairs of dimensions; pair i turns by the angle
p * f_i at position p, with f_i = theta ** (-2i / d) (RoFormer). Its wavelength is
lambda_i = 2 pi / f_i tokens. L is the context the model was trained on
(original_max_position_embeddings), s the extension factor. A rule replaces f_i by f'_i:

* "rope"   plain extrapolation: f'_i = f_i. Past L, the slow pairs reach angles training never
           produced.
* "pi"     position interpolation (Chen et al. 2023): f'_i = f_i / s, i.e. position p is read
           as p / s. Every pair stays inside its trained angles up to s L, but neighbouring
           tokens move s times closer in angle.
* "ntk"    NTK-aware scaling (bloc97, 2023): a new base theta * s ** (d / (d - 2)). The fastest
           pair (i = 0) is untouched and the slowest (i = d/2 - 1) is divided by exactly s.
* "yarn"   YaRN (Peng et al. 2023): "NTK-by-parts" frequencies plus an attention temperature.
           With r_i = L / lambda_i (turns pair i makes over the trained context) and the ramp
           gamma(r) = 0 below alpha, 1 above beta, (r - alpha) / (beta - alpha) between:
           f'_i = (1 - gamma) f_i / s + gamma f_i. The paper's values for LLaMA are alpha = 1,
           beta = 32. The logits are multiplied by (0.1 ln s + 1) ** 2 (the paper scales q and
           k by sqrt(1/t) = 0.1 ln s + 1 each).
* "llama3" Llama 3.1's rope_scaling (rope_type llama3 in config.json): pairs whose wavelength
           is below L / high_freq_factor keep f_i; those above L / low_freq_factor get f_i / s;
           in between, with smooth = (L / lambda_i - low) / (high - low),
           f'_i = (1 - smooth) f_i / s + smooth f_i. It is the NTK-by-parts shape with the
           ramp set by wavelength bounds instead of alpha and beta, and no temperature.

vLLM 0.33 builds YaRN's ramp over the pair index between the pairs that make beta_fast and
beta_slow turns over L (floored and ceiled, `yarn_find_correction_range` in
vllm/model_executor/layers/rotary_embedding/common.py); `yarn_ramp="index"` reproduces that,
the default `"turns"` is the paper's ramp over r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

METHODS = ("rope", "pi", "ntk", "yarn", "llama3")
METHOD_NAMES = {"rope": "plain RoPE (extrapolation)", "pi": "position interpolation", "ntk": "NTK-aware",
                "yarn": "YaRN", "llama3": "Llama 3.1 (llama3)"}


class RopeError(ValueError):
    """A rule's parameters that no config could hold."""


@dataclass(frozen=True)
class Rope:
    """One rule applied to one head geometry: d, theta, trained length L and factor s."""

    method: str
    head_dim: int = 128
    theta: float = 500000.0
    original_len: int = 8192
    factor: float = 8.0
    yarn_alpha: float = 1.0  # YaRN's beta_slow: pairs with fewer turns over L are fully interpolated
    yarn_beta: float = 32.0  # YaRN's beta_fast: pairs with more turns over L are left alone
    yarn_ramp: str = "turns"  # "turns" (the paper) or "index" (vLLM 0.33's correction range)
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self):
        if self.method not in METHODS:
            raise RopeError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.head_dim < 4 or self.head_dim % 2:
            raise RopeError(f"head_dim must be an even number >= 4, got {self.head_dim}")
        if not self.theta > 1 or not math.isfinite(self.theta):
            raise RopeError(f"theta must be a finite number > 1, got {self.theta}")
        if self.original_len < 1:
            raise RopeError(f"original_len must be >= 1, got {self.original_len}")
        if not self.factor >= 1 or not math.isfinite(self.factor):
            raise RopeError(f"factor must be a finite number >= 1, got {self.factor}")
        if not 0 < self.yarn_alpha < self.yarn_beta:
            raise RopeError(f"YaRN needs 0 < alpha < beta, got {self.yarn_alpha} and {self.yarn_beta}")
        if self.yarn_ramp not in ("turns", "index"):
            raise RopeError(f"yarn_ramp must be 'turns' or 'index', got {self.yarn_ramp!r}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise RopeError("llama3 needs 0 < low_freq_factor < high_freq_factor, got "
                            f"{self.low_freq_factor} and {self.high_freq_factor}")

    @property
    def pairs(self) -> int:
        return self.head_dim // 2

    @property
    def name(self) -> str:
        return METHOD_NAMES[self.method]


def base_inv_freq(head_dim: int, theta: float) -> list[float]:
    """f_i = theta ** (-2i / d) for i = 0 .. d/2 - 1: fastest pair first."""
    return [theta ** (-2 * i / head_dim) for i in range(head_dim // 2)]


def wavelengths(freqs: list[float]) -> list[float]:
    """Tokens per full turn of each pair: 2 pi / f."""
    return [2 * math.pi / f for f in freqs]


def _ramp(x: float, lo: float, hi: float) -> float:
    return min(1.0, max(0.0, (x - lo) / (hi - lo)))


def _yarn_keep(rope: Rope, base: list[float]) -> list[float]:
    """gamma_i: 1 keeps pair i's frequency, 0 divides it by s, in between blends."""
    if rope.yarn_ramp == "turns":
        return [_ramp(rope.original_len / lam, rope.yarn_alpha, rope.yarn_beta) for lam in wavelengths(base)]
    d, log_theta = rope.head_dim, math.log(rope.theta)

    def pair_with_turns(turns: float) -> float:  # the (fractional) pair index that makes `turns` turns over L
        return d * math.log(rope.original_len / (turns * 2 * math.pi)) / (2 * log_theta)

    lo = max(math.floor(pair_with_turns(rope.yarn_beta)), 0)
    hi = min(math.ceil(pair_with_turns(rope.yarn_alpha)), d - 1)
    if lo == hi:
        hi += 0.001
    return [1.0 - _ramp(i, lo, hi) for i in range(rope.pairs)]


# --8<-- [start:inv_freq]
def inv_freq(rope: Rope) -> list[float]:
    """f'_i of the rule, fastest pair first."""
    base = base_inv_freq(rope.head_dim, rope.theta)
    s, d = rope.factor, rope.head_dim
    if rope.method == "rope":
        return base
    if rope.method == "pi":
        return [f / s for f in base]
    if rope.method == "ntk":
        return base_inv_freq(d, rope.theta * s ** (d / (d - 2)))
    if rope.method == "yarn":
        return [(1 - g) * f / s + g * f for f, g in zip(base, _yarn_keep(rope, base))]
    L = rope.original_len
    low_wavelen, high_wavelen = L / rope.low_freq_factor, L / rope.high_freq_factor
    out = []
    for f in base:
        lam = 2 * math.pi / f
        if lam < high_wavelen:
            out.append(f)
        elif lam > low_wavelen:
            out.append(f / s)
        else:
            smooth = (L / lam - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
            out.append((1 - smooth) * f / s + smooth * f)
    return out
# --8<-- [end:inv_freq]


def stretch(rope: Rope) -> list[float]:
    """f_i / f'_i per pair: 1 where the rule leaves the pair alone, s where it interpolates fully."""
    return [f / g for f, g in zip(base_inv_freq(rope.head_dim, rope.theta), inv_freq(rope))]


def logit_scale(rope: Rope) -> float:
    """What the rule multiplies every attention logit by: YaRN's (0.1 ln s + 1) ** 2, else 1."""
    if rope.method != "yarn" or rope.factor <= 1:
        return 1.0
    return (0.1 * math.log(rope.factor) + 1.0) ** 2


def score(rope: Rope, distance: float) -> float:
    """q . R(distance) k for q = k with equal weight on every pair, over |q|^2 (1 at distance 0; YaRN above 1).

    It is the mean of cos(distance * f'_i) over the pairs, times the rule's logit scale: how
    much of the match between two identical vectors survives their distance. An
    illustration of the geometry, not a trained model's attention.
    """
    freqs = inv_freq(rope)
    return logit_scale(rope) * sum(math.cos(distance * f) for f in freqs) / len(freqs)


def unseen_pairs(rope: Rope, position: float) -> int:
    """Pairs whose angle at `position` lies outside the angles training produced.

    Training over L tokens showed pair i the angles 0 .. L f_i. A pair with a wavelength of at
    most L went all the way round, so every angle was seen; a slower pair saw only part of the
    circle, and position p is new to it when p f'_i > L f_i.
    """
    base = base_inv_freq(rope.head_dim, rope.theta)
    L = rope.original_len
    return sum(1 for f, g in zip(base, inv_freq(rope))
               if 2 * math.pi / f > L and position * g > L * f * (1 + 1e-12))


def reach(rope: Rope) -> float:
    """Longest position at which no pair is outside its trained angles (inf if every pair turned fully in training)."""
    base = base_inv_freq(rope.head_dim, rope.theta)
    L = rope.original_len
    limits = [L * f / g for f, g in zip(base, inv_freq(rope)) if 2 * math.pi / f > L]
    return min(limits) if limits else math.inf


def partial_pairs(rope: Rope) -> int:
    """Pairs that never made a full turn over the trained context: the ones extrapolation breaks."""
    return sum(1 for lam in wavelengths(base_inv_freq(rope.head_dim, rope.theta)) if lam > rope.original_len)


def for_model(method: str, model, factor: float | None = None, original_len: int | None = None) -> Rope:
    """The rule on a model of labs/data/models.yaml: its head_dim and rope_theta, and its rope_scaling's
    factor, original length and llama3 frequency factors where it has them (a factor or length given wins)."""
    if model.rope_theta is None:
        raise RopeError(f"{model.name} has no rope_theta in labs/data/models.yaml")
    rs = model.rope_scaling
    kw = dict(head_dim=model.head_dim, theta=float(model.rope_theta))
    if rs is not None:
        kw.update(original_len=rs.original_max_position_embeddings, factor=rs.factor,
                  low_freq_factor=rs.low_freq_factor, high_freq_factor=rs.high_freq_factor)
    else:
        kw.update(original_len=model.max_position_embeddings)
    if factor is not None:
        kw["factor"] = factor
    if original_len is not None:
        kw["original_len"] = original_len
    return Rope(method, **kw)
