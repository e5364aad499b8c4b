"""Worked examples: the figures a lesson or an answer quotes, computed beside the cost model.

A page does no arithmetic (one source per number). When a lesson works an example through
(a 2,000-token system prompt at block size 16, a 70B model on two H100s, the KV a decode
step reads per layer), every figure it quotes comes from a function in this package, built
on labs/roofline.py (the cost model), labs/specs.py (model and GPU specs) and labs/kv_sizing,
and checked in tests/test_worked.py. Each module holds the examples of one topic and lists
them in EXAMPLES; macros.py registers each under its own name for the pages. Torch-free:
the site build imports it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator


def positive(name: str, value: float) -> None:
    """A worked example's count or size that must be above zero, named in the error."""
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def at_least(name: str, value: float, minimum: float) -> None:
    """A worked example's input with a floor other than zero (0 tokens allowed, a TPOT past another)."""
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value!r}")


def modules() -> Iterator:
    """Every topic module of the package, in name order."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        yield importlib.import_module(f"{__name__}.{info.name}")


def examples() -> Iterator[tuple[str, Callable]]:
    """(module name, function) for every function a topic module lists in EXAMPLES."""
    for module in modules():
        for fn in module.EXAMPLES:
            yield module.__name__, fn
