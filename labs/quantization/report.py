"""The quantization lab's tables for the site (torch-free): error tables, GEMM timings, the serving view.

macros.py registers `MACROS`. The error tables come from labs/results/quantization_error.json
(CPU-derived by `python -m labs.quantization.error --record`, seeded); the GEMM timings from
labs/results/quantization_speed.json (measured; "not recorded yet" until a GPU run); the
serving view from the cost model (labs/roofline.py), computed when the page builds.
"""

from __future__ import annotations

from labs import recorded
from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR

ERROR_PATH = RESULTS_DIR / "quantization_error.json"
ERROR_COMMAND = "python -m labs.quantization.error --out out/quant --record"
ERROR_MACHINE = "CPU (numpy, derived)"

SPEED = LabResults(
    "quantization_speed", RESULTS_DIR / "quantization_speed.json", "python3 -m labs.quantization.speed --out out/quant --record",
    {"gemm": [Column("Layer", "layer", "`{}`"), Column("M", "m", "{}"), Column("Variant", "variant", "`{}`"),
              Column("Time (µs)", "time_us", "{:,.1f}"), Column("bf16 ÷ time", "vs_bf16", "{:.2f}"),
              Column("Bytes read", "bytes", "{:,}"), Column("GB/s", "gb_s", "{:,.0f}"),
              Column("TFLOP/s", "tflop_s", "{:,.1f}")]},
)


def _error_rows(table: str) -> list[dict]:
    res = recorded.load_results(ERROR_PATH)
    if res is None or not res.has(ERROR_MACHINE):
        raise ValueError(f"{recorded.shown_path(ERROR_PATH)} holds no derived rows: run `{ERROR_COMMAND}`")
    return [r for r in res.machine(ERROR_MACHINE).rows if r["table"] == table]


