"""The engine benchmark's recorded rows as Markdown for the site (torch-free).

macros.py registers every function in `MACROS`. Pages render `labs/results/engine.json`
(written by `python -m labs.engine.bench --record` through labs/recorded.py) and never
retype a measured number:

* `engine_env(gpu)`: the GPU, date, versions, and the copy bandwidth and GEMM rate measured
  at the start of that run (every floor on the page uses those two rates);
* `engine_table(section, gpu)`: one section's rows as a table, floors and efficiency beside
  the measurements;
* `engine_value(name, field, gpu)`: one recorded number, for prose;
* `engine_ratio(name, field, over, gpu)`: measured / model for one row, as "1.7x"; `over` is
  another field of the same row (a floor or a simulator prediction);
* `engine_decode(context, batch, gpu)`: one decode row by its shape, with the cost model's floor
  at the datasheet rates (the one lessons derive) beside it, both gaps, and the growth over B = 1;
  `batch="largest"` picks the largest batch measured at that context (the ladder's top depends
  on the pool of the run that recorded it);
* `engine_sim_error(name, field, gpu)`: how far the simulator's prediction of `field` (its
  `sim_<field>`) was from the measurement, as "+170%" or "-12%";
* `engine_over(name, other, field, gpu)`: one row's field over another's, as "10.2x" (the engine
  against Hugging Face on the same trace);
* `engine_has(name, gpu)`: whether a row is recorded, for a page's `{% if %}`;
* `engine_measured(gpu)`: "NVIDIA H200, 2026-12-01", for a lesson's prose;
* `engine_recorded(gpu)`: for a page's `{% if %}`.

Every macro names the GPU (a unique part of its name): the file may hold several machines.
"""

from __future__ import annotations

from labs import recorded
from labs.recorded import RESULTS_DIR

RESULTS_PATH = RESULTS_DIR / "engine.json"
RECORD_COMMAND = "python -m labs.engine.bench --out out/engine --record"


class ResultsError(ValueError):
    """The results file holds no entry for what a page asked."""


# (field, column heading, format) per section: what the table shows, in order.
COLUMNS = {
    "stages": [("batch", "B", "{}"), ("fused", "fused ops", "{}"), ("step_ms", "step ms", "{:.2f}"),
               ("execute_ms", "runner ms", "{:.2f}"), ("replay_ms", "graph replay ms", "{:.2f}"),
               ("linears_ms", "linears alone ms", "{:.2f}"), ("sample_ms", "sampler ms", "{:.2f}"),
               ("kernels_per_step", "kernels / eager step", "{}"), ("floor_ms", "floor ms", "{:.2f}"),
               ("efficiency", "floor / step", "{:.0%}")],
    "decode": [("context", "L", "{:,}"), ("batch", "B", "{:,}"), ("cuda_graphs", "CUDA graphs", "{}"),
               ("step_ms", "step ms", "{:.2f}"), ("floor_ms", "floor ms", "{:.2f}"),
               ("efficiency", "floor / step", "{:.0%}"), ("tok_s", "tok/s", "{:,.0f}")],
    "offline": [("concurrency", "concurrency", "{}"), ("max_num_batched_tokens", "token budget", "{:,}"),
                ("requests", "requests", "{}"),
                ("output_tok_s", "output tok/s", "{:,.0f}"), ("bound_tok_s", "cost-model bound tok/s", "{:,.0f}"),
                ("efficiency", "of bound", "{:.0%}"), ("decode_steps", "decode-only steps", "{}"),
                ("decode_steps_s", "their s", "{:.2f}"), ("mixed_steps", "steps with prefill", "{}"),
                ("mixed_steps_s", "their s", "{:.2f}"), ("decode_step_ms_mean", "decode step ms", "{:.2f}"),
                ("sim_output_tok_s", "simulator tok/s", "{:,.0f}"),
                ("sim_decode_step_ms_mean", "simulator decode step ms", "{:.2f}"),
                ("sim_error", "simulator error", "{:+.0%}")],
    "hf": [("concurrency", "concurrency", "{}"), ("output_tok_s", "output tok/s", "{:,.0f}"),
           ("bound_tok_s", "bound tok/s", "{:,.0f}"), ("efficiency", "of bound", "{:.0%}")],
    # engine / HF is not a column: a row records it only when both ran in one process, so the page
    # gives the ratio of the two recorded rows in a sentence (engine_over) instead.
    "batching": [("policy", "policy", "{}"), ("output_tok_s", "output tok/s", "{:,.0f}"),
                 ("ttft_p50_ms", "TTFT p50 ms", "{:,.0f}"), ("ttft_p99_ms", "TTFT p99 ms", "{:,.0f}"),
                 ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"), ("tpot_p99_ms", "TPOT p99 ms", "{:.1f}"),
                 ("e2e_p99_s", "E2E p99 s", "{:.2f}"), ("sim_output_tok_s", "simulator tok/s", "{:,.0f}"),
                 ("sim_ttft_p99_ms", "simulator TTFT p99 ms", "{:,.0f}")],
    "chunked": [("max_num_batched_tokens", "max_num_batched_tokens", "{:,}"),
                ("worst_gap_ms", "worst decode gap ms", "{:,.0f}"), ("floor_worst_gap_ms", "floor ms", "{:,.0f}"),
                ("ttft_ms", "16K TTFT ms", "{:,.0f}"), ("floor_ttft_ms", "floor ms", "{:,.0f}"),
                ("efficiency", "floor / TTFT", "{:.0%}")],
    "prefix": [("system_tokens", "system prompt", "{:,}"), ("cached_tokens", "cached tokens", "{:,}"),
               ("hit_rate", "hit rate", "{:.0%}"), ("ttft_ms", "TTFT ms", "{:.1f}"), ("floor_ms", "floor ms", "{:.1f}"),
               ("efficiency", "floor / TTFT", "{:.0%}")],
    "preempt": [("oversubscription", "max_num_seqs / pool", "{:g}x"), ("max_num_seqs", "max_num_seqs", "{}"),
                ("output_tok_s", "output tok/s", "{:,.0f}"), ("tpot_p99_ms", "TPOT p99 ms", "{:.1f}"),
                ("e2e_p99_s", "E2E p99 s", "{:.2f}"), ("preemptions", "preemptions", "{}"),
                ("recomputed_tokens", "recomputed tokens", "{:,}"), ("efficiency", "of bound", "{:.0%}")],
}


