"""The Part 3 labs' results files, through the project's one record writer (labs/recorded.py).

A lab's benchmark produces sections of rows ({"divergence": [...], "occupancy": [...]}).
Here they become recorded rows keyed by (experiment, config), each carrying the run it
came from (date, driver, versions, the copy bandwidth of that run); the tables the
benchmark printed are stored as the machine's derived "printed" text. Reading turns a
machine's rows back into sections for the page macros. Recording happens only after
every experiment finished, so a failed run changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from labs import recorded

RESULTS_DIR = recorded.RESULTS_DIR
KEY = ("experiment", "config")
_OWN = {"config", "ok", "run"}  # "experiment" stays: some rows carry it themselves


class ResultsError(ValueError):
    """A page asked for a GPU, section or row the results file does not hold."""


def to_rows(sections: dict[str, list[dict]], config_name: Callable[[str, dict], str]) -> list[dict]:
    """Recorded rows: each section's rows with their experiment, config name and "ok"."""
    return [{"experiment": name, "config": config_name(name, r), "ok": True, **r}
            for name, rows in sections.items() for r in rows]


def sections_of(rows: list[dict]) -> dict[str, list[dict]]:
    """Recorded rows grouped back by experiment, in recorded order, without the recorder's config, ok and run."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["experiment"], []).append({k: v for k, v in r.items() if k not in _OWN})
    return out


def record(path: Path, lab: str, env: dict, extra_run: dict, sections: dict[str, list[dict]],
           config_name: Callable[[str, dict], str],
           printed: Callable[[dict], dict[str, str]]) -> recorded.RecordReport:
    """Merge one finished run into `path`: its rows replace the same (experiment, config) rows of this GPU."""
    if not sections or not all(sections.values()):
        raise recorded.RecordedError(f"{lab}: an empty section; refusing to record a partial run")
    run = {k: v for k, v in env.items() if k != "gpu"} | extra_run
    return recorded.record_rows(path, lab, recorded.Machine(env["gpu"]), to_rows(sections, config_name), KEY, run,
                                derive=lambda rows: {"printed": printed(sections_of(rows))})


def entry(path: Path, gpu: str) -> dict | None:
    """One GPU's results as the pages use them, or None when nothing is recorded for it.

    {"gpu", the latest run's fields ("driver", "torch", "copy_gb_s", ...), "date" (a date
    or a range when rows come from several runs), "sections", "printed"}.
    """
    if not gpu:
        raise ResultsError("name the GPU whose results the page shows (gpu=\"H200\")")
    res = recorded.load_results(path)
    if res is None or not res.has(gpu):
        return None
    m = res.machine(gpu)
    latest = max(m.runs, key=lambda run: run.get("date", ""))
    return {"gpu": m.label, **latest, "date": m.dates, "sections": sections_of(m.rows),
            "printed": m.derived.get("printed", {})}