def _md(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def quant_error_date() -> str:
    """When the CPU-derived error rows were computed."""
    rows = _error_rows("schemes")
    return max(r["run"]["date"] for r in rows)


def quant_scheme_table(layer: str = "q_proj") -> str:
    """Weight and output error per scheme on one layer, with and without outliers."""
    rows = _error_rows("schemes")
    by = {(r["scheme"], r["data"]): r for r in rows if r["layer"] == layer}
    schemes = list(dict.fromkeys(r["scheme"] for r in rows if r["layer"] == layer))
    body = []
    for s in schemes:
        o, g = by[(s, "outliers")], by[(s, "gaussian")]
        body.append([f"`{s}`", f"{o['bits_per_value']:g}", f"{o['weight_err']:.3g}", f"{o['output_err']:.3g}",
                     f"{g['output_err']:.3g}"])
    return _md(["Scheme", "Bits per weight", "Weight error (outliers)", "Output error (outliers)",
                "Output error (Gaussian)"], body)


def quant_error(table: str, case: str, field: str):
    """One derived value, e.g. quant_error("methods", "GPTQ-outliers", "output_err")."""
    for r in _error_rows(table):
        if r["case"] == case:
            return r[field]
    raise ValueError(f"no {table} row {case!r} in {recorded.shown_path(ERROR_PATH)}")


def quant_activation_table() -> str:
    body = [[f"`{r['scheme']}`", r["data"], f"{r['err']:.3g}", f"{r['bulk_err']:.3g}"]
            for r in _error_rows("activations")]
    return _md(["Activation scheme", "Data", "Error (all channels)", "Error (non-outlier channels)"], body)


def quant_smoothquant_table() -> str:
    body = [[r["case"].rsplit("-", 1)[0], r["data"], f"{r['output_err']:.3g}"] for r in _error_rows("smoothquant")]
    return _md(["Activations (int8)", "Data", "W8A8 output error"], body)


def quant_methods_table() -> str:
    body = [[r["method"], r["data"], f"`{r['scheme']}`", f"{r['calib_tokens']:,}",
             "—" if r["awq_alpha"] is None else f"{r['awq_alpha']:g}", f"{r['output_err']:.3g}", f"{r['weight_err']:.3g}"]
            for r in _error_rows("methods")]
    return _md(["Method", "Data", "Scheme", "Calibration tokens", "AWQ α", "Output error (held out)", "Weight error"],
               body)


def quant_speed_recorded(gpu: str) -> bool:
    return SPEED.recorded(gpu)


def quant_speed_table(gpu: str) -> str:
    return SPEED.table("gemm", gpu)


def quant_speed_env(gpu: str) -> str:
    return SPEED.env_line(gpu)


SERVING = (("llama-3.1-8b", "h100-sxm", 1), ("llama-3.1-8b", "h200", 1), ("llama-3.1-70b", "h100-sxm", 4),
           ("llama-3.1-70b", "h200", 2))
SERVING_SCHEMES = (("bfloat16", "auto"), ("fp8", "auto"), ("fp8", "fp8"), ("int4-g128", "fp8"))


def quant_serving_table(max_model_len: int = 8192, context: int = 8192) -> str:
    """Per model x GPU x (weights, KV): the decode floor at batch 1, the KV pool and whole requests it holds."""
    from labs import roofline, specs

    body = []
    for model, gpu, tp in SERVING:
        for wd, kv in SERVING_SCHEMES:
            d = roofline.deployment(model, gpu, weight_dtype=wd, kv_dtype=kv, tp=tp)
            b = d.kv_pool(max_model_len)
            body.append([specs.get_model(model).display_name, f"{specs.get_gpu(gpu).display_name} × {tp}", f"`{wd}`", f"`{kv}`",
                         f"{d.weight_bytes() / 2**30:.1f}", f"{d.decode(1, context).floor_s * 1e3:.2f}",
                         f"{b.kv_pool / 2**30:.1f}", f"{b.max_requests:,}"])
    return _md(["Model", "GPU × TP", "Weights", "KV cache", "Weights per GPU (GiB)",
                f"Decode floor, batch 1, L = {context:,} (ms)", "KV pool per GPU (GiB)",
                f"Requests of {max_model_len:,} tokens"], body)


MACROS = [quant_error_date, quant_scheme_table, quant_error, quant_activation_table, quant_smoothquant_table,
          quant_methods_table, quant_speed_recorded, quant_speed_table, quant_speed_env, quant_serving_table]


# ---------------------------------------------------------------------------
# Plots (through docs/.hooks/plotting.py, on the path during the site build)
# ---------------------------------------------------------------------------

_PLOTTED = (("int4", True, "int4 sym"), ("int4", False, "int4 asym"), ("int8", True, "int8 sym"),
            ("fp8-e4m3", True, "fp8 e4m3"))


def quant_error_plot(page_url: str, layer: str = "q_proj") -> str:
    """Output error against the number of weights sharing one scale (per tensor, per channel, groups), derived."""
    import plotting

    rows = [r for r in _error_rows("schemes") if r["layer"] == layer]
    n, k = rows[0]["shape"]
    size = {"tensor": n * k, "channel": k}
    series, table = {}, []
    for data in ("outliers", "gaussian"):
        for fmt, sym, label in _PLOTTED:
            pts = sorted((r["group"] or size[r["granularity"]], r["output_err"]) for r in rows
                         if r["fmt"] == fmt and r["symmetric"] == sym and r["data"] == data)
            if len(pts) < 2:
                continue
            name = f"{label}, {data}"
            series[name] = ([p[0] for p in pts], [p[1] for p in pts])
            table += [[name, f"{x:,}", f"{y:.3g}"] for x, y in pts]
    return plotting.lines(f"quant-error-{layer}", page_url, series, x_label="weights per scale (log)",
                          y_label="output error (relative, log)", log_x=True, log_y=True,
                          title=f"Output error against scale granularity, {layer} {n:,} × {k:,} (derived, CPU)",
                          caption="Fewer weights per scale (groups of 32 to 128, then per channel, then per tensor) "
                                  "and more bits lower the error; the Gaussian curves, without outliers, flatter "
                                  "every scheme.",
                          table=plotting.markdown_table(["Series", "Weights per scale", "Output error"], table),
                          size=(6.4, 4.2))


def quant_speed_plot(page_url: str, gpu: str, layer: str = "gate_proj/up_proj") -> str:
    """Time against M per variant for one projection, measured; "not recorded yet" without a run."""
    if not SPEED.recorded(gpu):
        return SPEED.missing()
    import plotting

    rows = [r for r in SPEED.rows("gemm", gpu) if r["layer"] == layer and r.get("time_us")]
    series = {}
    for r in sorted(rows, key=lambda r: r["m"]):
        series.setdefault(r["variant"], ([], []))
        series[r["variant"]][0].append(r["m"])
        series[r["variant"]][1].append(r["time_us"])
    table = [[f"`{r['variant']}`", str(r["m"]), f"{r['time_us']:,.1f}"] for r in rows]
    return plotting.lines(f"quant-speed-{layer.replace('/', '-')}", page_url, series, x_label="M (rows of X, log)",
                          y_label="time (µs)", log_x=True,
                          title=f"{layer} GEMM time against M on the {gpu} (measured)",
                          caption="Only fp8-gemm (torch._scaled_mm on already-quantized activations) beats bf16, at "
                                  "every M. fp8-w8a8, which pays its activation quantization unfused, and the "
                                  "lab's weight-only Triton kernels are slower than bf16 at every M despite "
                                  "reading fewer bytes, int4 most of all; both weight-only kernels fall further "
                                  "behind at the largest M.",
                          table=plotting.markdown_table(["Variant", "M", "Time (µs)"], table))


MACROS += [quant_error_plot, quant_speed_plot]
