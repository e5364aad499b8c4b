"""Recorded lab results: the one writer every lab's `--record` uses, and the one reader pages use.

A results file under labs/results/ is the only copy of a GPU measurement, so a
write must never lose what an earlier run recorded. The rules, which every lab
gets by calling `record_rows` instead of writing JSON itself:

- Entries are keyed by machine (GPU name, GPU count, and the interconnect when
  there is more than one GPU) and, within a machine, by row key (the lab's
  scenario, shape or config fields). A run merges its rows; rows it did not
  produce stay as they are, and so do other machines.
- A failing row (`"ok": false`) never replaces a passing one unless the caller
  asks (`replace=True`, a lab's `--replace`); the returned report says what was
  added, replaced and kept, for the CLI to print.
- The file is written whole to a temporary file in the same folder and renamed
  over the old one, so an interrupted or failed write leaves the old file.
- The reader names the file and the line and column of any parse error, and
  pages select a machine explicitly (`Results.machine(gpu=...)`).

The format (`"schema": 2`)::

    {
      "schema": 2,
      "lab": "oom",
      "key": ["scenario"],                     # the row key fields, fixed per file
      "machines": {
        "NVIDIA H200": {                       # Machine.label: "2x NVIDIA H200 (NVLink)" for two GPUs
          "machine": {"gpu": "NVIDIA H200", "count": 1, "interconnect": null},
          "derived": {...},                    # optional: computed from all rows at each write
          "rows": [
            {"scenario": "kv-too-small", "ok": true,
             "run": {"date": "2026-11-29", "driver": "...", ...},   # the run that produced this row
             ...the lab's own fields...}
          ]
        }
      }
    }

Standard library only: this runs on the GPU machine (no pydantic there) and in
the site build (no torch there).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "labs" / "results"
SCHEMA = 2


class RecordedError(ValueError):
    """A results file cannot be read or written as asked; the message names the file (and position)."""


def shown_path(path: Path) -> str:
    """`path` relative to the repository when it is inside it: what messages and pages show."""
    path = Path(path)
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------
# Machines
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """What a result was measured on: the GPU name as CUDA reports it, how many, and what links them."""

    gpu: str
    count: int = 1
    interconnect: str | None = None  # "NVLink", "PCIe", ...: required when count > 1, absent otherwise

    def __post_init__(self):
        if not self.gpu or not isinstance(self.gpu, str):
            raise RecordedError(f"machine: gpu must be the GPU's name, got {self.gpu!r}")
        if not isinstance(self.count, int) or self.count < 1:
            raise RecordedError(f"machine {self.gpu!r}: count must be an integer >= 1, got {self.count!r}")
        if self.count > 1 and not self.interconnect:
            raise RecordedError(f"machine {self.count}x {self.gpu!r}: name the interconnect (NVLink, PCIe, ...)")
        if self.count == 1 and self.interconnect is not None:
            raise RecordedError(f"machine {self.gpu!r}: one GPU has no interconnect; leave it out")

    @property
    def label(self) -> str:
        """How pages name it, and its key in the file: 'NVIDIA H200', '8x NVIDIA H200 (NVLink)'."""
        return self.gpu if self.count == 1 else f"{self.count}x {self.gpu} ({self.interconnect})"

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "count": self.count, "interconnect": self.interconnect}

    @classmethod
    def from_json(cls, data: Any) -> "Machine":
        if not isinstance(data, dict) or set(data) - {"gpu", "count", "interconnect"} or "gpu" not in data:
            raise RecordedError(f"machine must be {{gpu, count, interconnect}}, got {data!r}")
        return cls(data["gpu"], data.get("count", 1), data.get("interconnect"))


def interconnect_from_topology(matrix: str, count: int) -> str:
    """'NVLink' when every pair of the first `count` GPUs in `nvidia-smi topo -m` is linked by NV#, else 'PCIe'."""
    rows = [line.split() for line in matrix.splitlines() if line.startswith("GPU")]
    cells = {row[0]: row[1:] for row in rows}
    for i in range(count):
        for j in range(count):
            if i != j and not cells.get(f"GPU{i}", [""] * count)[j].startswith("NV"):
                return "PCIe"
    return "NVLink"


def local_machine(count: int = 1) -> Machine:
    """The machine this process measures on: CUDA device 0's name, `count` GPUs, and their links.

    Imports torch (only here), so call it from lab code that already needs a GPU.
    """
    import subprocess

    import torch

    name = torch.cuda.get_device_name(0)
    if count == 1:
        return Machine(name)
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        topo = ""
    return Machine(name, count, interconnect_from_topology(topo, count) if topo else "unknown")


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


