"""Command lines of the Part 3 labs: a bad value exits 2 with one line naming it, no usage dump."""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; one line is enough
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def int_in(low: int, high: int):
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {value}")
        return value

    return parse


def out_dir(text: str):
    """An argparse type: a folder that exists or can be created (not a file)."""
    from pathlib import Path

    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, expected a folder")
    return path
