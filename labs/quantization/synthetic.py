"""Synthetic weights and activations with the outlier structure real LLM layers have, stated as numbers.

Gaussian matrices flatter every quantizer: with no outliers, one scale per tensor
already fits the bulk, and the differences between methods vanish. Real layers are
not like that, so the activations here carry explicit outlier channels, their
parameters taken from what two papers report:

- LLM.int8() (Dettmers et al., 2022, section 4 and Figure 3): from 6.7B parameters on,
  hidden-state values of magnitude 6 or more (its outlier threshold) sit in a handful
  of feature dimensions, about 6 of the model dimension, in most layers and most
  tokens; nearly every other value is far below that.
- SmoothQuant (Xiao et al., 2023, section 3 and Figure 4): activation outliers are
  about 100x the typical magnitude and persist in fixed channels across tokens, while
  weights are flat and easy to quantize.

So `OUTLIERS` puts 6 channels of 4,096 (0.15 %) at 60x the bulk's scale (bulk std 1.0,
so values of about 60, ten times LLM.int8()'s threshold and inside SmoothQuant's 100x),
the same channels for every token. Weights get a heavy tail instead: 0.1 % of entries
at 10x the bulk's std (0.02, a typical init scale), at random positions.
The activations' bulk is also correlated across channels: a shared rank-16 component
carries half its variance (hidden states are anisotropic; i.i.d. channels would make
the Hessian X^T X diagonal, and GPTQ's error feedback would have nothing to exploit).
`gaussian=True` drops the outliers, the heavy tail and the correlation, for the
flattering comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Llama-3.1-8B's projections as (N out, K in): hidden 4096, 32 query and 8 KV heads of 128, MLP 14336.
LLAMA_8B_SHAPES = {
    "q_proj": (4096, 4096),
    "k_proj": (1024, 4096),
    "v_proj": (1024, 4096),
    "o_proj": (4096, 4096),
    "gate_proj": (14336, 4096),
    "up_proj": (14336, 4096),
    "down_proj": (4096, 14336),
}


@dataclass(frozen=True)
class Outliers:
    act_channels: int = 6  # outlier feature dimensions per 4,096 (LLM.int8(): about 6 at 6.7B)
    act_magnitude: float = 60.0  # their scale over the bulk's std (SmoothQuant: ~100x; LLM.int8() threshold 6)
    weight_fraction: float = 0.001  # weight entries in the heavy tail
    weight_magnitude: float = 10.0  # their std over the bulk's


OUTLIERS = Outliers()
WEIGHT_STD = 0.02
RANK = 16  # the shared component of the activations' bulk


def outlier_channels(k: int, spec: Outliers = OUTLIERS) -> np.ndarray:
    """Which input channels carry the activation outliers: act_channels per 4,096, the same for every token
    and every draw (a property of the layer, as the papers find, so calibration and test sets share them)."""
    count = max(1, round(spec.act_channels * k / 4096))
    return np.sort(np.random.default_rng(k).choice(k, size=count, replace=False))


def weights(n: int, k: int, seed: int = 0, gaussian: bool = False, spec: Outliers = OUTLIERS) -> np.ndarray:
    """An (n, k) weight matrix: Gaussian bulk, plus a heavy tail unless gaussian."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)) * WEIGHT_STD
    if not gaussian:
        mask = rng.random((n, k)) < spec.weight_fraction
        w[mask] *= spec.weight_magnitude
    return w


def activations(tokens: int, k: int, seed: int = 1, gaussian: bool = False, spec: Outliers = OUTLIERS) -> np.ndarray:
    """(tokens, k) inputs: unit Gaussian bulk with per-channel spread, outlier channels scaled unless gaussian."""
    # channels differ a little even without outliers; a property of the layer, like the outlier positions
    channel_scale = np.exp(np.random.default_rng(k + 1).normal(0.0, 0.3, size=k))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, k))
    if not gaussian:
        mix = np.random.default_rng(k + 2).standard_normal((RANK, k)) / np.sqrt(RANK)
        x = np.sqrt(0.5) * x + np.sqrt(0.5) * (rng.standard_normal((tokens, RANK)) @ mix)
    x = x * channel_scale
    if not gaussian:
        x[:, outlier_channels(k, spec)] *= spec.act_magnitude
    return x
