"""Round values to FP16, BF16, FP8 (E4M3, E5M2), INT8 and INT4 and print what survives.

    python -m labs.number_formats
    python -m labs.number_formats --values 0.1 1.001 300 70000

Exponent bits set a float format's range, mantissa bits its precision (the gap
after 1.0 is 2**-mantissa_bits). Integer formats have one uniform step, set by a
scale: here one per-tensor scale, amax / qmax, so one outlier coarsens every
other value. Rounding is to nearest, ties to even, as hardware casts do. Past
the largest finite value, IEEE-style formats give inf; FP8 E4M3 has no inf and
saturates to +-448, the clamp vLLM's fp8 quantizers apply before casting.
numpy only: tests/test_number_formats.py checks these roundings against torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from labs import cli


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exp_bits: int
    man_bits: int
    has_inf: bool  # False: the all-ones exponent holds normal numbers (E4M3 "fn")

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def max_value(self) -> float:
        if self.has_inf:  # top exponent reserved for inf/NaN
            return (2 - 2.0 ** -self.man_bits) * 2.0 ** (2**self.exp_bits - 2 - self.bias)
        # top exponent is normal, but mantissa all-ones there is NaN
        return (2 - 2.0 ** -(self.man_bits - 1)) * 2.0 ** (2**self.exp_bits - 1 - self.bias)

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def gap_after_one(self) -> float:
        """Distance from 1.0 to the next value: the relative precision, 2**-mantissa_bits."""
        return 2.0 ** -self.man_bits

    def round(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        mag = np.abs(x)
        exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
        exp = np.maximum(exp, 1 - self.bias)  # below min_normal: subnormal spacing
        step = 2.0 ** (exp - self.man_bits)
        out = np.round(mag / step) * step  # np.round: ties to even
        over = out > self.max_value
        out = np.where(over, np.inf if self.has_inf else self.max_value, out)
        return np.copysign(out, x)


@dataclass(frozen=True)
class IntFormat:
    name: str
    bits: int

    def round(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        qmax = 2 ** (self.bits - 1) - 1
        scale = np.max(np.abs(x)) / qmax  # symmetric, one scale per tensor
        q = np.clip(np.round(x / scale), -qmax - 1, qmax)
        return q * scale


FORMATS = (
    FloatFormat("fp16", 5, 10, True),
    FloatFormat("bf16", 8, 7, True),
    FloatFormat("fp8-e4m3", 4, 3, False),
    FloatFormat("fp8-e5m2", 5, 2, True),
    IntFormat("int8", 8),
    IntFormat("int4", 4),
)
MAX_VALUES = 1000  # one table row each
DEFAULT_VALUES = (1.001, 0.1, 3.14159, 300.0, 1000.0, 70000.0)


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog="python -m labs.number_formats", description=__doc__.split("\n\n")[0])
    p.add_argument("--values", type=cli.finite_float(), nargs="+", default=DEFAULT_VALUES, metavar="X",
                   help=f"up to {MAX_VALUES} finite values to round, all treated as one tensor, not all zero "
                        "(default: %(default)s)")
    args = p.parse_args(argv)
    if len(args.values) > MAX_VALUES:
        cli.reject(p, "--values", f"at most {MAX_VALUES} values, got {len(args.values)}")
    if not any(args.values):
        cli.reject(p, "--values", "not all zero: the integer formats' scale is amax / qmax")
    values = np.array(args.values, dtype=np.float64)

    print(f"{'format':<10} {'bits s/e/m':>10} {'max':>12} {'min normal':>12} {'step after 1':>13}")
    for f in FORMATS:
        if isinstance(f, FloatFormat):
            print(f"{f.name:<10} {f'1/{f.exp_bits}/{f.man_bits}':>10} {f.max_value:>12.6g} "
                  f"{f.min_normal:>12.4g} {f.gap_after_one:>13.6g}")
        else:
            print(f"{f.name:<10} {f'{f.bits} int':>10} {'qmax*scale':>12} {'-':>12} {'scale':>13}")

    print("\n" + f"{'value':>12}" + "".join(f"{f.name:>12}" for f in FORMATS))
    rounded = [f.round(values) for f in FORMATS]
    for i, v in enumerate(values):
        print(f"{v:>12.6g}" + "".join(f"{r[i]:>12.6g}" for r in rounded))
    scale8 = np.max(np.abs(values)) / 127
    print(f"\nint8/int4 use one scale for all values (amax/qmax; int8 step {scale8:.6g}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
