"""The site's figures, drawn at build time from the cost model and recorded lab results.

Each figure is a builder here that reads its numbers from one place only (the
cost model, labs/roofline.py, or a recorded results file through the lab's own
loader), puts them in a JSON-able dict, and hands that dict to a drawing
function that knows nothing else. plotting.py renders the drawing through
matplotlib in both colour schemes and caches it on that dict, so a figure is
redrawn only when its numbers or its code change. Beside every figure the page
prints the same numbers as a table: a screen reader or a reader who wants the
exact value loses nothing.

The KV-cache calculator's data and markup live here too (end of file).

Nothing here imports torch.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Iterable

import jinja2

import plotting
from plotting import PlotError, markdown_table

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "docs" / ".overrides" / "partials"

GIB = 2**30


def _esc(text) -> str:
    return html.escape(str(text), quote=True)


def _si(value: float, digits: int = 3) -> str:
    """1.23e12 -> '1.23 T': FLOPs and bytes in decimal units, as the site writes bandwidth."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {suffix}"
    return f"{value:.{digits}g} "


def _tick(value: float, _pos=None) -> str:
    return f"{value / 1000:g}k" if value >= 1000 else f"{value:g}"


# ---------------------------------------------------------------------------
# Rooflines: one GPU's two roofs and a model's decode and prefill steps (cost model)
# ---------------------------------------------------------------------------


def roofline_data(roofline, model: str, gpu: str, context: int, decode_batches: Iterable[int],
                  prefill_batches: Iterable[int]) -> dict:
    """Everything the roofline draws, from the cost model: roofs, ridges and one point per step."""
    dep = roofline.deployment(model, gpu)
    if dep.model.moe is not None or dep.model.mla is not None:
        raise PlotError(f"{dep.model.name}: roofline points are drawn for dense models only (no MoE, no MLA)")
    roofs = [{"name": "bf16 dense", "kind": "bf16", "flops": dep.flops_per_s,
              "ridge": roofline.ridge(dep).flop_per_byte}]
    if dep.gpu.dense_tflops.get("fp8"):
        dep8 = roofline.deployment(model, gpu, weight_dtype="fp8")
        roofs.insert(0, {"name": "fp8 dense", "kind": "fp8", "flops": dep8.flops_per_s,
                         "ridge": roofline.ridge(dep8).flop_per_byte})
    steps = [("decode", b, roofline.decode(dep, b, context)) for b in decode_batches]
    steps += [("prefill", b, roofline.uniform(dep, b, roofline.Chunk(context, 0, True))) for b in prefill_batches]
    points = [{"phase": phase, "batch": b, "tokens": context, "flops": c.flops, "bytes": c.bytes,
               "intensity": c.intensity, "bound": c.bound, "floor_s": c.floor_s,
               "attained": min(dep.flops_per_s, dep.memory_bandwidth.bytes_per_s * c.intensity)}
              for phase, b, c in steps]
    return {"gpu": dep.gpu.display_name, "model": dep.model.display_name, "context": context,
            "bandwidth": dep.memory_bandwidth.bytes_per_s, "bandwidth_source": dep.bandwidth,
            "roofs": roofs, "points": points}


def draw_roofline(ax, theme, data: dict) -> None:
    import numpy as np

    bw = data["bandwidth"]
    x = np.logspace(np.log10(0.5), np.log10(20000), 200)
    styles = {"bf16": dict(color=theme.series[0], linewidth=2.5), "fp8": dict(color=theme.muted, linewidth=1.5,
                                                                             linestyle="--")}
    for roof in data["roofs"]:
        top = roof["flops"] / 1e12
        ax.plot(x, np.minimum(top, bw * x / 1e12), **styles[roof["kind"]])
        ax.plot([roof["ridge"]], [top], "o", color=styles[roof["kind"]]["color"], markersize=5)
        ax.annotate(f"{roof['name']} {top:,.0f} TFLOP/s\nridge {roof['ridge']:,.0f} FLOP/B", (roof["ridge"], top),
                    xytext=(-6, 6), textcoords="offset points", ha="right", va="bottom", color=theme.muted)
    ax.annotate(f"HBM {bw / 1e12:g} TB/s", (2, bw * 2 / 1e12), xytext=(0, 8), textcoords="offset points",
                color=theme.muted, rotation=33, rotation_mode="anchor")
    colours = {"decode": theme.series[1], "prefill": theme.series[2]}
    for p in data["points"]:
        y = p["attained"] / 1e12
        ax.plot([p["intensity"]], [y], "o", color=colours[p["phase"]], markersize=7)
        ax.annotate(f"{p['phase']} B={p['batch']:,}", (p["intensity"], y), xytext=(0, -10), textcoords="offset points",
                    ha="center", va="top", color=colours[p["phase"]], fontweight="bold")
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(_tick))
    ax.yaxis.set_major_formatter(FuncFormatter(_tick))
    ax.set_xlim(0.5, 20000)
    top = max(r["flops"] for r in data["roofs"]) / 1e12
    ax.set_ylim(0.5, top * 8)  # room above the flat roof for its label
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.grid(True, which="major", linewidth=0.6)