@dataclass
class MachineResults:
    """One machine's rows in one results file."""

    machine: Machine
    rows: list[dict]
    key: tuple[str, ...]
    derived: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.machine.label

    def row(self, **key: Any) -> dict:
        """The row whose key fields equal `key` (all of them, or a unique match on the ones given)."""
        found = [r for r in self.rows if all(r.get(k) == v for k, v in key.items())]
        if len(found) != 1:
            have = [_key_text(r, self.key) for r in self.rows]
            what = "no row" if not found else f"{len(found)} rows"
            raise RecordedError(f"{self.label}: {what} with {key}; recorded rows: {have}")
        return found[0]

    def has(self, **key: Any) -> bool:
        return any(all(r.get(k) == v for k, v in key.items()) for r in self.rows)

    @property
    def runs(self) -> list[dict]:
        """The distinct runs behind the rows, in the order their rows appear."""
        out: list[dict] = []
        for r in self.rows:
            if r["run"] not in out:
                out.append(r["run"])
        return out

    @property
    def dates(self) -> str:
        """'2026-11-29', or '2026-11-29 to 2026-12-01' when the rows come from several days."""
        days = sorted({run.get("date", "?") for run in self.runs})
        return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


@dataclass
class Results:
    """A results file as read: its lab, row key and machines."""

    path: Path
    lab: str
    key: tuple[str, ...]
    machines: dict[str, MachineResults]

    def machine(self, gpu: str, count: int = 1, interconnect: str | None = None) -> MachineResults:
        """The machine whose GPU name is `gpu` (exactly, else a unique case-insensitive part) and count.

        A page names what it shows: there is no default machine, and a name that
        matches none or several is an error listing the recorded machines.
        """
        found = self._matching(gpu, count, interconnect)
        if len(found) != 1:
            what = "matches no" if not found else f"matches {len(found)}"
            raise RecordedError(f"{shown_path(self.path)}: gpu={gpu!r}, count={count} {what} recorded machine; "
                                f"recorded: {sorted(self.machines)}")
        return found[0]

    def has(self, gpu: str, count: int = 1, interconnect: str | None = None) -> bool:
        """Whether the machine is recorded; a name that matches several is an error, as in `machine`."""
        found = self._matching(gpu, count, interconnect)
        if len(found) > 1:
            self.machine(gpu, count, interconnect)  # raises, naming them
        return bool(found)

    def _matching(self, gpu: str, count: int, interconnect: str | None) -> list[MachineResults]:
        same = [m for m in self.machines.values() if m.machine.count == count
                and (interconnect is None or m.machine.interconnect == interconnect)]
        exact = [m for m in same if m.machine.gpu == gpu]
        return exact or [m for m in same if gpu.lower() in m.machine.gpu.lower()]


def _key_text(row: dict, key: Iterable[str]) -> str:
    return "/".join(str(row.get(k)) for k in key)


