"""The recorded server sweeps (labs/results/server_sweep.json) as page macros; no torch, no arithmetic in Jinja.

macros.py registers every function in `MACROS`. Pages name the GPU (`gpu="H200"`) and the
sweep (`mode="concurrency"` or `"rate"`); a value a page quotes comes from here, already
computed: a ratio, a floor from the cost model, the knee.
"""

from __future__ import annotations

from labs import recorded, roofline
from labs.loadgen.__main__ import RESULTS_FILE

RECORD_COMMAND = "bash labs/server/sweep.sh out/sweep"
MODEL, GPU_KEY = "llama-3.1-8b", "h200"


class ReportError(ValueError):
    """A page asked for a sweep point the results file does not hold."""


def _machine(gpu: str) -> recorded.MachineResults:
    return recorded.recorded_machine(RESULTS_FILE, gpu, what="server sweep", command=RECORD_COMMAND,
                                     error=ReportError)


def _rows(mode: str, gpu: str) -> list[dict]:
    if mode not in ("concurrency", "rate"):
        raise ReportError(f"mode must be 'concurrency' or 'rate', got {mode!r}")
    rows = sorted((r for r in _machine(gpu).rows if r["mode"] == mode), key=lambda r: r["load"])
    if not rows:
        raise ReportError(f"no {mode} sweep recorded for {gpu}")
    return rows


def sweep_point(mode: str, load: float, gpu: str = "H200") -> dict:
    """One recorded point: every field the load generator wrote, plus its run."""
    for r in _rows(mode, gpu):
        if r["load"] == float(load):
            return r
    known = ", ".join(f"{r['load']:g}" for r in _rows(mode, gpu))
    raise ReportError(f"no {mode}={load:g} point recorded for {gpu}; recorded: {known}")


def sweep_knee(mode: str, gpu: str = "H200") -> dict | None:
    """The knee point (labs/loadgen/stats.py's rule), or None when the sweep never saturated."""
    return next((r for r in _rows(mode, gpu) if r.get("knee")), None)


def sweep_last(mode: str, gpu: str = "H200") -> dict:
    return _rows(mode, gpu)[-1]


def sweep_ratio(mode: str, load_a: float, load_b: float, field: str, gpu: str = "H200") -> float:
    """field at load_b over field at load_a: how much a quantity grew between two points."""
    a, b = sweep_point(mode, load_a, gpu)[field], sweep_point(mode, load_b, gpu)[field]
    return b / a


def sweep_run(gpu: str = "H200") -> dict:
    """The run the latest rows came from: date, prompt and output lengths, SLOs, model."""
    return max(_machine(gpu).runs, key=lambda run: run["date"])


def sweep_tpot_floor(batch: int, gpu: str = "H200") -> dict:
    """The cost model's decode-step floor at `batch` rows and the sweep's mean context, against the measured TPOT.

    Context: the prompt plus half the output, the average a decode step sees. Returns
    {floor_s, measured_s, ratio} with the measured p50 TPOT of the concurrency point `batch`.
    """
    run = sweep_run(gpu)
    context = run["input_len"] + run["output_len"] // 2
    floor = roofline.deployment(MODEL, GPU_KEY).decode(batch, context).floor_s
    measured = sweep_point("concurrency", batch, gpu)["p50_tpot_ms"] / 1000
    return {"floor_s": floor, "measured_s": measured, "ratio": measured / floor, "context": context}


def _f(v, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def sweep_table(mode: str, gpu: str = "H200") -> str:
    """The sweep as a Markdown table; the knee's row is marked."""
    rows = _rows(mode, gpu)
    head = "Clients" if mode == "concurrency" else "Offered req/s"
    lines = [f"| {head} | Done | req/s | Output tok/s | Goodput req/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) "
             "| L (client) | λW | L (engine) | Slope |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        load = f"**{r['load']:g} (knee)**" if r.get("knee") else f"{r['load']:g}"
        lines.append(
            f"| {load} | {r['completed']} | {_f(r['request_throughput'])} | {_f(r['output_throughput'], 0)} | "
            f"{_f(r['request_goodput'])} | {_f(r['p50_ttft_ms'], 0)} / {_f(r['p99_ttft_ms'], 0)} | "
            f"{_f(r['p50_tpot_ms'])} / {_f(r['p99_tpot_ms'])} | {_f(r['little_L'])} | {_f(r['little_lambda_W'])} | "
            f"{_f(r.get('server_L'))} | {_f(r.get('slope'), 2)} |")
    return "\n".join(lines)


def sweep_caption(gpu: str = "H200") -> str:
    """Where the numbers come from: machine, date, workload, SLO."""
    m = _machine(gpu)
    run = sweep_run(gpu)
    slo = ", ".join(f"{k} ≤ {v:g} ms" for k, v in run["goodput_slo_ms"].items()) or "none"
    return (f"Measured on {m.label}, {run['date']}: labs.server with the engine at {run['model']} shapes (random "
            f"weights, bf16), {run['input_len']}-token prompts, {run['output_len']} output tokens "
            f"({'EOS ignored' if run['ignore_eos'] else 'EOS honoured'}), at most {run['num_prompts']} requests and "
            f"{run['max_duration_s']:g} s of sending per point. Goodput SLO: {slo}. L (client): time-averaged "
            "requests in flight at the client; λW: completions per second × mean E2E latency; L (engine): the "
            "server's running + waiting gauges, scraped twice a second. Slope: log-log slope of throughput to the "
            "next point.")


MACROS = [sweep_point, sweep_knee, sweep_last, sweep_ratio, sweep_run, sweep_tpot_floor, sweep_table, sweep_caption]
