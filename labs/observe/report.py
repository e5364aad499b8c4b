"""The observe labs' recorded results as page macros (tables, figures, quoted values); no torch, no Jinja arithmetic.

macros.py registers every function in `MACROS`. A page names the machine (`"H200"`, or
`"cpu"` for a run on the tiny CPU model) and gets Markdown back; every value a page quotes
is computed here (milliseconds from microseconds, shares as percentages).
"""

from __future__ import annotations

from labs import recorded
from labs.observe import common, diagnose
from labs.observe import series as _series

COMMANDS = {
    common.SCRAPE_FILE: "bash labs/observe/run.sh out/observe (STAGES=server)",
    common.PROFILE_FILE: "python -m labs.observe.profile --out out/profile --record",
    common.TUNE_FILE: "python -m labs.observe.tune --out out/tune --record",
}


class ReportError(ValueError):
    """A page asked for results that are not recorded."""


def _machine(path, gpu: str) -> recorded.MachineResults:
    return recorded.recorded_machine(path, gpu, what="observe results", command=COMMANDS[path], error=ReportError)


def _f(v, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def _pct(v, digits: int = 0) -> str:
    return "–" if v is None else f"{v:.{digits}%}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower())


# --- (a) the /metrics scrape ---------------------------------------------------------


def _scrape_rows(gpu: str) -> tuple[recorded.MachineResults, list[dict]]:
    m = _machine(common.SCRAPE_FILE, gpu)
    rows = sorted((r for r in m.rows if r["ok"]), key=lambda r: r["t_s"])
    if not rows:
        raise ReportError(f"no successful scrape recorded for {gpu}")
    return m, rows


def observe_scrape_summary(gpu: str = "H200") -> dict:
    """Peaks and totals of the scrape: what the page quotes."""
    m, rows = _scrape_rows(gpu)
    last = rows[-1]
    peak_wait = max(rows, key=lambda r: r["num_requests_waiting"])
    edges, cum = last["ttft_le"], last["ttft_cum"]
    p99 = _series.quantile(0.99, edges, cum)
    i = next(k for k, c in enumerate(cum) if c >= 0.99 * cum[-1])
    lo = 0.0 if i == 0 else edges[i - 1]
    hi = edges[i] if i < len(edges) else None
    return {
        "machine": m.label, "date": m.dates, "scrapes": len(rows), "seconds": last["t_s"],
        "interval_s": rows[0]["run"]["interval_s"], "window_s": rows[0]["run"]["window_s"],
        "series": rows[0]["series"],
        "waiting_max": int(peak_wait["num_requests_waiting"]), "waiting_max_t": peak_wait["t_s"],
        "running_max": int(max(r["num_requests_running"] for r in rows)),
        "kv_max_pct": _pct(max(r["kv_cache_usage_perc"] for r in rows)),
        "preemptions": int(last["num_preemptions_total"]), "requests": int(cum[-1]),
        "ttft_p99_ms": None if p99 is None else round(p99 * 1e3), "p99_bucket_lo_ms": round(lo * 1e3),
        "p99_bucket_hi_ms": None if hi is None else round(hi * 1e3),
    }


def observe_scrape_plots(gpu: str = "H200", page_url: str = "") -> str:
    """Three figures over the run's time: the queue and the batch, KV usage, windowed TTFT p99."""
    import plotting  # docs/.hooks, on the path during the site build

    m, rows = _scrape_rows(gpu)
    t = [r["t_s"] for r in rows]
    s = observe_scrape_summary(gpu)
    cap = (f"<strong>{m.label}</strong>, {m.dates}: labs.server (Llama-3.1-8B shapes, random weights, bf16) "
           f"under {s['series']}, /metrics scraped every {s['interval_s']:g} s by labs.observe.scrape.")
    slug = _slug(m.label)
    out = [plotting.lines(f"observe-queue-{slug}", page_url,
                          {"vllm:num_requests_waiting": (t, [r["num_requests_waiting"] for r in rows]),
                           "vllm:num_requests_running": (t, [r["num_requests_running"] for r in rows])},
                          x_label="time (s)", y_label="requests", title="Queue and batch over the run",
                          caption=cap + " Running stops at max_num_seqs; the queue takes the rest.")]
    out.append(plotting.lines(f"observe-kv-{slug}", page_url,
                              {"vllm:kv_cache_usage_perc (%)": (t, [100 * r["kv_cache_usage_perc"] for r in rows])},
                              x_label="time (s)", y_label="KV blocks in use (%)", title="KV-cache usage over the run",
                              caption=cap))
    pts = [(r["t_s"], r["ttft_p99_window_ms"]) for r in rows if r["ttft_p99_window_ms"] is not None]
    if pts:
        out.append(plotting.lines(f"observe-ttft-{slug}", page_url,
                                  {f"TTFT p99, last {s['window_s']:g} s (ms)": ([p[0] for p in pts], [p[1] for p in pts])},
                                  x_label="time (s)", y_label="TTFT p99 from buckets (ms)",
                                  title="TTFT p99 from histogram buckets", caption=cap +
                                  " Each point is histogram_quantile(0.99) over the bucket counts added in the window."))
    return "\n".join(out)


def observe_scrape_table(gpu: str = "H200", every_s: float = 2.0) -> str:
    """The scrape, one row every `every_s` seconds: what an on-call's dashboard shows."""
    _, rows = _scrape_rows(gpu)
    lines = ["| t (s) | waiting | running | KV usage | preemptions | TTFT count | TTFT p99, window (ms) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    next_t = 0.0
    for r in rows:
        if r["t_s"] + 1e-9 < next_t:
            continue
        next_t = r["t_s"] + every_s
        lines.append(f"| {r['t_s']:.1f} | {r['num_requests_waiting']:g} | {r['num_requests_running']:g} | "
                     f"{_pct(r['kv_cache_usage_perc'])} | {r['num_preemptions_total']:g} | {r['ttft_cum'][-1]:g} | "
                     f"{_f(r['ttft_p99_window_ms'], 0)} |")
    return "\n".join(lines)


def observe_ttft_bucket_table(gpu: str = "H200") -> str:
    """The TTFT histogram at the end of the run: bucket, count in it, cumulative share."""
    _, rows = _scrape_rows(gpu)
    last = rows[-1]
    edges, cum = last["ttft_le"] + [None], last["ttft_cum"]
    total = cum[-1] or 1
    lines = ["| le (s) | in bucket | cumulative | cumulative share |", "| ---: | ---: | ---: | ---: |"]
    prev = 0
    for e, c in zip(edges, cum):
        if c == prev and c in (0, total):
            prev = c
            continue
        lines.append(f"| {'+Inf' if e is None else f'{e:g}'} | {c - prev:g} | {c:g} | {_pct(c / total, 1)} |")
        prev = c
    return "\n".join(lines)


# --- (b) the profile -------------------------------------------------------------------


def observe_profile_row(case: str, gpu: str = "H200") -> dict:
    """One profiled case with the values a page quotes, in ms, MiB and percent."""
    m = _machine(common.PROFILE_FILE, gpu)
    try:
        r = m.row(case=case)
    except recorded.RecordedError as exc:
        raise ReportError(str(exc)) from None
    big = r.get("trace_bytes_with_stack_and_shapes")
    return {**r, "machine": m.label, "date": r["run"]["date"], "step_ms": round(r["step_us"] / 1e3, 2),
            "gpu_busy_ms": round(r["gpu_busy_us"] / 1e3, 2), "busy_pct": _pct(r["gpu_busy_share"]),
            "idle_pct": _pct(1 - r["gpu_busy_share"]) if r["gpu_busy_share"] is not None else "–",
            "head_ms": round(r["idle_before_first_kernel_us"] / 1e3, 2),
            "between_ms": round(r["idle_between_kernels_us"] / 1e3, 2),
            "tail_ms": round(r["idle_after_last_kernel_us"] / 1e3, 2),
            "largest_gap_ms": round(r["largest_gap_us"] / 1e3, 2),
            "trace_mib": round(r["trace_bytes"] / 2**20, 1), "trace_mib_per_step": round(r["trace_bytes_per_step"] / 2**20, 2),
            "detailed_mib": None if big is None else round(big / 2**20, 1),
            "detailed_ratio": None if big is None else round(big / r["trace_bytes"], 1)}


def observe_profile_ratio(case_a: str, case_b: str, field: str, gpu: str = "H200") -> float:
    """field of case_b over field of case_a (e.g. how many times slower the eager step is)."""
    a, b = observe_profile_row(case_a, gpu)[field], observe_profile_row(case_b, gpu)[field]
    return round(b / a, 1)


def observe_profile_table(gpu: str = "H200") -> str:
    """Per case: step time, GPU busy, where the idle time sits, kernels, gaps, launches, trace size."""
    m = _machine(common.PROFILE_FILE, gpu)
    # Runs recorded before the driver-API count have no such field: their column is left out.
    driver = all("driver_launch_calls_per_step" in raw for raw in m.rows)
    lines = ["| Case | Step (ms) | GPU busy | Idle before first kernel (ms) | Idle between kernels (ms) "
             "| Idle after last (ms) | Kernels | Gaps ≥ 2 µs | Largest gap (ms) | Runtime-API launches "
             + ("| Driver-API launches " if driver else "") + "| Trace per step (MiB) |",
             "| --- " + "| ---: " * (11 if driver else 10) + "|"]
    for raw in m.rows:
        r = observe_profile_row(raw["case"], gpu)
        extra = f"{r['driver_launch_calls_per_step']:g} | " if driver else ""
        lines.append(f"| {r['case']} | {r['step_ms']:.2f} | {r['busy_pct']} | {r['head_ms']:.2f} | {r['between_ms']:.2f} "
                     f"| {r['tail_ms']:.2f} | {r['kernels_per_step']:g} | {r['gaps_per_step']:g} | "
                     f"{r['largest_gap_ms']:.2f} | {r['launch_calls_per_step']:g} | {extra}{r['trace_mib_per_step']:.2f} |")
    return "\n".join(lines)


def observe_top_kernels_table(case: str, gpu: str = "H200") -> str:
    """The case's kernels by GPU time per step."""
    r = observe_profile_row(case, gpu)
    lines = ["| Kernel | Calls per step | µs per step | Share of GPU time |", "| --- | ---: | ---: | ---: |"]
    for k in r["top"]:
        calls = "–" if k["calls_per_step"] is None else f"{k['calls_per_step']:g}"
        lines.append(f"| `{k['name']}` | {calls} | {k['us_per_step']:,.0f} | {_pct(k['share'], 1)} |")
    return "\n".join(lines)


def observe_profile_caption(gpu: str = "H200") -> str:
    m = _machine(common.PROFILE_FILE, gpu)
    run = m.runs[0]
    r = m.rows[0]
    return (f"Measured on {m.label}, {run['date']}: labs.engine at {run['model']} shapes (random weights, bf16), "
            f"{r['batch']} sequences decoding at {r['context']:,} tokens of context, {run['steps']} profiled steps per "
            f"case after 2 unprofiled ones; {run['profiler']}; torch {run['torch']}.")


# --- (c) the tuning loop ---------------------------------------------------------------


def observe_tuning_recorded(gpu: str) -> bool:
    try:
        _machine(common.TUNE_FILE, gpu)
    except ReportError:
        return False
    return True


def observe_tuning_run(gpu: str) -> dict:
    m = _machine(common.TUNE_FILE, gpu)
    run = dict(m.runs[-1])
    run["machine"] = m.label
    return run


def observe_tuning_table(gpu: str) -> str:
    """Goodput and the binding constraint per setting, base first."""
    from labs.observe.tune import NAMES

    m = _machine(common.TUNE_FILE, gpu)
    rows = sorted(m.rows, key=lambda r: NAMES.index(r["setting"]) if r["setting"] in NAMES else 99)
    lines = ["| Setting | Goodput (req/s) | Good / sent | TTFT p99 (ms) | TPOT p99 (ms) | Queue p99 (ms) | Waiting max "
             "| KV peak | Preempted | Seats full | Budget full | SLO | Binding | Cause |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['goodput_rps']:.2f} | {r['good']} / {r['requests']} | {_f(r['ttft_p99_ms'], 0)} | "
            f"{_f(r['tpot_p99_ms'], 1)} | {_f(r['queue_p99_ms'], 0)} | {r['waiting_max']} | {_pct(r['kv_peak'])} | "
            f"{r['preemptions']} | {_pct(r['seats_full_share'])} | {_pct(r['budget_full_share'])} | "
            f"{'met' if r['slo_met'] else 'missed (' + r['binding_slo'].upper() + ')'} | **{r['binding']}** | {r['cause']} |")
    return "\n".join(lines)


def observe_relief_table() -> str:
    """diagnose.RELIEF as a table: constraint, the signal that names it, the knob, its price."""
    lines = ["| Binding | What the metrics show | Knob that relieves it | What it costs |", "| --- | --- | --- | --- |"]
    for constraint, cause, knob, price in diagnose.RELIEF:
        lines.append(f"| {constraint} | {cause} | {knob} | {price} |")
    return "\n".join(lines)


MACROS = [observe_scrape_summary, observe_scrape_plots, observe_scrape_table, observe_ttft_bucket_table,
          observe_profile_row, observe_profile_ratio, observe_profile_table, observe_top_kernels_table,
          observe_profile_caption, observe_tuning_recorded, observe_tuning_run, observe_tuning_table,
          observe_relief_table]
