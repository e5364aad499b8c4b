"""Argument checks shared by every `python -m labs.…` command line.

A lab run can take minutes on a GPU that the team shares, so a bad argument must
be refused before anything starts: before torch is imported, before CUDA is
probed, before a result file is touched. Each helper here is an argparse
``type=``: it turns the text into a value or raises ``ArgumentTypeError`` with a
message that says what is allowed. argparse then prefixes the option's name, so
the user reads one line such as

    python -m labs.kv_sizing: error: argument --block-size: expected a whole number >= 1, got '0'

and the process exits 2. ``Parser`` is an ``ArgumentParser`` whose errors are
that one line (the usage block is one ``--help`` away), and which reads
``-1e-9`` or ``-inf`` as a value, not as an unknown flag.

Checks that need two arguments at once (a context length against the chosen
model's maximum) cannot be a ``type=``; they call ``reject(parser, "--x", why)``
after parsing, which prints the same one line.

Standard library only: the GPU machine runs these CLIs without the site stack.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

# argparse's own pattern misses exponents and inf/nan, so `--values -1e-9` was
# read as an unknown option. The labs define no option that starts with a digit,
# a dot or "inf"/"nan", so widening the pattern cannot shadow one.
_NEGATIVE_NUMBER = re.compile(r"^-(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][-+]?\d+)?$|^-(?:inf|infinity|nan)$",
                              re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """ArgumentParser with one-line errors and negative numbers (``-1e-9``, ``-inf``) read as values.

    Sub-command parsers made with ``add_subparsers`` are of the same class, so
    they behave the same way.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (--help lists the options)\n")


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def reject(parser: argparse.ArgumentParser, option: str, why: str) -> NoReturn:
    """Refuse a value that only a check across arguments can see, in argparse's own words."""
    parser.error(f"argument {option}: {why}")


def _show(text: str, limit: int = 60) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit] + "…")


# ---------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------


def bounded_int(lo: int | None = None, hi: int | None = None, unit: str = "", *,
                multiple_of: int | None = None) -> Callable[[str], int]:
    """A whole number in [lo, hi] (and a multiple of `multiple_of`, if given).

    Give an upper bound to anything that sets how long a run takes.
    """
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty range [{lo}, {hi}]")
    if lo is not None and hi is not None:
        allowed = f"a whole number from {lo:,} to {hi:,}"
    elif lo is not None:
        allowed = f"a whole number >= {lo:,}"
    elif hi is not None:
        allowed = f"a whole number <= {hi:,}"
    else:
        allowed = "a whole number"
    if multiple_of:
        allowed = allowed.replace("a whole number", f"a multiple of {multiple_of}", 1)
    if unit:
        allowed += f" ({unit})"

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {_show(text)}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi) or (
                multiple_of and value % multiple_of):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {_show(text)}")
        return value

    parse.kind, parse.bounds = "int", (lo, hi)  # type: ignore[attr-defined]  (read by tests/test_cli_harness.py)
    return parse


positive_int = bounded_int(1)
positive_int.__doc__ = "A whole number >= 1 (no upper bound: use ``count`` when the size sets the run time)."
non_negative_int = bounded_int(0)
non_negative_int.__doc__ = "A whole number >= 0."


def count(hi: int, unit: str = "") -> Callable[[str], int]:
    """How many of something to run, 1..hi: the bound keeps a run from being unbounded."""
    return bounded_int(1, hi, unit)


def power_of_two(lo: int = 1, hi: int | None = None) -> Callable[[str], int]:
    """A power of two in [lo, hi]: tile sizes and warp counts, which Triton requires to be powers of two."""
    allowed = f"a power of 2 from {lo} to {hi}" if hi is not None else f"a power of 2 >= {lo}"
    whole = bounded_int(lo, hi)

    def parse(text: str) -> int:
        try:
            value = whole(text)
        except argparse.ArgumentTypeError:
            value = 0
        if value < 1 or value & (value - 1):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {_show(text)}")
        return value

    parse.kind, parse.bounds = "int", (lo, hi)  # type: ignore[attr-defined]
    return parse


