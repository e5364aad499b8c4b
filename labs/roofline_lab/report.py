"""The roofline lab's recorded results for the site (torch-free): tables and the measured roofline.

macros.py registers `MACROS`: `roofline_lab_table("gemm", "H200")`, `roofline_lab_ridge("bf16",
"H200")` inside `{% if roofline_lab_recorded("H200") %}`, and `roofline_lab_plot("H200")`.
"""

from __future__ import annotations

from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR

RESULTS = LabResults(
    "roofline_lab", RESULTS_DIR / "roofline_lab.json", "python -m labs.roofline_lab --out out/roofline --record",
    {
        "gemm": [Column("dtype", "dtype"), Column("M", "m", "{:,}"), Column("N", "n", "{:,}"), Column("K", "k", "{:,}"),
                 Column("Time (µs)", "time_us", "{:,.1f}"), Column("TFLOP/s", "tflop_s", "{:,.1f}"),
                 Column("GB/s", "gb_s", "{:,.0f}"), Column("FLOP/byte", "intensity", "{:,.1f}"),
                 Column("Model floor (µs)", "model_us", "{:,.1f}"), Column("Floor ÷ time", "of_model", "{:.2f}")],
        "ridge": [Column("dtype", "dtype"), Column("Measured peak (TFLOP/s)", "peak_tflop_s", "{:,.0f}"),
                  Column("Datasheet (TFLOP/s)", "model_peak_tflop_s", "{:,.0f}"),
                  Column("Measured GB/s roof (TB/s)", "bandwidth_tb_s", "{:.2f}"),
                  Column("Datasheet (TB/s)", "model_tb_s", "{:.1f}"),
                  Column("Measured ridge (FLOP/byte)", "ridge_flop_per_byte", "{:,.0f}"),
                  Column("Measured ridge M", "ridge_m", "{:,.0f}"), Column("Cost-model ridge M", "model_ridge_m", "{:,.0f}")],
        "attention": [Column("B", "batch", "{:,}"), Column("L", "context", "{:,}"), Column("Time (µs)", "time_us", "{:,.1f}"),
                      Column("FLOP/byte", "intensity", "{:.2f}"), Column("TFLOP/s", "tflop_s", "{:,.2f}"),
                      Column("TB/s", "tb_s", "{:.2f}")],
    },
)


def roofline_lab_recorded(gpu: str) -> bool:
    """True when labs/results/roofline_lab.json holds an entry for `gpu`."""
    return RESULTS.recorded(gpu)


def roofline_lab_table(section: str, gpu: str) -> str:
    """The gemm, ridge or attention rows, or "not recorded yet"."""
    return RESULTS.table(section, gpu)


def roofline_lab_ridge(dtype: str, gpu: str) -> dict:
    """The measured ridge row of one dtype ("bf16", "fp8")."""
    return RESULTS.row("ridge", "dtype", dtype, gpu)


def roofline_lab_gemm(dtype: str, m: int, gpu: str) -> dict:
    """One GEMM row."""
    for r in RESULTS.rows("gemm", gpu):
        if r["dtype"] == dtype and r["m"] == m:
            return r
    raise LookupError(f"roofline_lab: no {dtype} GEMM row at M = {m}")


def roofline_lab_attention(batch: int, context: int, gpu: str) -> dict:
    """One paged-decode row."""
    for r in RESULTS.rows("attention", gpu):
        if r["batch"] == batch and r["context"] == context:
            return r
    raise LookupError(f"roofline_lab: no attention row at B = {batch}, L = {context}")


def roofline_lab_env(gpu: str) -> str:
    return RESULTS.env_line(gpu)


