"""The results files of the Part 3 labs: one JSON document per lab, one entry per GPU.

    {"schema": 1, "lab": "<lab>", "gpus": {"<GPU name>": {<environment>, "sections": {...}}}}

Recording replaces only the running GPU's entry, and only after the whole benchmark
finished: a run that fails part-way writes nothing, so a recorded result is never
replaced by a partial one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

SCHEMA = 1
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


class ResultsError(ValueError):
    """A results file is malformed, or holds no entry for what a page asked."""


def read(path: Path, lab: str) -> dict[str, dict]:
    """GPU name -> entry; {} when the file does not exist."""
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA or doc.get("lab") != lab or not isinstance(doc.get("gpus"), dict):
        raise ResultsError(f"{path.name}: expected schema {SCHEMA}, lab {lab!r} and a 'gpus' mapping")
    return doc["gpus"]


def _write_atomic(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def write(path: Path, lab: str, entry: dict) -> dict[str, dict]:
    """Write `entry` under its GPU's name into `path`, keeping the other GPUs; returns all entries."""
    for key in ("gpu", "date", "sections"):
        if key not in entry:
            raise ResultsError(f"entry for {lab} has no {key!r}: refusing to record a partial result")
    gpus = read(path, lab)
    gpus[entry["gpu"]] = entry
    _write_atomic(path, {"schema": SCHEMA, "lab": lab, "gpus": dict(sorted(gpus.items()))})
    return gpus


def select(gpus: dict[str, dict], gpu: str | None) -> dict | None:
    """The entry whose GPU name is `gpu` (exact, else a unique case-insensitive part), or the only one."""
    if not gpus:
        return None
    if gpu is None:
        if len(gpus) > 1:
            raise ResultsError(f"results for several GPUs ({sorted(gpus)}): pass gpu=...")
        return next(iter(gpus.values()))
    if gpu in gpus:
        return gpus[gpu]
    found = [e for name, e in gpus.items() if gpu.lower() in name.lower()]
    return found[0] if len(found) == 1 else None