def finite_float(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                 hi_open: bool = False, unit: str = "") -> Callable[[str], float]:
    """A finite number (never NaN or inf) in the interval given; open ends exclude the bound."""
    left = "(" if lo_open else "["
    right = ")" if hi_open else "]"
    if lo is not None and hi is not None:
        allowed = f"a finite number in {left}{lo:g}, {hi:g}{right}"
    elif lo is not None:
        allowed = f"a finite number {'>' if lo_open else '>='} {lo:g}"
    elif hi is not None:
        allowed = f"a finite number {'<' if hi_open else '<='} {hi:g}"
    else:
        allowed = "a finite number"
    if unit:
        allowed += f" ({unit})"

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {_show(text)}") from None
        bad = not math.isfinite(value)
        if lo is not None:
            bad = bad or value < lo or (lo_open and value == lo)
        if hi is not None:
            bad = bad or value > hi or (hi_open and value == hi)
        if bad:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {_show(text)}")
        return value

    parse.kind, parse.bounds, parse.open_ends = "float", (lo, hi), (lo_open, hi_open)  # type: ignore[attr-defined]
    return parse


fraction = finite_float(0.0, 1.0, lo_open=True)
fraction.__doc__ = "A share in (0, 1]: a GPU memory utilization, a fraction of requests."


def number_list(item: Callable[[str], float], max_items: int = 64) -> Callable[[str], tuple]:
    """Comma-separated values, each checked by `item` (a ``bounded_int`` or ``finite_float``), 1..max_items of them.

    The cap keeps a sweep over the list bounded.
    """

    def parse(text: str) -> tuple:
        parts = [part.strip() for part in str(text).split(",")]
        if not text or any(not part for part in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {_show(text)}")
        if len(parts) > max_items:
            raise argparse.ArgumentTypeError(f"expected at most {max_items} values, got {len(parts)}")
        out = []
        for part in parts:
            try:
                out.append(item(part))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"in {_show(text)}: {exc}") from None
        return tuple(out)

    parse.kind, parse.item, parse.max_items = f"{item.kind}-list", item, max_items  # type: ignore[attr-defined]
    return parse


def choice(options: Iterable[str], what: str = "value") -> Callable[[str], str]:
    """One of a fixed list of names, for lists too long for argparse's ``choices`` message to stay readable."""
    names = tuple(options)
    shown = ", ".join(names)

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"unknown {what} {_show(text)}; expected one of: {shown}")
        return text

    parse.kind, parse.choices = "choice", names  # type: ignore[attr-defined]
    return parse


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------


def existing_file(text: str) -> Path:
    """A file that exists and can be read."""
    path = Path(text)
    if not str(text).strip():
        raise argparse.ArgumentTypeError("expected the path of an existing file, got an empty string")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable")
    return path


def existing_dir(text: str) -> Path:
    """A folder that exists."""
    path = Path(text)
    if not str(text).strip():
        raise argparse.ArgumentTypeError("expected the path of an existing folder, got an empty string")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return path


def output_dir(text: str) -> Path:
    """A folder results can be written to: an existing writable folder, or one that can be created.

    Writability is tried, not guessed from permission bits (root passes every
    ``os.access`` check, yet cannot write to /proc or a read-only mount): a
    temporary folder is made and removed in the folder, or in its nearest
    existing parent. Nothing is left behind.
    """
    if not str(text).strip():
        raise argparse.ArgumentTypeError("expected a folder to write to, got an empty string")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: cannot write there: {probe} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=probe))
    except OSError as exc:
        where = "" if probe == path else f" (nothing can be created in {probe})"
        raise argparse.ArgumentTypeError(f"{text}: cannot write there{where}: {exc.strerror or exc}") from None
    return path


def output_file(text: str) -> Path:
    """A file that can be written: not a folder, in a folder that exists or can be made."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("expected a file to write to, got an empty string")
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    try:
        output_dir(str(path.parent))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text}: its folder is not usable: {exc}") from None
    return path


for _fn, _kind in ((existing_file, "file"), (existing_dir, "folder"), (output_dir, "output-folder"),
                   (output_file, "output-file")):
    _fn.kind = _kind  # type: ignore[attr-defined]


def fail(message: str) -> int:
    """Print one ``error:`` line for bad input found after parsing (a model that does not fit) and give 2."""
    print(f"error: {_one_line(message)}", file=sys.stderr)
    return 2
