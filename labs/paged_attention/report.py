"""The paged decode kernel's recorded results as Markdown for the site (torch-free).

macros.py registers every function in `MACROS` under its own name, so pages render
the measured numbers from `labs/results/paged_attention.json` (written by
`bench.py --record`, schema in its docstring) and never retype them. Only the
standard library and json are used: the site build has no torch.

A page that wants a table calls `paged_attention_results_table()`; a lesson that
quotes one number calls `paged_attention_headline("b32-l4k")`. Both say how to
record results when none are recorded. `paged_attention_row` and
`paged_attention_entry` hand a template the raw record, and raise when it is
missing, so guard them with `paged_attention_recorded()`.
"""

from __future__ import annotations

import json
from pathlib import Path

from labs.paged_attention.bench import RESULTS_PATH, SCHEMA_VERSION

RECORD_COMMAND = "python -m labs.paged_attention.bench --out out/pa --record"
REPO_ROOT = Path(__file__).resolve().parents[2]


class ResultsError(ValueError):
    """The results file is malformed, or holds no entry for what a page asked."""


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def load_results(path: Path | None = None) -> dict[str, dict]:
    """GPU name -> entry; empty when the file is missing, empty, or records no GPU."""
    path = RESULTS_PATH if path is None else path
    if not path.is_file() or not path.read_text(encoding="utf-8").strip():
        return {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA_VERSION or not isinstance(doc.get("gpus"), dict):
        raise ResultsError(f"{_rel(path)}: expected schema {SCHEMA_VERSION} with a 'gpus' mapping "
                           "(labs/paged_attention/bench.py docstring)")
    return doc["gpus"]


def _results() -> dict[str, dict]:
    # Read at call time, not import time: `mkdocs serve` picks up a new recording.
    return load_results(RESULTS_PATH)


def _select(gpus: dict[str, dict], gpu: str | None) -> dict[str, dict]:
    """All entries, or the one whose name is `gpu` (exact, else a unique case-insensitive part)."""
    if gpu is None:
        return gpus
    if gpu in gpus:
        return {gpu: gpus[gpu]}
    found = {name: e for name, e in gpus.items() if gpu.lower() in name.lower()}
    if len(found) != 1:
        raise ResultsError(f"paged attention results: GPU {gpu!r} matches {sorted(found) or 'nothing'}; "
                           f"recorded GPUs: {sorted(gpus)}")
    return found


def _one(gpu: str | None) -> dict:
    gpus = _results()
    if not gpus:
        raise ResultsError(f"no paged attention results in {_rel(RESULTS_PATH)}; record them with "
                           f"`{RECORD_COMMAND}`, or guard the call with paged_attention_recorded()")
    chosen = _select(gpus, gpu)
    if len(chosen) > 1:
        raise ResultsError(f"results for several GPUs ({sorted(chosen)}): pass gpu=...")
    return next(iter(chosen.values()))


def _not_recorded() -> str:
    return (f"No paged-attention results are recorded yet. On a CUDA GPU, run `{RECORD_COMMAND}`: it "
            f"checks the kernel, times it and writes `{_rel(RESULTS_PATH)}`, which this page renders.")


def _config(rows: list[dict]) -> str:
    """The settings every row shares (dtype, head dim, block size, tile, warps, stages)."""
    keys = [("dtype", "{}"), ("head_dim", "d = {}"), ("block_size", "block size {}"),
            ("tile_n", "tile {} tokens"), ("num_warps", "{} warps"), ("num_stages", "{} stages")]
    parts = []
    for key, fmt in keys:
        values = {r[key] for r in rows}
        if len(values) == 1:
            parts.append(fmt.format(values.pop()))
    return ", ".join(parts)


# ---------------------------------------------------------------------------
# Macros
# ---------------------------------------------------------------------------


def paged_attention_recorded(gpu: str | None = None) -> bool:
    """True when the results file holds at least one GPU (or the one named)."""
    gpus = _results()
    if not gpus:
        return False
    try:
        return bool(_select(gpus, gpu))
    except ResultsError:
        return False


def _env_line(name: str, e: dict, bold: bool = False) -> str:
    shown = f"**{name}**" if bold else name
    return (f"{shown} ({e['sm_count']} SMs, compute capability {e['compute_capability']}), "
            f"driver {e['driver']}, CUDA {e['cuda']}, torch {e['torch']}, Triton {e['triton']}, "
            f"measured {e['date']}")


def paged_attention_env(gpu: str | None = None) -> str:
    """One line per recorded GPU: name, SMs, driver, CUDA, torch, Triton and the date."""
    gpus = _results()
    if not gpus:
        return _not_recorded()
    return "\n\n".join(_env_line(name, e) for name, e in _select(gpus, gpu).items())


def paged_attention_results_table(gpu: str | None = None) -> str:
    """Per recorded GPU: its environment, then one table row per benchmark shape."""
    gpus = _results()
    if not gpus:
        return _not_recorded()
    blocks = []
    for name, e in _select(gpus, gpu).items():
        rows = e["rows"]
        intro = (f"{_env_line(name, e, bold=True)}. Copy bandwidth measured in the same run: "
                 f"{e['copy_tb_s']:.2f} TB/s (device-to-device `copy_`, bytes read + written). "
                 f"Times are medians of CUDA-graph replays with the L2 cleared before each; "
                 f"{_config(rows)}; SDPA reads the same KV stored contiguously.")
        # The columns the text reads, narrow enough for a laptop; every column one click away.
        compact = [
            "| Shape | Time (µs) | Floor (µs) | Of copy | SDPA (µs) | Time ÷ SDPA |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines = [
            "| Shape | (B, L, H<sub>q</sub>, H<sub>kv</sub>) | Splits | Time (µs) | Floor (µs) | KV read (MiB) "
            "| Achieved (TB/s) | Of copy | SDPA (µs) | Time ÷ SDPA | SDPA backend |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in rows:
            compact.append(
                f"| `{r['shape']}` | {r['time_us']:,.1f} | {r['floor_us']:,.1f} | {r['copy_fraction']:.3f} "
                f"| {r['sdpa_time_us']:,.1f} | {r['ratio_to_sdpa']:.3f} |"
            )
            lines.append(
                f"| `{r['shape']}` | ({r['batch']}, {r['context_len']}, {r['q_heads']}, {r['kv_heads']}) "
                f"| {r['num_splits']} | {r['time_us']:,.1f} | {r['floor_us']:,.1f} "
                f"| {r['kv_bytes'] / 2**20:,.0f} | {r['tb_s']:.2f} | {r['copy_fraction']:.3f} "
                f"| {r['sdpa_time_us']:,.1f} | {r['ratio_to_sdpa']:.3f} | {e['sdpa_backend']} |"
            )
        full = "\n".join("    " + line for line in lines)
        blocks.append(intro + "\n\n" + "\n".join(compact) + "\n\n"
                      + f'??? info "Every column: shape, splits, KV read, achieved TB/s, SDPA backend ({len(rows)} rows)"\n\n'
                      + full)
    return "\n\n".join(blocks) + "\n"


def paged_attention_row(shape: str, gpu: str | None = None) -> dict:
    """One shape's recorded row (time_us, tb_s, copy_fraction, ...), for a template to format."""
    e = _one(gpu)
    for r in e["rows"]:
        if r["shape"] == shape:
            return r
    raise ResultsError(f"no row '{shape}' for {e['gpu']}; recorded shapes: {[r['shape'] for r in e['rows']]}")


def paged_attention_entry(gpu: str | None = None) -> dict:
    """One GPU's whole entry (gpu, date, copy_tb_s, sdpa_backend, rows, ...)."""
    return _one(gpu)


def paged_attention_headline(shape: str = "b32-l4k", gpu: str | None = None) -> str:
    """A sentence with one shape's measured time and bandwidth, the GPU and the date."""
    if not paged_attention_recorded(gpu):
        return _not_recorded()
    e = _one(gpu)
    r = paged_attention_row(shape, gpu)
    return (f"On an {e['gpu']} (measured {e['date']}), at (B, L, H<sub>q</sub>, H<sub>kv</sub>) = "
            f"({r['batch']}, {r['context_len']}, {r['q_heads']}, {r['kv_heads']}) the kernel read "
            f"{r['kv_bytes'] / 2**20:,.0f} MiB of KV in {r['time_us']:,.1f} µs: {r['tb_s']:.2f} TB/s, "
            f"{r['copy_fraction']:.3f} of the {e['copy_tb_s']:.2f} TB/s copy bandwidth, and "
            f"{r['ratio_to_sdpa']:.3f}× the time of PyTorch SDPA ({e['sdpa_backend']}) on a contiguous cache.")


MACROS = [
    paged_attention_recorded,
    paged_attention_env,
    paged_attention_results_table,
    paged_attention_row,
    paged_attention_entry,
    paged_attention_headline,
]