def _results() -> recorded.Results | None:
    return recorded.load_results(RESULTS_PATH)  # at call time: `mkdocs serve` sees a new recording


def _machine(gpu: str) -> recorded.MachineResults:
    return recorded.recorded_machine(RESULTS_PATH, gpu, what="engine results", command=RECORD_COMMAND,
                                     error=ResultsError, hint=", or guard the call with engine_recorded(gpu)")


def engine_recorded(gpu: str) -> bool:
    results = _results()
    try:
        return results is not None and results.has(gpu)
    except recorded.RecordedError as err:
        raise ResultsError(f"engine results: {err}") from None


def engine_env(gpu: str) -> str:
    """One line per run: GPU, date, driver and versions, and the two rates measured at its start."""
    m = _machine(gpu)
    return "\n\n".join(
        f"**{m.label}**, measured {run['date']} (driver {run.get('driver')}, CUDA {run.get('cuda')}, torch "
        f"{run.get('torch')}, Triton {run.get('triton')}); {run.get('model')}, {run.get('layers')} layers, bf16, "
        f"random weights. Rates measured at the start of the run, used by every floor: copy bandwidth "
        f"{run['copy_tb_s']:.2f} TB/s (device-to-device `copy_`, bytes read + written), bf16 GEMM "
        f"{run['gemm_tflops']:.0f} TFLOP/s (8,192-cube `matmul`)."
        for run in m.runs)


def engine_measured(gpu: str) -> str:
    """"NVIDIA H200, 2026-12-01": the machine and the date(s) its rows were measured, for a lesson's prose."""
    m = _machine(gpu)
    return f"{m.label}, {m.dates}"


def _fmt(value, fmt: str) -> str:
    if value is None:
        return "off" if fmt == "{:,}" else "–"
    if isinstance(value, bool):
        return "on" if value else "off"
    return fmt.format(value)


def engine_table(section: str, gpu: str, where: str | None = None) -> str:
    """One section's rows as a Markdown table; `where="context=1024"` keeps rows with that field value."""
    if section not in COLUMNS:
        raise ResultsError(f"engine_table: unknown section {section!r}; one of {', '.join(COLUMNS)}")
    rows = [r for r in _machine(gpu).rows if r.get("section") == section]
    if where:
        field, _, want = where.partition("=")
        rows = [r for r in rows if str(r.get(field)) == want]
    if section == "decode":
        rows = _latest_ladder(rows)
    if not rows:
        raise ResultsError(f"engine_table: no {section} rows recorded for {gpu}" + (f" with {where}" if where else ""))
    cols = [c for c in COLUMNS[section] if any(c[0] in r for r in rows)]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(f), fmt) for f, _, fmt in cols) + " |")
    return "\n".join(lines)


def _latest_ladder(rows: list[dict]) -> list[dict]:
    """Decode rows whose batch fits the pool of the run that recorded that context's B = 1 row.

    The ladder's top rung is the largest batch the KV pool held in that run, so it moves with
    the free memory; a rung an earlier run reached and the latest did not (B = 882 then 868,
    say) stays in the file under its own name and is left out here.
    """
    pools = {r["context"]: r["pool_batch"] for r in rows if r.get("batch") == 1 and "pool_batch" in r}
    return [r for r in rows if r.get("batch", 0) <= pools.get(r.get("context"), r.get("batch", 0))]


