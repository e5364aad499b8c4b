"""Markdown for the Part 3 lab pages from their recorded results (torch-free).

Each lab's report.py names its columns and exposes macros through a `LabResults`; this
module does the reading, the choice of GPU and the "not recorded yet" message, so the
three labs say it the same way. A page asks for a table by section; a lesson quotes one
row's field after checking `recorded()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labs import recorded
from labs.gpu_harness import results


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    fmt: str = "{}"  # str.format spec applied to the value; None renders as an em dash


class LabResults:
    def __init__(self, lab: str, path: Path, command: str, columns: dict[str, list[Column]]):
        self.lab, self.path, self.command, self.columns = lab, path, command, columns

    def recorded(self, gpu: str) -> bool:
        return results.entry(self.path, gpu) is not None  # read at call time: `mkdocs serve` sees a new run

    def entry(self, gpu: str) -> dict:
        e = results.entry(self.path, gpu)
        if e is None:
            raise results.ResultsError(f"no {self.lab} results for GPU {gpu!r} in {self.path.name}; record them "
                                       f"with `{self.command}`, or guard the call with the lab's recorded() macro")
        return e

    def missing(self) -> str:
        return recorded.missing(self.path, self.command)

    def env_line(self, gpu: str) -> str:
        if not self.recorded(gpu):
            return self.missing()
        e = self.entry(gpu)
        # Labs that time against the copy bandwidth record it; a lab that does not (the GEMM speed lab) says nothing of it.
        copy = (f"copy bandwidth in the same run {e['copy_gb_s']:,.0f} GB/s (read + written); "
                if e.get("copy_gb_s") else "")
        return (f"Measured on an {e['gpu']} ({e['sm_count']} SMs, compute capability {e['compute_capability']}) "
                f"on {e['date']}: driver {e['driver']}, CUDA {e['cuda']}, torch {e['torch']}, Triton {e['triton']}; "
                f"{copy}medians of {e['reps']} calls, L2 flushed before each.")

    def rows(self, section: str, gpu: str) -> list[dict]:
        e = self.entry(gpu)
        if section not in e["sections"]:
            raise results.ResultsError(f"{self.lab}: no section {section!r}; recorded: {sorted(e['sections'])}")
        return e["sections"][section]

    def row(self, section: str, key: str, value, gpu: str) -> dict:
        for r in self.rows(section, gpu):
            if r.get(key) == value:
                return r
        raise results.ResultsError(f"{self.lab}: no row with {key} = {value!r} in section {section!r}")

    def table(self, section: str, gpu: str, where: dict | None = None) -> str:
        """The section's rows as a Markdown table, under the line saying where and when they were measured."""
        if not self.recorded(gpu):
            return self.missing()
        cols = self.columns[section]
        rows = [r for r in self.rows(section, gpu) if all(r.get(k) == v for k, v in (where or {}).items())]
        lines = ["| " + " | ".join(c.header for c in cols) + " |",
                 "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(cols))) + " |"]
        for r in rows:
            lines.append("| " + " | ".join("—" if r.get(c.key) is None else c.fmt.format(r[c.key]) for c in cols) + " |")
        return self.env_line(gpu) + "\n\n" + "\n".join(lines) + "\n"
