"""Round-to-nearest, GPTQ, AWQ and SmoothQuant for one linear layer, in numpy.

All four minimise the same thing differently: the layer's output error
||X W^T - X W_hat^T|| on a calibration set X, not the weight error.
- RTN rounds every weight independently (schemes.fake_quant).
- GPTQ (Frantar et al., 2023, Algorithm 1) quantizes W one input column at a time and
  moves each column's rounding error onto the columns not yet quantized, weighted by
  the inverse Hessian H = 2 X^T X of the layer's squared error. As in the paper it
  works on the upper Cholesky factor of H^-1 (numerically stable, no re-inversion),
  dampens H by 1 % of its mean diagonal, and applies updates lazily: within a block
  of 128 columns directly, to the columns after the block in one matrix product.
  Group scales are fixed when the column loop reaches a group's first column, from
  the already-updated weights, as the reference implementation does.
- AWQ (Lin et al., 2024, section 3) keeps plain rounding but first scales each input
  channel by s_j = mean|X_j|^alpha (folded back by dividing the activations, which a
  real model folds into the previous layer), searching alpha on a grid for the lowest
  output error: channels that meet large activations get a finer effective grid.
- SmoothQuant (Xiao et al., 2023, eq. 4) divides activations by
  s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and multiplies weights by it, moving
  the outlier difficulty from activations (quantized per tensor, W8A8) to weights.
"""

from __future__ import annotations

import numpy as np

from labs.quantization.schemes import Scheme, fake_quant, rel_error


def output_error(x: np.ndarray, w: np.ndarray, w_hat: np.ndarray) -> float:
    """Relative error of the layer's output on x: ||x w_hat^T - x w^T|| / ||x w^T||."""
    return rel_error(x @ w_hat.T, x @ w.T)


def rtn(w: np.ndarray, scheme: Scheme) -> np.ndarray:
    return fake_quant(w, scheme)


def _grid(block: np.ndarray, scheme: Scheme) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(scale, zero, qmin, qmax) per row of `block` for an integer scheme."""
    if scheme.symmetric:
        qmax = 2 ** (scheme.bits - 1) - 1
        amax = np.max(np.abs(block), axis=1)
        return np.where(amax > 0, amax / qmax, 1.0), np.zeros(len(block)), -qmax - 1, qmax
    levels = 2**scheme.bits - 1
    lo, hi = np.min(block, axis=1), np.max(block, axis=1)
    scale = np.where(hi > lo, (hi - lo) / levels, 1.0)
    return scale, np.round(-lo / scale), 0, levels


def _round_column(col, scale, zero, qmin, qmax):
    return (np.clip(np.round(col / scale) + zero, qmin, qmax) - zero) * scale


def gptq(w: np.ndarray, x: np.ndarray, scheme: Scheme, block: int = 128, damp: float = 0.01) -> np.ndarray:
    """GPTQ's quantized copy of w (n, k) for calibration inputs x (tokens, k); integer formats only."""
    if scheme.fmt not in ("int8", "int4"):
        raise ValueError("GPTQ here quantizes to integer grids (int8, int4)")
    w = np.array(w, dtype=np.float64)
    n, k = w.shape
    x32 = np.asarray(x, dtype=np.float32)
    h = 2.0 * (x32.T @ x32).astype(np.float64)  # the product in fp32 (as the paper's GPU code), the rest in fp64
    dead = np.diag(h) == 0  # inputs that are always zero: their weights do not matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h[np.diag_indices(k)] += damp * np.mean(np.diag(h))
    # Upper Cholesky factor of H^-1: row i holds what column i's error does to columns after it.
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T
    q = np.zeros_like(w)
    group = scheme.group if scheme.granularity == "group" else k
    if scheme.granularity == "tensor":
        raise ValueError("GPTQ here uses per-channel or group-wise scales")
    grid = None
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        errs = np.zeros((n, b1 - b0))
        for i in range(b0, b1):
            if i % group == 0:
                grid = _grid(w[:, i:i + group], scheme)
            col = w[:, i]
            q[:, i] = _round_column(col, *grid)
            err = (col - q[:, i]) / hinv[i, i]
            w[:, i + 1:b1] -= np.outer(err, hinv[i, i + 1:b1])
            errs[:, i - b0] = err
        w[:, b1:] -= errs @ hinv[b0:b1, b1:]  # the lazy batch update
    return q


AWQ_ALPHAS = tuple(i / 20 for i in range(21))
AWQ_SEARCH_TOKENS = 2048


def awq(w: np.ndarray, x: np.ndarray, scheme: Scheme, alphas=AWQ_ALPHAS) -> tuple[np.ndarray, float]:
    """AWQ's effective weights Q(W diag(s)) diag(s)^-1 at the best alpha, and that alpha."""
    mean_abs = np.mean(np.abs(x), axis=0)
    mean_abs = np.where(mean_abs > 0, mean_abs, 1e-8)
    x = x[:AWQ_SEARCH_TOKENS]  # the search needs far fewer tokens than the statistics
    y = x @ w.T
    best = None
    for alpha in alphas:
        s = mean_abs**alpha
        s = s / np.sqrt(s.max() * s.min())  # centre the scales so neither end leaves the grid's range
        w_hat = fake_quant(w * s, scheme) / s
        err = rel_error(x @ w_hat.T, y)
        if best is None or err < best[0]:
            best = (err, alpha, w_hat)
    return best[2], best[1]


def smooth_scales(x: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's per-input-channel s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)."""
    ax = np.maximum(np.max(np.abs(x), axis=0), 1e-8)
    aw = np.maximum(np.max(np.abs(w), axis=0), 1e-8)
    return ax**alpha / aw ** (1 - alpha)


def w8a8_output_error(x: np.ndarray, w: np.ndarray, act: Scheme, weight: Scheme, alpha: float | None = None) -> float:
    """Output error of a W8A8 layer: activations and weights both fake-quantized, optionally smoothed first."""
    if alpha is not None:
        s = smooth_scales(x, w, alpha)
        x_s, w_s = x / s, w * s
    else:
        x_s, w_s = x, w
    y_hat = fake_quant(x_s, act) @ fake_quant(w_s, weight).T
    return rel_error(y_hat, x @ w.T)