def roofline_figure(roofline, page_url: str, model: str, gpu: str, context: int = 2048,
                    decode_batches=(1, 256), prefill_batches=(1, 8)) -> str:
    data = roofline_data(roofline, model, gpu, context, decode_batches, prefill_batches)
    rows = [[p["phase"], f"{p['batch']:,}", f"{p['batch']:,} × {p['tokens']:,}", _si(p["flops"]) + "FLOP",
             _si(p["bytes"]) + "B", f"{p['intensity']:,.1f}", p["bound"], f"{p['floor_s'] * 1e3:,.2f} ms"]
            for p in data["points"]]
    table = markdown_table(["Step", "Batch", "Tokens", "FLOPs", "Bytes moved", "FLOP/byte", "Bound by",
                            "Time at the roof"], rows)
    bf16 = next(r for r in data["roofs"] if r["kind"] == "bf16")
    caption = (
        f"<strong>{_esc(data['gpu'])}</strong>: {data['bandwidth'] / 1e12:g} TB/s of memory bandwidth "
        f"({_esc(data['bandwidth_source'])}), {bf16['flops'] / 1e12:,g} dense bf16 TFLOP/s "
        f"(<code>labs/data/gpus.yaml</code>). Points: {_esc(data['model'])} in bf16 at {data['context']:,} tokens of "
        "context, <em>derived</em> by the cost model (<code>labs/roofline.py</code>), not measured."
    )
    title = f"Roofline of the {data['gpu']} with {data['model']} decode and prefill steps"
    return plotting.figure(f"roofline-{gpu}-{model}-{context}", page_url, draw_roofline, data, title=title,
                           caption=caption, table=table, size=(6.4, 3.9))


# ---------------------------------------------------------------------------
# KV budget per model (cost model: kv_pool at the smallest TP that fits)
# ---------------------------------------------------------------------------

BUDGET_SEGMENTS = (
    # (key, legend label, series index or None for the outlined headroom)
    ("weights", "weights", 0),
    ("overhead", "activations, workspaces, CUDA graphs (estimated)", 4),
    ("kv_pool", "KV pool", 2),
    ("headroom", "left out by gpu_memory_utilization", None),
)


def kv_budget_data(roofline, models: list[str], gpu: str, max_model_len: int) -> dict:
    bars = []
    for name in models:
        dep = roofline.smallest_tp(_model(name), _gpu(gpu), max_model_len)
        if dep is None:
            raise PlotError(f"{name} on {gpu}: no TP of 1, 2, 4 or 8 fits one {max_model_len:,}-token request")
        b = roofline.kv_pool(dep, max_model_len)
        bars.append({"model": dep.model.display_name, "tp": dep.tp, "weights": b.weights,
                     "overhead": b.activation_peak + b.non_torch + b.cudagraph, "kv_pool": max(b.kv_pool, 0),
                     "headroom": b.total_memory - b.requested_memory, "total": b.total_memory,
                     "kv_bytes_per_token": b.kv_bytes_per_token, "max_concurrency": b.max_concurrency,
                     "total_measured": b.total_measured})
    return {"gpu": _gpu(gpu).display_name, "max_model_len": max_model_len, "bars": bars}


def _model(name: str):
    from labs import specs

    return specs.get_model(name)


def _gpu(name: str):
    from labs import specs

    return specs.get_gpu(name)


