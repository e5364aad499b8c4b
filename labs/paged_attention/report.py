"""The paged decode kernel's recorded results as Markdown for the site (torch-free).

macros.py registers every function in `MACROS` under its own name, so pages render
the measured numbers from `labs/results/paged_attention.json` (written by
`bench.py --record` through labs/recorded.py) and never retype them. Only the
standard library and json are used: the site build has no torch.

Every macro names the GPU it shows (`gpu="H200"`: the GPU's name, or a unique
part of it): a file may hold several machines, and a page says which one it
quotes. A page that wants a table calls `paged_attention_results_table(gpu=...)`;
a lesson that quotes one number calls `paged_attention_headline("b32-l4k", gpu=...)`.
The other tables of the benchmark (`paged_attention_group_table`,
`paged_attention_ragged_table`, `paged_attention_fp8_table`) render the rows
recorded under their table name.
Both say how to record results when none are recorded. `paged_attention_row` and
`paged_attention_entry` hand a template the raw record, and raise when it is
missing, so guard them with `paged_attention_recorded(gpu)`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from labs import recorded, specs
from labs.source_constants import assigned_literals
from labs.paged_attention.bench import KERNEL_SOURCE, RESULTS_PATH, fp8_target_applies, table_rows

RECORD_COMMAND = "python -m labs.paged_attention.bench --out out/pa --record"
# The DRAM peak Nsight Compute reported on the GPU the rows were measured on (NOTES.md, "Ceilings
# measured"): the ceiling a decode that only reads can approach, above the copy's read-plus-write rate.
NCU_DRAM_PEAK_TB_S = {"NVIDIA H200": 4.81}


class ResultsError(ValueError):
    """The results file holds no entry for what a page asked."""


def load_results(path: Path | None = None) -> recorded.Results | None:
    """The recorded file (None when it does not exist); a broken file raises recorded.RecordedError."""
    return recorded.load_results(RESULTS_PATH if path is None else path)


def _results() -> recorded.Results | None:
    # Read at call time, not import time: `mkdocs serve` picks up a new recording.
    return load_results(RESULTS_PATH)


def _machine(gpu: str) -> recorded.MachineResults:
    return recorded.recorded_machine(RESULTS_PATH, gpu, what="paged attention results", command=RECORD_COMMAND,
                                     error=ResultsError, hint=", or guard the call with paged_attention_recorded(gpu)")


def _not_recorded(gpu: str) -> str:
    return (f"No paged-attention results are recorded yet (the page shows {gpu}). On a CUDA GPU, run `{RECORD_COMMAND}`: it "
            f"checks the kernel, times it and writes `{recorded.shown_path(RESULTS_PATH)}`, which this page renders.")


def _nothing_recorded() -> bool:
    """No file, or a file with no machine: the page says how to record. A file without the GPU asked for
    is an error instead (a misspelt name must not read as 'not recorded')."""
    results = _results()
    return results is None or not results.machines


def _latest_run(m: recorded.MachineResults) -> dict:
    return max(m.runs, key=lambda run: run["date"])


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


def paged_attention_recorded(gpu: str) -> bool:
    """True when the results file holds the named GPU (matched as in `paged_attention_row`), for a page's
    `{% if %}` around text that quotes it."""
    results = _results()
    try:
        return results is not None and results.has(gpu)
    except recorded.RecordedError as err:
        raise ResultsError(f"paged attention results: {err}") from None


def _env_line(name: str, e: dict, bold: bool = False) -> str:
    shown = f"**{name}**" if bold else name
    return (f"{shown} ({e['sm_count']} SMs, compute capability {e['compute_capability']}), "
            f"driver {e['driver']}, CUDA {e['cuda']}, torch {e['torch']}, Triton {e['triton']}, "
            f"measured {e['date']}")


def paged_attention_env(gpu: str) -> str:
    """The named GPU's environment, one line per run its rows come from: SMs, driver, CUDA, torch, Triton, date."""
    if _nothing_recorded():
        return _not_recorded(gpu)
    m = _machine(gpu)
    return "\n\n".join(_env_line(m.label, run) for run in m.runs)


