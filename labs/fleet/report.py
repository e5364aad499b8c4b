"""The fleet simulator's recorded rows (labs/results/fleet.json) as Markdown for the site (torch-free).

macros.py registers every function in `MACROS`; pages never retype a number the simulator wrote:

* `fleet_table(section)`: the routing or autoscale rows as a table;
* `fleet_value(name, field)`: one recorded field, for prose;
* `fleet_ratio(name, over, field)`: row[field] / other row[field], a number (for `| num(1)`);
* `fleet_setup(key)`: what the run was configured with (calibration, SLO, autoscaler, day, chat);
* `fleet_calibration_table()`: each engine decode row against the calibrated clock, and the error;
* `fleet_series(name)`: one autoscaler row's ticks, for the plot in docs/.hooks/plots.py.
"""

from __future__ import annotations

from labs import recorded
from labs.recorded import RESULTS_DIR

RESULTS_PATH = RESULTS_DIR / "fleet.json"
MACHINE = "CPU (fleet simulator, derived)"
RECORD_COMMAND = "python -m labs.fleet --record"

COLUMNS = {
    "routing": [("policy", "router", "{}"), ("replicas", "GPUs", "{}"), ("hit_rate", "prefix-cache hit rate", "{:.1%}"),
                ("prefill_tokens", "prompt tokens prefilled", "{:,}"), ("ttft_p50_ms", "TTFT p50 ms", "{:,.0f}"),
                ("ttft_p99_ms", "TTFT p99 ms", "{:,.0f}"), ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
                ("busy_max_over_mean", "busiest GPU / mean", "{:.2f}")],
    "autoscale": [("label", "autoscaler", "{}"), ("requests", "requests", "{:,}"),
                  ("slo_violation_rate", "missed the SLO", "{:.1%}"), ("ttft_p99_ms", "TTFT p99 ms", "{:,.0f}"),
                  ("tpot_p99_ms", "TPOT p99 ms", "{:.0f}"), ("gpu_hours", "GPU-hours", "{:.2f}"),
                  ("mean_replicas", "mean GPUs", "{:.2f}"), ("peak_replicas", "peak GPUs", "{}"),
                  ("scale_ups", "replicas started", "{}")],
}


class FleetResultsError(ValueError):
    """The results file lacks what a page asked for."""


def _machine() -> recorded.MachineResults:
    return recorded.recorded_machine(RESULTS_PATH, MACHINE, what="fleet results", command=RECORD_COMMAND,
                                     error=FleetResultsError)


def fleet_recorded() -> bool:
    results = recorded.load_results(RESULTS_PATH)
    return results is not None and results.has(MACHINE)


def _row(name: str) -> dict:
    try:
        return _machine().row(name=name)
    except recorded.RecordedError as err:
        raise FleetResultsError(f"fleet results: {err}") from None


def fleet_value(name: str, field: str):
    row = _row(name)
    if field not in row:
        raise FleetResultsError(f"fleet results: row {name} has no field {field!r}")
    return row[field]


def fleet_ratio(name: str, over: str, field: str) -> float:
    """row(name)[field] / row(over)[field]: how many times one policy's figure is the other's."""
    return fleet_value(name, field) / fleet_value(over, field)


def fleet_setup(key: str):
    """A field of the recorded run: calibration, slo_ms, autoscaler, day, chat, kv_blocks, date, ..."""
    run = _machine().runs[-1]
    if key not in run:
        raise FleetResultsError(f"fleet results: the run has no {key!r}; it has {sorted(run)}")
    return run[key]


def fleet_table(section: str) -> str:
    if section not in COLUMNS:
        raise FleetResultsError(f"fleet_table: unknown section {section!r}; one of {', '.join(COLUMNS)}")
    rows = [r for r in _machine().rows if r.get("section") == section]
    if not rows:
        raise FleetResultsError(f"fleet_table: no {section} rows recorded")
    cols = COLUMNS[section]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("–" if r.get(f) is None else fmt.format(r[f]) for f, _, fmt in cols) + " |")
    return "\n".join(lines)


def fleet_calibration_table() -> str:
    """The engine's decode rows with CUDA graphs, measured, against the fleet's calibrated step time."""
    from labs.engine.report import _machine as engine_machine
    from labs.fleet.calibration import Calibration, calibrated_roofline

    cal = Calibration(**fleet_setup("calibration"))
    cost = calibrated_roofline(fleet_setup("model"), "h200", cal)
    rows = [r for r in engine_machine("H200").rows if r.get("section") == "decode" and r.get("cuda_graphs")]
    lines = ["| L | B | engine step ms (measured) | fleet clock ms | off by |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        model = cost.decode_step_time(r["batch"], r["context"]) * 1e3
        lines.append(f"| {r['context']:,} | {r['batch']:,} | {r['step_ms']:.2f} | {model:.2f} | "
                     f"{model / r['step_ms'] - 1:+.0%} |")
    return "\n".join(lines)


def fleet_series(name: str) -> dict:
    """t, GPUs ready, GPUs loading, requests waiting, running, mean utilisation, desired: per control tick."""
    ticks = fleet_value(name, "ticks")
    keys = ("t", "ready", "loading", "waiting", "running", "util", "desired")
    return {k: [tick[i] for tick in ticks] for i, k in enumerate(keys)}


MACROS = [fleet_recorded, fleet_value, fleet_ratio, fleet_setup, fleet_table, fleet_calibration_table]