def draw_kv_budget(ax, theme, data: dict) -> None:
    bars = data["bars"]
    labels = [b["model"] + (f" (TP={b['tp']})" if b["tp"] > 1 else "") for b in bars]
    ys = list(range(len(bars)))[::-1]
    left = [0.0] * len(bars)
    for key, label, colour in BUDGET_SEGMENTS:
        widths = [b[key] / GIB for b in bars]
        style = (dict(color=theme.series[colour]) if colour is not None
                 else dict(fill=False, edgecolor=theme.frame, linestyle="--", linewidth=1))
        ax.barh(ys, widths, left=left, height=0.62, label=label, **style)
        left = [lo + w for lo, w in zip(left, widths)]
    for y, b, x in zip(ys, bars, left):
        # Counts that must fit round down: "3.9 requests" would be read as 4.
        ax.annotate(f"{int(b['max_concurrency']):,} requests", (x, y), xytext=(6, 0), textcoords="offset points",
                    va="center", color=theme.text)
    ax.set_yticks(ys, labels)
    ax.set_xlim(0, max(left) * 1.32)
    ax.set_xlabel(f"GiB per GPU (max concurrency at {data['max_model_len']:,} tokens)")
    ax.grid(True, axis="x", linewidth=0.6)
    ax.figure.legend(loc="outside lower center", ncols=2, frameon=False)


def kv_budget_figure(roofline, page_url: str, gpu: str, max_model_len: int, models: list[str],
                     vllm_version: str) -> str:
    data = kv_budget_data(roofline, models, gpu, max_model_len)
    rows = [[b["model"], str(b["tp"]), f"{b['weights'] / GIB:,.1f}", f"{b['overhead'] / GIB:,.1f}",
             f"{b['kv_pool'] / GIB:,.1f}", f"{b['kv_bytes_per_token']:,}", f"{int(b['max_concurrency']):,}"]
            for b in data["bars"]]
    table = markdown_table(["Model", "TP", "Weights (GiB/GPU)", "Overhead (GiB, estimated)", "KV pool (GiB)",
                            "KV bytes/token/GPU", f"Requests at {max_model_len:,} tokens"], rows)
    total = data["bars"][0]["total"]
    measured = "as CUDA reports it" if data["bars"][0]["total_measured"] else "nvidia-smi's total, an upper bound"
    caption = (
        f"One {_esc(data['gpu'])} ({total / GIB:,.1f} GiB, {measured}) under vLLM {vllm_version} defaults, each "
        f"model at the smallest tensor-parallel size that fits one {max_model_len:,}-token request. "
        "<em>Derived</em> by the cost model (<code>labs/roofline.py</code> <code>kv_pool</code>); the overhead "
        "terms are the lab's labelled estimates. Requests round down: a part of one does not run."
    )
    height = 1.6 + 0.42 * len(data["bars"])
    return plotting.figure(f"kv-budget-{gpu}-{max_model_len}-{len(models)}", page_url, draw_kv_budget, data,
                           title=f"Where one {data['gpu']}'s memory goes, per model, and how many full-length "
                                 "requests its KV pool holds", caption=caption, table=table, size=(6.4, height))


# ---------------------------------------------------------------------------
# Measured: the paged-attention kernel against the copy bandwidth (recorded results)
# ---------------------------------------------------------------------------


def draw_paged_attention(ax, theme, data: dict) -> None:
    rows = data["rows"]
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [r["tb_s"] for r in rows], height=0.6, color=theme.series[2], label="paged kernel (Triton)")
    ax.plot([r["sdpa_tb_s"] for r in rows], ys, "D", color=theme.series[3], markersize=6,
            label="PyTorch SDPA, contiguous KV")
    ax.axvline(data["copy_tb_s"], color=theme.text, linestyle="--", linewidth=1.2)
    ax.annotate(f"copy {data['copy_tb_s']:.2f} TB/s", (data["copy_tb_s"], 1), xycoords=("data", "axes fraction"),
                xytext=(-4, 2), textcoords="offset points", ha="right", va="bottom", color=theme.muted)
    ax.set_yticks(ys, [r["shape"] for r in rows])
    ax.set_xlabel("achieved bandwidth, TB/s (KV bytes ÷ time)")
    ax.set_xlim(0, max([data["copy_tb_s"], *(r["tb_s"] for r in rows), *(r["sdpa_tb_s"] for r in rows)]) * 1.08)
    ax.grid(True, axis="x", linewidth=0.6)
    ax.figure.legend(loc="outside lower center", ncols=2, frameon=False)