def plot_series(entry: dict) -> tuple[dict, list[tuple[str, float, str]]]:
    """The measured points (intensity, TFLOP/s) per series, the two datasheet roofs, and the ridge marks."""
    from labs import roofline

    secs = entry["sections"]
    series = {}
    for dtype in ("bf16", "fp8"):
        rows = [r for r in secs.get("gemm", []) if r["dtype"] == dtype]
        if rows:
            series[f"{dtype} GEMM, measured"] = ([r["intensity"] for r in rows], [r["tflop_s"] for r in rows])
    att = secs.get("attention", [])
    if att:
        series["paged decode attention, measured"] = ([r["intensity"] for r in att], [r["tflop_s"] for r in att])
    g = roofline.get_gpu("h200")
    xs = [0.5 * 2**i for i in range(16)]
    series["bf16 roof (datasheet)"] = (xs, [min(g.dense_tflops["bf16"], g.hbm_bandwidth_tbps * x) for x in xs])
    marks = [("x", r["ridge_flop_per_byte"], f"measured {r['dtype']} ridge") for r in secs.get("ridge", [])]
    return series, marks


def roofline_lab_plot(gpu: str, page_url: str = "") -> str:
    """Measured GEMM and attention points on the H200's roofline, or the "not recorded yet" note."""
    if not RESULTS.recorded(gpu):
        return RESULTS.missing()
    import plotting  # docs/.hooks, on the path during the site build

    e = RESULTS.entry(gpu)
    series, marks = plot_series(e)
    rows = [[k, f"{x:,.2f}", f"{y:,.1f}"] for k, (xs, ys) in series.items() if "measured" in k for x, y in zip(xs, ys)]
    table = plotting.markdown_table(["Series", "FLOP/byte", "TFLOP/s"], rows)
    return plotting.lines(f"roofline-lab-{gpu.lower().replace(' ', '-')}", page_url, series,
                          x_label="arithmetic intensity (FLOP per byte, cost model)",
                          y_label="TFLOP/s (measured)", title=f"Measured GEMM and decode attention on the {e['gpu']}",
                          caption=f"{RESULTS.env_line(gpu)} The line is the datasheet roofline (labs/data/gpus.yaml).",
                          table=table, log_x=True, log_y=True,
                          marks=[plotting.Mark(a, v, lbl) for a, v, lbl in marks])


def gemm_nk() -> dict:
    """{"n", "k"} of the lab's GEMM: Llama-3.1-8B's gate/up projection (labs/data/models.yaml)."""
    from labs.roofline_lab.lab import gemm_shape

    n, k = gemm_shape()
    return {"n": n, "k": k}


def gemm_cost(m: int, dtype: str = "bf16", gpu: str = "h200", tflops: float | None = None,
              tb_s: float | None = None, n: int | None = None, k: int | None = None):
    """The cost model's GEMM (labs/roofline.py gemm) at M rows; N and K default to the lab's shape."""
    from labs import roofline

    nk = gemm_nk()
    return roofline.gemm(gpu, m, n or nk["n"], k or nk["k"], dtype, tflops, tb_s)


def gemm_ridge(dtype: str = "bf16", gpu: str = "h200", tflops: float | None = None, tb_s: float | None = None,
               n: int | None = None, k: int | None = None) -> float:
    """The cost model's ridge M for the lab's GEMM shape (labs/roofline.py gemm_ridge_m)."""
    from labs import roofline

    nk = gemm_nk()
    return roofline.gemm_ridge_m(gpu, n or nk["n"], k or nk["k"], dtype, tflops, tb_s)


def roofline_lab_complete(gpu: str) -> bool:
    """True when a bf16 ridge row was recorded (the one the lesson quotes)."""
    if not RESULTS.recorded(gpu):
        return False
    try:
        roofline_lab_ridge("bf16", gpu)
    except (LookupError, ValueError):
        return False
    return True


MACROS = [roofline_lab_complete, gemm_nk, gemm_cost, gemm_ridge, roofline_lab_recorded, roofline_lab_table, roofline_lab_ridge, roofline_lab_gemm, roofline_lab_attention,
          roofline_lab_env]  # roofline_lab_plot is registered in macros.py, which knows the page's URL