def _row(name: str, gpu: str) -> dict:
    try:
        return _machine(gpu).row(name=name)
    except recorded.RecordedError as err:
        raise ResultsError(f"engine results: {err}") from None


def engine_value(name: str, field: str, gpu: str):
    """One recorded field of row `name` (e.g. "decode/L128/B1/graphs", "step_ms")."""
    row = _row(name, gpu)
    if field not in row:
        raise ResultsError(f"engine results: row {name} has no field {field!r}")
    return row[field]


def engine_ratio(name: str, field: str, over: str, gpu: str) -> str:
    """row[field] / row[over], as "1.53x": how far a measurement is from the model beside it."""
    return f"{engine_value(name, field, gpu) / engine_value(name, over, gpu):.2f}x"


def _spec_gpu(cuda_name: str):
    from labs import specs

    found = [key for key, g in specs.all_gpus().items() if g.cuda_name == cuda_name]
    if len(found) != 1:
        raise ResultsError(f"engine results: no GPU in labs/data/gpus.yaml has cuda_name {cuda_name!r}")
    return found[0]


def engine_decode(context: int, batch: int | str, gpu: str, graphs: bool = True) -> dict:
    """The decode row at (context, batch), plus the datasheet floor a lesson's table shows and the two gaps.

    Keys: the row's fields (step_ms, floor_ms at the run's measured rates, tok_s, ...);
    `model_floor_ms` / `model_tok_s` (labs/roofline.py at the datasheet bandwidth and FLOP/s,
    bf16); `over_floor` (step / floor at measured rates) and `over_model` (step / datasheet
    floor); `attained_flops_per_s` and `attained_fraction` (the cost model's FLOPs over the measured
    step, and that over the datasheet peak); and, where B = 1 was measured at that context, `step_growth` and `throughput_gain`
    against it beside the cost model's `model_step_growth` and `model_throughput_gain`.
    """
    from labs import roofline

    m = _machine(gpu)
    rows = [r for r in m.rows if r.get("section") == "decode" and r.get("context") == context
            and r.get("cuda_graphs") is graphs]
    if batch == "largest":  # the top rung of the latest run's ladder, not a rung only an older pool held
        rows = sorted(_latest_ladder(rows), key=lambda r: r["batch"])[-1:]
    else:
        rows = [r for r in rows if r.get("batch") == batch]
    if len(rows) != 1:
        have = sorted(r["batch"] for r in m.rows if r.get("section") == "decode" and r.get("context") == context)
        raise ResultsError(f"engine_decode: no decode row at context {context}, batch {batch}, "
                           f"cuda_graphs {graphs} for {gpu}; batches recorded at that context: {have}")
    row = rows[0]
    run = row["run"]
    dep = roofline.deployment(run["model"], _spec_gpu(m.machine.gpu))
    step = dep.decode(row["batch"], context)
    one = [r for r in m.rows if r.get("section") == "decode" and r.get("context") == context
           and r.get("cuda_graphs") is graphs and r.get("batch") == 1]
    out = {**row, "model_floor_ms": step.floor_s * 1e3, "model_tok_s": step.tokens_per_s,
           "over_floor": row["step_ms"] / row["floor_ms"], "over_model": row["step_ms"] / (step.floor_s * 1e3),
           # the step's FLOPs (as the cost model counts them) over the measured time, and that over the peak
           "attained_flops_per_s": step.flops / (row["step_ms"] / 1e3),
           "attained_fraction": step.flops / (row["step_ms"] / 1e3) / step.flops_per_s}
    if one:  # against B = 1 at the same context: what the cost model's step_growth / throughput_gain predict
        out.update(step_growth=row["step_ms"] / one[0]["step_ms"], throughput_gain=row["tok_s"] / one[0]["tok_s"],
                   model_step_growth=dep.step_growth(row["batch"], context),
                   model_throughput_gain=dep.throughput_gain(row["batch"], context))
    return out


def engine_over(name: str, other: str, field: str, gpu: str) -> str:
    """row `name`'s field over row `other`'s, as "10.2x": the engine against another system on the same trace."""
    return f"{engine_value(name, field, gpu) / engine_value(other, field, gpu):.1f}x"


def engine_has(name: str, gpu: str) -> bool:
    """Whether row `name` is recorded for `gpu`: for a page's `{% if %}` around a section that may not have run."""
    return engine_recorded(gpu) and _machine(gpu).has(name=name)


def engine_sim_error(name: str, field: str, gpu: str) -> str:
    """(simulated - measured) / measured for one field of row `name`, as "+170%"."""
    measured, simulated = engine_value(name, field, gpu), engine_value(name, f"sim_{field}", gpu)
    return f"{simulated / measured - 1:+.0%}"


MACROS = [engine_recorded, engine_measured, engine_env, engine_table, engine_value, engine_ratio, engine_decode,
          engine_sim_error, engine_over, engine_has]