def paged_attention_figures(page_url: str, gpu: str, path: Path | None = None, with_table: bool = True) -> str:
    """The named GPU's figure; `with_table=False` where the page already shows the results table."""
    from labs.paged_attention.report import load_results  # the lab owns its file

    results = load_results(path)
    if results is None or not results.machines:
        return (f'!!! note "No results recorded yet"\n    The paged-attention benchmark has not been recorded on '
                f"{_esc(gpu)} yet. Run `python -m labs.paged_attention.bench --out out/pa --record` on a CUDA GPU; "
                "this figure is drawn from `labs/results/paged_attention.json`.\n")
    m = results.machine(gpu)  # a GPU the file does not hold is an error naming those it does
    from labs.paged_attention.bench import table_rows

    shapes = table_rows(m.rows, "shapes")  # the equal-length shapes; the lab page tabulates the other tables
    copy = max(r["run"]["copy_tb_s"] for r in shapes)  # rows of several runs: the highest copy they were measured against
    data = {"gpu": m.label, "copy_tb_s": copy,
            "rows": [{"shape": r["shape"], "tb_s": r["tb_s"],
                      "sdpa_tb_s": r["kv_bytes"] / r["sdpa_time_us"] / 1e6} for r in shapes]}
    rows = [[
        r["shape"], f"{r['batch']}", f"{r['context_len']:,}", f"{r['q_heads']}/{r['kv_heads']}",
        f"{r['kv_bytes'] / 2**20:,.1f}", f"{r['time_us']:,.1f}", f"{r['tb_s']:.2f}", f"{r['copy_fraction']:.0%}",
        f"{r['sdpa_time_us']:,.1f}",
    ] for r in shapes]
    table = markdown_table(["Shape", "Batch", "Context", "Heads q/kv", "KV read (MiB)", "Kernel (µs)", "TB/s",
                            "of copy", "SDPA (µs)"], rows)
    runs = "; ".join(
        f"measured {_esc(run['date'])} (torch {_esc(run['torch'])}, Triton {_esc(run['triton'])}, "
        f"CUDA {_esc(run['cuda'])}), copy bandwidth in the same run {run['copy_tb_s']:.2f} TB/s"
        for run in m.runs)
    caption = f"<strong>{_esc(m.label)}</strong>, {runs}. Median of CUDA-graph replays with the L2 cleared."
    slug = "".join(c if c.isalnum() else "-" for c in m.label.lower())
    return plotting.figure(f"paged-attention-{slug}", page_url, draw_paged_attention, data,
                           title=f"Paged decode kernel bandwidth per shape on {m.label}",
                           caption=caption, table=table if with_table else "",
                           size=(6.4, 1.6 + 0.36 * len(data["rows"])))


# ---------------------------------------------------------------------------
# The KV-cache calculator: data for docs/javascripts/kv-calculator.js
# ---------------------------------------------------------------------------


# vLLM refuses a --max-model-len past the model's derived length unless this is 1
# (vllm/config/model.py, _get_and_verify_max_len; labs/data/vllm.yaml env_vars).
LONG_MAX_MODEL_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
# The first sentences of that refusal, as vLLM 0.33 words it (tests/test_plots.py checks them
# against the installed vLLM); the calculator fills in the numbers.
MAX_MODEL_LEN_ERROR = (
    "User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
    "(max_position_embeddings={limit} or model_max_length=None in model's config.json). "
    "To allow overriding this maximum, set the env var {env}=1."
)


