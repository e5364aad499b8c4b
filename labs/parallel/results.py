"""The parallel lab's recorded results: keyed by machine and row, merged, written atomically.

A file under labs/results/ holds one entry per machine (GPU name, GPU count,
interconnect) and, inside it, one row per key (a shape, a collective and
size). A run merges its rows in: rows it did not produce stay, and a failing
row never replaces a passing one. The write goes to a temporary file in the
same folder and is renamed over the old one, so an interrupted run leaves
the previous file whole. Standard library only: the GPU machine runs this.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


class ResultsError(ValueError):
    """A results file that cannot be read; the message names it and the position."""


def load(name: str, folder: Path = RESULTS_DIR) -> dict | None:
    path = folder / name
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def _same(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("gpu", "gpu_count", "interconnect"))


def select(doc: dict | None, gpu: str, gpu_count: int) -> dict | None:
    """The entry of the machine whose GPU name contains `gpu` (case-insensitive) with `gpu_count` GPUs."""
    for m in (doc or {}).get("machines", []):
        if gpu.lower() in m["gpu"].lower() and m["gpu_count"] == gpu_count:
            return m
    return None


def record(name: str, machine: dict, rows: list[dict], extra: dict | None = None,
           folder: Path = RESULTS_DIR, replace: bool = False) -> str:
    """Merge `rows` (each with a 'key') into `name` under `machine`; return what was written and kept."""
    doc = load(name, folder) or {"machines": []}
    entry = next((m for m in doc["machines"] if _same(m, machine)), None)
    if entry is None:
        entry = {**machine, "rows": {}}
        doc["machines"].append(entry)
    entry["date"] = datetime.date.today().isoformat()
    if extra:
        entry["versions"] = extra
    written, kept = 0, []
    for row in rows:
        key = row["key"]
        old = entry["rows"].get(key)
        if old is not None and old.get("ok", True) and not row.get("ok", True) and not replace:
            kept.append(key)
            continue
        entry["rows"][key] = {k: v for k, v in row.items() if k != "key"}
        written += 1
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    msg = f"recorded {written} rows for {machine['gpu']} x{machine['gpu_count']} in labs/results/{name}"
    if kept:
        msg += f"; kept {len(kept)} passing rows this run failed: {', '.join(kept)} (--replace overrides)"
    return msg
