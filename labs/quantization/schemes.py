"""Quantize-dequantize a weight or activation matrix under one scheme: format, granularity, symmetry.

A scheme's error is what the dequantized copy loses, so every function returns the
dequantized matrix (float64) rather than codes: the error lab compares it with the
original, the methods (GPTQ, AWQ) call it column by column. Matrices are (rows, K),
K the reduction dimension, as a PyTorch Linear stores its weight (out, in): per-channel
means one scale per row (output channel), group-wise one scale per g consecutive
values of a row along K, which is how GPTQ/AWQ checkpoints and Marlin lay them out.
The float formats' rounding is labs.number_formats' (one implementation of E4M3/E5M2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labs.number_formats import FORMATS, FloatFormat

FLOATS = {f.name: f for f in FORMATS if isinstance(f, FloatFormat)}
INT_BITS = {"int8": 8, "int4": 4}
GRANULARITIES = ("tensor", "channel", "group")


class SchemeError(ValueError):
    """A scheme that cannot be built (unknown format, asymmetric float, K not a multiple of g)."""


@dataclass(frozen=True)
class Scheme:
    fmt: str  # "int8", "int4", "fp8-e4m3", "fp8-e5m2"
    granularity: str = "channel"  # "tensor", "channel" or "group"
    group: int | None = None  # g for "group"
    symmetric: bool = True

    def __post_init__(self):
        if self.fmt not in INT_BITS and self.fmt not in FLOATS:
            raise SchemeError(f"format must be one of {', '.join([*INT_BITS, *FLOATS])}, got {self.fmt!r}")
        if self.granularity not in GRANULARITIES:
            raise SchemeError(f"granularity must be one of {', '.join(GRANULARITIES)}, got {self.granularity!r}")
        if (self.granularity == "group") != (self.group is not None):
            raise SchemeError("a group size goes with granularity 'group' and only with it")
        if self.group is not None and self.group < 1:
            raise SchemeError(f"group size must be positive, got {self.group}")
        if self.fmt in FLOATS and not self.symmetric:
            raise SchemeError("float formats are symmetric here (no zero point), as vLLM's fp8 scales are")

    @property
    def name(self) -> str:
        gran = f"g{self.group}" if self.granularity == "group" else f"per-{self.granularity}"
        sym = "" if self.fmt in FLOATS else ("-sym" if self.symmetric else "-asym")
        return f"{self.fmt}{sym}-{gran}"

    @property
    def bits(self) -> int:
        return INT_BITS.get(self.fmt, 8)

    def bits_per_value(self, scale_bits: int = 16) -> float:
        """Storage per value with its share of the scales (and zero points, asymmetric): 4-bit g128 = 4.125 (sym)."""
        if self.granularity != "group":
            return float(self.bits)
        extra = scale_bits + (self.bits if not self.symmetric else 0)
        return self.bits + extra / self.group


def _blocks(x: np.ndarray, scheme: Scheme) -> np.ndarray:
    rows, k = x.shape
    if scheme.granularity == "tensor":
        return x.reshape(1, rows * k)
    if scheme.granularity == "channel":
        return x.reshape(rows, k)
    if k % scheme.group:
        raise SchemeError(f"K = {k} is not a multiple of the group size {scheme.group}")
    return x.reshape(rows * (k // scheme.group), scheme.group)


def fake_quant(x, scheme: Scheme) -> np.ndarray:
    """x rounded to the scheme's grid and scaled back (float64, same shape)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise SchemeError(f"expected a 2-D matrix, got shape {x.shape}")
    b = _blocks(x, scheme)
    if scheme.fmt in FLOATS:
        fmt = FLOATS[scheme.fmt]
        amax = np.max(np.abs(b), axis=1, keepdims=True)
        scale = np.where(amax > 0, amax / fmt.max_value, 1.0)
        return (fmt.round(b / scale) * scale).reshape(x.shape)
    if scheme.symmetric:
        qmax = 2 ** (scheme.bits - 1) - 1
        amax = np.max(np.abs(b), axis=1, keepdims=True)
        scale = np.where(amax > 0, amax / qmax, 1.0)
        return (np.clip(np.round(b / scale), -qmax - 1, qmax) * scale).reshape(x.shape)
    levels = 2**scheme.bits - 1
    lo, hi = np.min(b, axis=1, keepdims=True), np.max(b, axis=1, keepdims=True)
    scale = np.where(hi > lo, (hi - lo) / levels, 1.0)
    zero = np.round(-lo / scale)
    q = np.clip(np.round(b / scale) + zero, 0, levels)
    return ((q - zero) * scale).reshape(x.shape)


def rel_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """||approx - exact||_F / ||exact||_F."""
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))