def calculator_data(specs, formula, memory_budget, vllm_version: str, facts: dict | None = None) -> dict:
    """Everything the in-page calculator needs, read from the same modules the Python lab uses.

    The calculator mirrors labs/kv_sizing/formula.py and memory_budget.budget in
    JavaScript; the numbers it starts from (geometry, memory sizes, vLLM's
    defaults, the estimates' constants) all come from here, so the data is typed
    once. Three values are exported already derived: a model's weight bytes
    (stated parameter count x bytes per parameter), a GPU's total memory as vLLM
    sees it (labs.specs `memory_bytes_budget`), and vLLM's per-GPU batch
    defaults (memory_budget.vllm_batch_defaults). The environment variable
    that lifts vLLM's cap at max_position_embeddings is named from the vLLM
    facts file (`facts`), which the tests check against vLLM's source.
    """
    env_name = LONG_MAX_MODEL_LEN_ENV
    if facts is not None and env_name not in facts.get("env_vars", {}):
        raise PlotError(f"the vLLM facts file has no environment variable {env_name}")
    models = {}
    for name, m in specs.all_models().items():
        models[name] = {
            "display_name": m.display_name,
            "n_layers": m.n_layers, "hidden_size": m.hidden_size, "n_heads": m.n_heads,
            "n_kv_heads": m.n_kv_heads, "head_dim": m.head_dim, "vocab_size": m.vocab_size,
            "intermediate_size": m.intermediate_size, "dtype": m.dtype,
            "max_position_embeddings": m.max_position_embeddings,
            "weight_bytes": m.weight_bytes,
            "mla": None if m.mla is None else {"kv_lora_rank": m.mla.kv_lora_rank,
                                               "qk_rope_head_dim": m.mla.qk_rope_head_dim},
            "moe": None if m.moe is None else {"experts_per_token": m.moe.experts_per_token,
                                               "moe_intermediate_size": m.moe.moe_intermediate_size},
            "sliding_window": None if m.sliding_window is None else {
                "window": m.sliding_window.window, "layer_pattern": list(m.sliding_window.layer_pattern)},
        }
    gpus = {}
    for name, g in specs.all_gpus().items():
        tokens, seqs = memory_budget.vllm_batch_defaults(g)
        gpus[name] = {"display_name": g.display_name, "total_memory": g.memory_bytes_budget,
                      "max_num_batched_tokens": tokens, "max_num_seqs": seqs}
    return {
        "vllm_version": vllm_version,
        "kv_dtype_bytes": dict(formula.KV_DTYPE_BYTES),
        "default_block_size": formula.DEFAULT_BLOCK_SIZE,
        "mla_fp8_block_size": formula.MLA_FP8_BLOCK_SIZE,
        "gpu_memory_utilization": memory_budget.DEFAULT_GPU_MEMORY_UTILIZATION,
        "non_torch": memory_budget.NON_TORCH_ESTIMATE,
        "non_torch_tp_extra": memory_budget.NON_TORCH_TP_EXTRA,
        "cudagraph": memory_budget.CUDAGRAPH_ESTIMATE,
        "long_max_model_len_env": env_name,
        "max_model_len_error": MAX_MODEL_LEN_ERROR,
        "models": models,
        "gpus": gpus,
    }


def calculator_html(data: dict, model: str, gpu: str, max_model_len: int) -> str:
    """The calculator's form (docs/.overrides/partials/kv-calculator.html) with its data inlined as JSON."""
    if model not in data["models"]:
        raise PlotError(f"kv_calculator: unknown model {model!r}; known: {', '.join(data['models'])}")
    if gpu not in data["gpus"]:
        raise PlotError(f"kv_calculator: unknown GPU {gpu!r}; known: {', '.join(data['gpus'])}")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    payload = json.dumps(data, separators=(",", ":"))  # an attribute value: the template escapes it
    markup = env.get_template("kv-calculator.html").render(
        data=data, payload=payload, model=model, gpu=gpu, max_model_len=max_model_len)
    # One raw HTML block for Markdown: no blank lines inside it.
    return "\n".join(line for line in markup.splitlines() if line.strip()) + "\n"


# ---------------------------------------------------------------------------
# Engine benchmark (labs/results/engine.json)
# ---------------------------------------------------------------------------


def engine_decode_figure(page_url: str, gpu: str) -> str:
    """Measured decode step time against batch, CUDA graphs on, one curve per context, each with its floor."""
    from labs.engine.report import _latest_ladder, _machine  # the lab owns its file and its errors

    m = _machine(gpu)
    rows = _latest_ladder([r for r in m.rows if r.get("section") == "decode" and r.get("cuda_graphs")])
    if not rows:
        raise PlotError(f"no decode rows with CUDA graphs recorded for {gpu}")
    series = {}
    for ctx in sorted({r["context"] for r in rows}):
        mine = sorted((r for r in rows if r["context"] == ctx), key=lambda r: r["batch"])
        series[f"L = {ctx:,} measured"] = ([r["batch"] for r in mine], [r["step_ms"] for r in mine])
        series[f"L = {ctx:,} floor"] = ([r["batch"] for r in mine], [r["floor_ms"] for r in mine])
    run = m.runs[0]
    caption = (f"<strong>{_esc(m.label)}</strong>, measured {_esc(run['date'])}: Llama-3.1-8B shapes in bf16, median "
               f"step of the engine (scheduler, CUDA-graph replay, sampler). Floors from labs/roofline.py at the copy "
               f"bandwidth ({run['copy_tb_s']:.2f} TB/s) and GEMM rate ({run['gemm_tflops']:.0f} TFLOP/s) measured "
               "in the same run.")
    slug = "".join(c if c.isalnum() else "-" for c in m.label.lower())
    return plotting.lines(f"engine-decode-{slug}", page_url, series, x_label="batch B (sequences)",
                          y_label="decode step (ms)", title=f"Decode step time against batch on {m.label}",
                          caption=caption, log_x=True, log_y=True)