def paged_attention_results_table(gpu: str) -> str:
    """The named GPU's environment, then one compact table row per benchmark shape, every column a click away."""
    if _nothing_recorded():
        return _not_recorded(gpu)
    m = _machine(gpu)
    rows = table_rows(m.rows, "shapes")
    intro = (_intro(m, rows) + f" Times are medians of CUDA-graph replays with the L2 cleared before each; "
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
            f"| {r['sdpa_time_us']:,.1f} | {r['ratio_to_sdpa']:.3f} | {r['run']['sdpa_backend']} |"
        )
    full = "\n".join("    " + line for line in lines)
    return (intro + "\n\n" + "\n".join(compact) + "\n\n"
            + f'??? info "Every column: shape, splits, KV read, achieved TB/s, SDPA backend ({len(rows)} rows)"\n\n'
            + full + "\n")


def _runs(rows: list[dict]) -> list[dict]:
    out: list[dict] = []
    for r in rows:
        if r["run"] not in out:
            out.append(r["run"])
    return out


def _intro(m: recorded.MachineResults, rows: list[dict]) -> str:
    """The environment of the runs behind `rows`, and the copy bandwidth each measured."""
    runs = _runs(rows)
    copies = ", ".join(f"{run['copy_tb_s']:.2f} TB/s" + (f" ({run['date']})" if len(runs) > 1 else "")
                       for run in runs)
    return ("\n\n".join(_env_line(m.label, run, bold=True) for run in runs)
            + f". Copy bandwidth measured in the same run: {copies} (device-to-device `copy_`, bytes read + written).")


def _table_or_note(gpu: str, table: str) -> tuple[recorded.MachineResults | None, list[dict], str]:
    """The machine and its rows of `table`, or a sentence saying they are not recorded."""
    if _nothing_recorded():
        return None, [], _not_recorded(gpu)
    m = _machine(gpu)
    rows = table_rows(m.rows, table)
    if not rows:
        return m, [], (f"No `{table}` rows are recorded for {m.label} yet: `{RECORD_COMMAND}` records every "
                       f"table into `{recorded.shown_path(RESULTS_PATH)}`.\n")
    return m, rows, ""


def paged_attention_group_table(gpu: str) -> str:
    """Every GQA group size on the named GPU: time against the floor and against cuDNN SDPA on the same KV."""
    m, rows, note = _table_or_note(gpu, "groups")
    if note:
        return note
    lines = [
        "| Case | (B, L, H<sub>q</sub>, H<sub>kv</sub>) | Group | Splits | Time (µs) | Floor (µs) | Of copy "
        "| SDPA (µs) | Time ÷ SDPA |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['shape']}` | ({r['batch']}, {r['context_len']}, {r['q_heads']}, {r['kv_heads']}) "
            f"| {r['group_size']} | {r['num_splits']} | {r['time_us']:,.1f} | {r['floor_us']:,.1f} "
            f"| {r['copy_fraction']:.3f} | {r['sdpa_time_us']:,.1f} | {r['ratio_to_sdpa']:.3f} |"
        )
    worst = max(rows, key=lambda r: r["ratio_to_sdpa"])
    return (_intro(m, rows) + f" {_config(rows)}. Slowest against SDPA: `{worst['shape']}`, "
            f"{worst['ratio_to_sdpa']:.3f}×.\n\n" + "\n".join(lines) + "\n")


