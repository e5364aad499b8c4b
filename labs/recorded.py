"""Recorded GPU results as the site reads them: load a file under labs/results/, or say it is missing.

The labs' report modules render measured numbers into pages built on machines
without a GPU. A results file that was never recorded must not break the build
or leave a blank: the page says which file is missing and the command that
records it. One helper, so every lab page words that the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "labs" / "results"


def load(path: Path) -> dict | None:
    """The recorded JSON document, or None when the file does not exist."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def missing(path: Path, command: str) -> str:
    """A Markdown admonition naming the missing file and the command that records it."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return (f"!!! warning \"Not recorded yet\"\n    `{shown}` does not exist. On a CUDA GPU, "
            f"run `{command}` and rebuild the site.")