# ---------------------------------------------------------------------------
# Server sweep (labs/results/server_sweep.json)
# ---------------------------------------------------------------------------


def server_knee_figure(page_url: str, mode: str, gpu: str) -> str:
    """Output throughput and median TTFT and TPOT against load, the knee marked: where the table's two columns part ways.

    Throughput and latency share one log-scaled y axis (tokens/s and ms are both
    in the hundreds to thousands here), so the reader sees one curve flatten
    while the other turns up at the same load.
    """
    from labs.loadgen import report

    rows = report._rows(mode, gpu)
    knee = report.sweep_knee(mode, gpu)
    loads = [r["load"] for r in rows]
    series = {"output tok/s": (loads, [r["output_throughput"] for r in rows]),
              "TTFT p50 (ms)": (loads, [r["p50_ttft_ms"] for r in rows]),
              "TPOT p50 (ms)": (loads, [r["p50_tpot_ms"] for r in rows])}
    marks = [plotting.Mark("x", knee["load"], f"knee {knee['load']:g}")] if knee else []
    x_label = "clients in flight" if mode == "concurrency" else "offered requests/s"
    loop = "Closed loop" if mode == "concurrency" else "Open loop"
    run, label = report.sweep_run(gpu), report._machine(gpu).label
    caption = (f"{loop}, measured on <strong>{_esc(label)}</strong>, {_esc(run['date'])}: labs.server with the "
               f"engine at {_esc(run['model'])} shapes, {run['input_len']}-token prompts, {run['output_len']} output "
               "tokens. The knee (dashed) is labs/loadgen/stats.py's rule; the table below holds every point, p99 included (the one-client p99 is a cold start).")
    slug = "".join(c if c.isalnum() else "-" for c in gpu.lower())
    return plotting.lines(f"server-knee-{mode}-{slug}", page_url, series, x_label=x_label,
                          y_label="tok/s, or ms", title=f"{loop}: throughput flattens, latency turns up",
                          caption=caption, log_x=True, log_y=True, marks=marks)


# ---------------------------------------------------------------------------
# Fleet simulator: replicas and queue over the compressed day (labs/results/fleet.json)
# ---------------------------------------------------------------------------

FLEET_PLOTS = {"replicas": ("ready", "GPUs serving (ready replicas)"), "waiting": ("waiting", "requests waiting (fleet)")}


def fleet_figure(page_url: str, kind: str) -> str:
    """One curve per autoscaler over the day: ready replicas, or the fleet's num_requests_waiting."""
    from labs.fleet import report

    if kind not in FLEET_PLOTS:
        raise PlotError(f"fleet plot kind must be one of {', '.join(FLEET_PLOTS)}, got {kind!r}")
    field, y_label = FLEET_PLOTS[kind]
    rows = [r for r in report._machine().rows if r.get("section") == "autoscale"]
    if not rows:
        raise PlotError("no autoscale rows in labs/results/fleet.json")
    series = {}
    for r in rows:
        s = report.fleet_series(r["name"])
        series[r["label"]] = (s["t"], s[field])
    setup = report.fleet_setup("autoscaler")
    day = report.fleet_setup("day")
    caption = (f"<strong>Derived</strong> by the fleet simulator (<code>python -m labs.fleet</code>), sampled at each "
               f"{setup['period_s']:g} s control tick; cold start {setup['cold_start_s']:g} s, scale-down window "
               f"{setup['stabilization_s']:g} s. The load peaks at t = {day['peak_at_s']:g} s (dashed line).")
    return plotting.lines(f"fleet-{kind}", page_url, series, x_label="time in the compressed day (s)", y_label=y_label,
                          title=f"Fleet {y_label} over the day, per autoscaler", caption=caption,
                          marks=[plotting.Mark("x", day["peak_at_s"], "peak")])