def paged_attention_ragged_table(gpu: str) -> str:
    """Mixed-length batches on the named GPU: the KV actually read over the time, against the copy bandwidth."""
    m, rows, note = _table_or_note(gpu, "ragged")
    if note:
        return note
    lines = [
        "| Case | B | Lengths: min / median / p99 / max | Tokens | Splits per KV head (largest) | Time (µs) "
        "| Floor (µs) | Achieved (TB/s) | Of copy |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        n = r["lens"]
        lines.append(
            f"| `{r['shape']}` | {r['batch']} | {n['min']:,} / {n['median']:,} / {n['p99']:,} / {n['max']:,} "
            f"| {n['total']:,} | {r['splits_total']} ({r['splits_max']}) | {r['time_us']:,.1f} "
            f"| {r['floor_us']:,.1f} | {r['tb_s']:.2f} | {r['copy_fraction']:.3f} |"
        )
    return (_intro(m, rows) + f" {_config(rows)}; H<sub>q</sub>/H<sub>kv</sub> = "
            f"{rows[0]['q_heads']}/{rows[0]['kv_heads']}. Floor = KV bytes read / copy bandwidth.\n\n"
            + "\n".join(lines) + "\n")


def paged_attention_fp8_table(gpu: str) -> str:
    """The fp8 cache on the named GPU: time, bandwidth on the bytes read, speedup over bf16 and both errors."""
    m, rows, note = _table_or_note(gpu, "fp8")
    if note:
        return note
    both = all("triton_time_us" in r and r.get("kernel") == "cuda" for r in rows)
    triton_head, triton_rule = (" | Triton (µs) | Triton speedup", " ---: | ---: |") if both else ("", "")
    per_step = all("step_time_us" in r for r in rows)
    step_head, step_rule = ((" | Per step (µs) | bf16 per step (µs) | Speedup per step", " ---: | ---: | ---: |")
                            if per_step else ("", ""))
    lines = [
        "| Case | Same data as | Time (µs) | KV read (MiB) | Achieved (TB/s) | Of copy | bf16 (µs) | Speedup"
        f"{step_head}{triton_head} | Error vs dequantised | Error vs unquantised | bf16 error |",
        f"| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |{step_rule}{triton_rule} ---: | ---: | ---: |",
    ]
    for r in rows:
        triton = f" | {r['triton_time_us']:,.1f} | {r['triton_speedup_vs_bf16']:.2f}×" if both else ""
        step = (f" | {r['step_time_us']:,.1f} | {r['step_bf16_time_us']:,.1f} | {r['step_speedup_vs_bf16']:.2f}×"
                if per_step else "")
        lines.append(
            f"| `{r['shape']}` | `{r['of']}` | {r['time_us']:,.1f} | {r['kv_bytes'] / 2**20:,.0f} "
            f"| {r['tb_s']:.2f} | {r['copy_fraction']:.3f} | {r['bf16_time_us']:,.1f} "
            f"| {r['speedup_vs_bf16']:.2f}×{step}{triton} | {r['rel_err']:.1e} | {r['quant_rel_err']:.1e} "
            f"| {r['bf16_rel_err']:.1e} |"
        )
    timers = (" Time and Speedup are one call per CUDA graph after a flush of L2; the per-step columns time "
              f"the same call as one layer of a decode step, on {rows[0]['step_layers']} copies of its inputs "
              "in one graph, with no flush." if per_step else "")
    layouts = {r.get("v_layout", "token") for r in rows}
    order = ("V stored by dimension, (blocks, heads, head_dim, block_size), not in vLLM's order"
             if layouts == {"dim"} else "V stored like K, in vLLM's order" if layouts == {"token"}
             else "V stored in either order (see the rows)")
    if rows[0].get("kernel") == "cuda":
        config = (f"the CUDA kernel (`fp8_decode.cu`), {rows[0]['num_warps']} warps per program, splits in "
                  f"units of {rows[0]['tile_n']} tokens; Triton is the Triton fp8 kernel on the same data")
    else:
        config = f"tile {rows[0]['tile_n']} tokens, {rows[0]['num_warps']} warps, {rows[0]['num_stages']} stages"
    return (_intro(m, rows) + f" K and V stored as float8 e4m3 with one fp32 scale each ({order}), queries bf16; "
            f"{config}.{timers} "
            "Errors are ‖out − ref‖ / ‖ref‖ against fp32 attention on the dequantised cache (the kernel's "
            "own) and on the values before quantisation (what e4m3 costs).\n\n" + "\n".join(lines) + "\n")


@lru_cache(maxsize=None)
def kernel_constant(name: str) -> int:
    """An integer constant of kernel.py, read from its source: the page quotes the value the kernel
    runs with, and the site build cannot import kernel.py (it needs Triton)."""
    values = [v for v in assigned_literals(KERNEL_SOURCE, name) if isinstance(v, int)]
    if len(values) != 1:
        raise ResultsError(f"{KERNEL_SOURCE.name} has no integer constant {name}")
    return values[0]


def _slots(sm_count: int) -> int:
    """Programs of the bf16 kernel's default configuration resident at once on sm_count SMs."""
    return sm_count * kernel_constant("RESIDENT_PROGRAMS")


def paged_attention_constant(name: str) -> int:
    """An integer constant of kernel.py (SPLIT_CAP, FP8_SPLIT_CAP, ...), as the kernel runs with it."""
    return kernel_constant(name)


def paged_attention_slots(gpu: str) -> dict:
    """The bf16 kernel's program slots on a GPU of labs/data (`gpu="h200"`): its SMs x RESIDENT_PROGRAMS,
    the programs of the default configuration that fit on one SM (read from Nsight Compute on an H200)."""
    sm_count = specs.get_gpu(gpu).sm_count
    return {"sm_count": sm_count, "per_sm": kernel_constant("RESIDENT_PROGRAMS"), "slots": _slots(sm_count)}


def paged_attention_row(shape: str, gpu: str) -> dict:
    """One shape's recorded row on the named GPU (time_us, tb_s, copy_fraction, ..., and its `run`), with
    what a page says about it: `programs` (one per sequence and KV head, unsplit), `wave_fill` (those
    programs over the bf16 kernel's slots) and `of_dram_peak` (tb_s over Nsight Compute's DRAM peak,
    None where none is noted for the GPU)."""
    m = _machine(gpu)
    if not m.has(shape=shape):
        raise ResultsError(f"no row '{shape}' for {m.label}; recorded shapes: {[r['shape'] for r in m.rows]}")
    row = m.row(shape=shape)
    programs = row["batch"] * row["kv_heads"]
    peak = NCU_DRAM_PEAK_TB_S.get(m.label)
    return {**row, "programs": programs, "wave_fill": programs / _slots(row["run"]["sm_count"]),
            "of_dram_peak": row["tb_s"] / peak if peak else None}


def paged_attention_entry(gpu: str) -> dict:
    """The named GPU's latest run (driver, versions, copy_tb_s, sm_count, ...) with `gpu` its name,
    `date` the day, or days, its rows were measured, and `dram_peak_tb_s` Nsight Compute's DRAM peak
    (None where none is noted)."""
    m = _machine(gpu)
    return {**_latest_run(m), "gpu": m.label, "date": m.dates, "dram_peak_tb_s": NCU_DRAM_PEAK_TB_S.get(m.label)}


def paged_attention_headline(shape: str, gpu: str) -> str:
    """A sentence with one shape's measured time and bandwidth on the named GPU, and the date."""
    if _nothing_recorded():
        return _not_recorded(gpu)
    m = _machine(gpu)
    r = paged_attention_row(shape, gpu)
    run = r["run"]
    return (f"On an {m.label} (measured {run['date']}), at (B, L, H<sub>q</sub>, H<sub>kv</sub>) = "
            f"({r['batch']}, {r['context_len']}, {r['q_heads']}, {r['kv_heads']}) the kernel read "
            f"{r['kv_bytes'] / 2**20:,.0f} MiB of KV in {r['time_us']:,.1f} µs: {r['tb_s']:.2f} TB/s, "
            f"{r['copy_fraction']:.3f} of the {run['copy_tb_s']:.2f} TB/s copy bandwidth, and "
            f"{r['ratio_to_sdpa']:.3f}× the time of PyTorch SDPA ({run['sdpa_backend']}) on a contiguous cache.")


def paged_attention_fp8_summary(gpu: str) -> str:
    """One sentence for a page that mentions `--kv-cache-dtype fp8`: the measured speedup of the lab's
    fp8 decode kernel over its bf16 one, and the error, on the named GPU with the date."""
    if _nothing_recorded():
        return _not_recorded(gpu)
    m, rows, note = _table_or_note(gpu, "fp8")
    if note:
        return note
    big = [r for r in rows if fp8_target_applies(r)]
    speed = sorted(r["speedup_vs_bf16"] for r in big)
    step = sorted(r["step_speedup_vs_bf16"] for r in big if "step_speedup_vs_bf16" in r)
    per_step = (f" ({step[0]:.2f}–{step[-1]:.2f}× timed as one layer of a decode step)"
                if len(step) == len(big) else "")
    quant = sorted(r["quant_rel_err"] for r in rows)
    bf16 = max(r["bf16_rel_err"] for r in rows)
    return (f"Measured on an {m.label} ({m.dates}) with this site's paged decode kernel: an e4m3 cache "
            f"with per-tensor scales made decode attention "
            f"{speed[0]:.2f}–{speed[-1]:.2f}× as fast as bf16{per_step} on {len(big)} batches of 16 or more "
            f"sequences (half the bytes read), at a relative error of {quant[0]:.1%}–{quant[-1]:.1%} against fp32 "
            f"attention on the unquantised values, where the bf16 cache's was at most {bf16:.2%}.")


MACROS = [
    paged_attention_constant,
    paged_attention_slots,
    paged_attention_fp8_summary,
    paged_attention_recorded,
    paged_attention_env,
    paged_attention_results_table,
    paged_attention_group_table,
    paged_attention_ragged_table,
    paged_attention_fp8_table,
    paged_attention_row,
    paged_attention_entry,
    paged_attention_headline,
]