def _parse(path: Path, text: str) -> Results:
    shown = shown_path(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordedError(f"{shown}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}); restore the file "
                            "from git or record it again") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise RecordedError(f"{shown}: expected a recorded-results file with \"schema\": {SCHEMA} "
                            f"(labs/recorded.py), found schema {found!r}")
    lab, key, machines = doc.get("lab"), doc.get("key"), doc.get("machines")
    if not isinstance(lab, str) or not isinstance(key, list) or not key or not isinstance(machines, dict):
        raise RecordedError(f"{shown}: needs 'lab' (text), 'key' (a list of row fields) and 'machines' (a mapping)")
    out: dict[str, MachineResults] = {}
    for label, entry in machines.items():
        where = f"{shown}: machine {label!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("rows"), list):
            raise RecordedError(f"{where}: needs 'machine' and a list of 'rows'")
        try:
            machine = Machine.from_json(entry.get("machine"))
        except RecordedError as err:
            raise RecordedError(f"{where}: {err}") from None
        if machine.label != label:
            raise RecordedError(f"{where}: is filed under the wrong name; its machine is {machine.label!r}")
        for i, row in enumerate(entry["rows"]):
            missing = [k for k in (*key, "ok", "run") if not isinstance(row, dict) or k not in row]
            if missing:
                raise RecordedError(f"{where}: row {i} lacks {missing}")
        out[label] = MachineResults(machine, entry["rows"], tuple(key), entry.get("derived") or {})
    return Results(Path(path), lab, tuple(key), out)


def load_results(path: Path | str) -> Results | None:
    """The recorded results in `path`, or None when the file does not exist (nothing recorded yet).

    Raises RecordedError naming the file, and the line and column for a JSON
    syntax error, when the file exists but cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        return None
    return _parse(path, path.read_text(encoding="utf-8"))


def recorded_machine(path: Path | str, gpu: str, *, what: str, command: str, error: type[Exception] = RecordedError,
                     hint: str = "", count: int = 1, interconnect: str | None = None) -> MachineResults:
    """One machine's results in `path`, or `error` naming what is missing and the command that records it.

    Every lab's page macros read their file through this, so a page built before its
    lab was recorded, or naming a GPU that never ran it, fails with the same kind of
    sentence: the file, the command, and the machines that are recorded.
    """
    results = load_results(path)
    if results is None or not results.machines:
        raise error(f"no {what} in {shown_path(Path(path))}; record them with `{command}`{hint}")
    try:
        return results.machine(gpu, count, interconnect)
    except RecordedError as err:
        raise error(f"{what}: {err}") from None


def missing(path: Path, command: str) -> str:
    """A Markdown admonition naming the missing file and the command that records it."""
    return (f"!!! warning \"Not recorded yet\"\n    `{shown_path(path)}` does not exist. On a CUDA GPU, "
            f"run `{command}` and rebuild the site.")


def check_all(folder: Path = RESULTS_DIR) -> list[Path]:
    """Read every results file in `folder` (the site build does, before any page); raise on the first bad one."""
    files = sorted(Path(folder).glob("*.json"))
    for path in files:
        load_results(path)
    return files


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


@dataclass
class RecordReport:
    """What one `record_rows` call did, row key by row key; `str()` is what a lab's CLI prints."""

    path: Path
    machine: Machine
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # passing rows a failing one did not replace

    def __str__(self) -> str:
        lines = [f"recorded {len(self.added) + len(self.replaced)} row(s) for {self.machine.label} "
                 f"in {shown_path(self.path)}"]
        if self.added:
            lines.append(f"  added: {', '.join(self.added)}")
        if self.replaced:
            lines.append(f"  replaced: {', '.join(self.replaced)}")
        if self.kept:
            lines.append(f"  kept the passing row(s) {', '.join(self.kept)}: this run failed them "
                         "(pass --replace to record the failure instead)")
        return "\n".join(lines)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename.

    A reader, or a crash, sees the old file or the new one, never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_rows(path: Path | str, lab: str, machine: Machine, rows: list[dict], key_fields: Iterable[str],
                run: dict, *, replace: bool = False,
                derive: Callable[[list[dict]], dict] | None = None) -> RecordReport:
    """Merge one run's rows for one machine into the results file at `path`, atomically.

    Each row is a JSON-ready dict holding the `key_fields` and `"ok": bool`;
    `run` (at least {"date": "YYYY-MM-DD"}, plus driver, versions and whatever
    else the run shares) is stored on each row as `"run"`. A row replaces the
    recorded row with the same key unless that one passed and this one failed
    (then it is kept, and reported, unless `replace`). Rows of other keys and
    other machines are left alone. `derive(rows)` computes fields stored on the
    machine entry from all of its rows after the merge (a printed table, say).
    """
    path, key = Path(path), tuple(key_fields)
    if not key:
        raise RecordedError("record_rows: give at least one key field")
    if not isinstance(run, dict) or not isinstance(run.get("date"), str):
        raise RecordedError("record_rows: run must be a dict with a 'date' (YYYY-MM-DD)")
    seen: set[tuple] = set()
    for i, row in enumerate(rows):
        absent = [k for k in key if k not in row]
        if absent:
            raise RecordedError(f"record_rows: row {i} lacks its key field(s) {absent}")
        if not isinstance(row.get("ok"), bool):
            raise RecordedError(f"record_rows: row {_key_text(row, key)} needs \"ok\": true or false")
        k = tuple(row[f] for f in key)
        if k in seen:
            raise RecordedError(f"record_rows: two rows with the key {_key_text(row, key)}")
        seen.add(k)

    old = load_results(path)
    if old is not None and (old.lab != lab or old.key != key):
        raise RecordedError(f"{shown_path(path)} holds lab {old.lab!r} keyed by {list(old.key)}; "
                            f"this run is lab {lab!r} keyed by {key}")
    machines = {label: {"machine": m.machine.to_json(), **({"derived": m.derived} if m.derived else {}),
                        "rows": list(m.rows)}
                for label, m in (old.machines.items() if old else [])}
    entry = machines.setdefault(machine.label, {"machine": machine.to_json(), "rows": []})
    merged: list[dict] = entry["rows"]
    report = RecordReport(path, machine)
    for row in rows:
        new = {**row, "run": run}
        name = _key_text(row, key)
        at = next((i for i, r in enumerate(merged) if tuple(r.get(f) for f in key) == tuple(row[f] for f in key)),
                  None)
        if at is None:
            merged.append(new)
            report.added.append(name)
        elif merged[at]["ok"] and not row["ok"] and not replace:
            report.kept.append(name)
        else:
            merged[at] = new
            report.replaced.append(name)
    if derive is not None:
        entry["derived"] = derive(merged)
    entry = {"machine": entry["machine"], **({"derived": entry["derived"]} if entry.get("derived") else {}),
             "rows": merged}
    machines[machine.label] = entry
    doc = {"schema": SCHEMA, "lab": lab, "key": list(key), "machines": dict(sorted(machines.items()))}
    try:
        text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:
        raise RecordedError(f"{shown_path(path)}: this run's rows are not JSON ({err}); the file is unchanged") from None
    write_atomic(path, text)
    return report
