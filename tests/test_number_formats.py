"""labs/number_formats.py rounds like the hardware casts it explains.

The lab is numpy-only so that the site build can run it; these tests hold its
rounding to numpy's float16 and to torch's bfloat16 and float8 casts on random
values spread over each format's whole range, subnormals included.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from labs.number_formats import FORMATS, FloatFormat, IntFormat

BY_NAME = {f.name: f for f in FORMATS}
# Bit patterns and limits from the formats' definitions: IEEE 754 binary16, bfloat16,
# and the OCP 8-bit floating point specification (E4M3 without infinities, E5M2 with).
EXPECTED_MAX = {"fp16": 65504.0, "bf16": 3.3895313892515355e38, "fp8-e4m3": 448.0, "fp8-e5m2": 57344.0}
EXPECTED_STEP_AFTER_ONE = {"fp16": 2**-10, "bf16": 2**-7, "fp8-e4m3": 2**-3, "fp8-e5m2": 2**-2}
TORCH_DTYPES = {"bf16": "bfloat16", "fp8-e4m3": "float8_e4m3fn", "fp8-e5m2": "float8_e5m2"}


def _spread(fmt: FloatFormat, n: int = 20000) -> np.ndarray:
    """Random values of both signs, log-uniform from below the smallest subnormal to the largest finite."""
    rng = np.random.default_rng(0)
    low = np.log2(fmt.min_normal) - fmt.man_bits - 2
    mags = 2.0 ** rng.uniform(low, np.log2(fmt.max_value), n)
    return mags * rng.choice([-1.0, 1.0], n)


@pytest.mark.parametrize("name", list(EXPECTED_MAX))
def test_limits_follow_from_the_bit_layout(name):
    fmt = BY_NAME[name]
    assert fmt.max_value == EXPECTED_MAX[name]
    assert fmt.round(1 + EXPECTED_STEP_AFTER_ONE[name])[()] == 1 + EXPECTED_STEP_AFTER_ONE[name]
    # Halfway between 1 and the next value rounds to even, i.e. down to 1.
    assert fmt.round(1 + EXPECTED_STEP_AFTER_ONE[name] / 2)[()] == 1.0


def test_fp16_matches_numpy_float16_including_subnormals_and_overflow():
    fmt = BY_NAME["fp16"]
    x = np.concatenate([_spread(fmt), [65504.0, 65519.0, 65520.0, 1e6, -1e6, 2.0**-25, 3 * 2.0**-26]])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(fmt.round(x), expected)


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_matches_torch_casts_in_range(name):
    torch = pytest.importorskip("torch")
    fmt = BY_NAME[name]
    x = _spread(fmt)
    expected = torch.tensor(x, dtype=torch.float64).to(getattr(torch, TORCH_DTYPES[name])).to(torch.float64).numpy()
    np.testing.assert_array_equal(fmt.round(x), expected)


def test_e4m3_saturates_where_ieee_formats_overflow():
    assert BY_NAME["fp8-e4m3"].round(1000.0)[()] == 448.0
    assert BY_NAME["fp8-e5m2"].round(1e6)[()] == np.inf
    assert BY_NAME["fp16"].round(-1e6)[()] == -np.inf


def test_one_outlier_coarsens_every_integer_value():
    int8 = BY_NAME["int8"]
    assert isinstance(int8, IntFormat)
    out = int8.round([0.5, 1.0, 127.0])
    np.testing.assert_allclose(out, [0.0, 1.0, 127.0])  # scale 1: 0.5 rounds to even 0
    out = int8.round([0.5, 1.0, 12700.0])
    assert out[0] == 0.0 and out[1] == 0.0 and out[2] == 12700.0  # scale 100


def test_cli_prints_every_format_and_rejects_bad_values():
    run = [sys.executable, "-m", "labs.number_formats"]
    ok = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    for f in FORMATS:
        assert f.name in ok.stdout
    bad = subprocess.run([*run, "--values", "0", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--values" in bad.stderr
