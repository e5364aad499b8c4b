"""Figures drawn from the project's data at build time, and the KV-cache calculator's markup.

Every figure is inline SVG written here by hand (no plotting library in the site
stack). Inline, not an <img>, so it takes the page's colours: strokes and text
use `currentColor` and the classes styled in docs/stylesheets/extra.css, which
follow Material's light/dark palette. Each figure carries a <title> and a
caption, and the numbers it plots are also printed as a table beside it, so a
screen reader or a reader who wants the exact value loses nothing.

Nothing here imports torch: the numbers come from labs.specs (models, GPUs),
labs.kv_sizing (the KV budget) and labs/results/*.json (measured runs).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import jinja2

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "docs" / ".overrides" / "partials"

GIB = 2**30


class PlotError(ValueError):
    """A figure asked for something the data files do not hold."""


# ---------------------------------------------------------------------------
# SVG helpers
# ---------------------------------------------------------------------------


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: float) -> str:
    """Coordinates with one decimal: small files, no visible rounding."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _si(value: float, digits: int = 3) -> str:
    """1.23e12 -> '1.23 T': FLOPs and bytes in decimal units, as the site writes bandwidth."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {suffix}"
    return f"{value:.{digits}g} "


@dataclass(frozen=True)
class Scale:
    """Maps data values to pixels along one axis, linear or log10."""

    lo: float
    hi: float
    start: float  # pixel of lo
    end: float  # pixel of hi
    log: bool = False

    def __call__(self, value: float) -> float:
        if self.log:
            lo, hi, v = math.log10(self.lo), math.log10(self.hi), math.log10(value)
        else:
            lo, hi, v = self.lo, self.hi, value
        return self.start + (v - lo) / (hi - lo) * (self.end - self.start)


def _log_ticks(lo: float, hi: float) -> list[float]:
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0**e for e in range(first, last + 1) if lo <= 10.0**e <= hi]


def _tick_label(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _svg(width: int, height: int, title: str, body: Iterable[str], css_class: str) -> str:
    """One <svg> on one line: Markdown keeps a raw HTML block intact only if no blank line splits it."""
    content = "".join(body)
    return (
        f'<svg class="plot {css_class}" viewBox="0 0 {width} {height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" font-size="13"><title>{_esc(title)}</title>{content}</svg>'
    )


def _figure(svg: str, caption: str, table: str = "") -> str:
    """A figure block Markdown passes through untouched (it starts at column 0 with a block tag)."""
    return f'<figure class="plot-figure">\n{svg}\n<figcaption>{caption}</figcaption>\n</figure>\n\n{table}\n'


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start", extra: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    return f'<text x="{_fmt(x)}" y="{_fmt(y)}" text-anchor="{anchor}"{attrs}{extra}>{_esc(text)}</text>'


def _line(x1: float, y1: float, x2: float, y2: float, cls: str) -> str:
    return f'<line x1="{_fmt(x1)}" y1="{_fmt(y1)}" x2="{_fmt(x2)}" y2="{_fmt(y2)}" class="{cls}"/>'


def _log_axes(xs: Scale, ys: Scale, x_label: str, y_label: str) -> list[str]:
    """Frame, decade gridlines and labels of a log-log plot."""
    out = []
    for tick in _log_ticks(xs.lo, xs.hi):
        x = xs(tick)
        out.append(_line(x, ys.start, x, ys.end, "plot-grid"))
        out.append(_text(x, ys.start + 18, _tick_label(tick), "plot-tick", "middle"))
    for tick in _log_ticks(ys.lo, ys.hi):
        y = ys(tick)
        out.append(_line(xs.start, y, xs.end, y, "plot-grid"))
        out.append(_text(xs.start - 8, y + 4, _tick_label(tick), "plot-tick", "end"))
    out.append(f'<rect x="{_fmt(xs.start)}" y="{_fmt(ys.end)}" width="{_fmt(xs.end - xs.start)}" '
               f'height="{_fmt(ys.start - ys.end)}" class="plot-frame"/>')
    out.append(_text((xs.start + xs.end) / 2, ys.start + 40, x_label, "plot-label", "middle"))
    cy = (ys.start + ys.end) / 2
    out.append(_text(18, cy, y_label, "plot-label", "middle", f' transform="rotate(-90 18 {_fmt(cy)})"'))
    return out


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Rooflines
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkPoint:
    """One forward step of a model: its FLOPs and the HBM bytes it must move. Derived, not measured."""

    phase: str  # "prefill" or "decode"
    batch: int
    tokens: int  # context length per sequence
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def label(self) -> str:
        return f"{self.phase} B={self.batch}"


def work_points(model, context: int, decode_batches: Iterable[int], prefill_batches: Iterable[int],
                kv_bytes_per_token: int) -> list[WorkPoint]:
    """FLOPs and bytes of decode and prefill steps of a dense model, at batch B and context L.

    Matmuls: 2 FLOPs per parameter per token (multiply and add). Attention, per
    layer and query head: QK^T and PV are 2 * d FLOPs each per (query, key) pair;
    a decode token attends to L keys, a causal prefill of L tokens to L^2 / 2 pairs.
    Bytes: every step reads the weights once; decode reads B * L tokens of KV,
    prefill writes its B * L tokens of KV. Activations are left out (they stay
    far smaller than the weights at these sizes).
    """
    if model.moe is not None or model.mla is not None:
        raise PlotError(f"{model.name}: roofline points are derived for dense models only (no MoE, no MLA)")
    params, weights = model.params, model.weight_bytes
    attn_per_pair = 2 * 2 * model.head_dim * model.n_heads * model.n_layers  # QK^T + PV, all layers, all heads
    points = []
    for b in decode_batches:
        flops = b * (2 * params + attn_per_pair * context)
        points.append(WorkPoint("decode", b, context, flops, weights + b * context * kv_bytes_per_token))
    for b in prefill_batches:
        flops = b * (2 * params * context + attn_per_pair * context * context / 2)
        points.append(WorkPoint("prefill", b, context, flops, weights + b * context * kv_bytes_per_token))
    return points


def roofline_svg(gpu, model, points: list[WorkPoint]) -> str:
    """A log-log roofline of one GPU (bf16 and fp8 compute roofs) with the model's work points on it."""
    bw = gpu.hbm_bandwidth_tbps  # TB/s = TFLOP/s per (FLOP/byte)
    peak = gpu.dense_tflops["bf16"]
    peak8 = gpu.dense_tflops.get("fp8")
    width, height = 720, 430
    xs = Scale(0.5, 20000, 80, width - 24, log=True)
    ys = Scale(0.5, 10 ** math.ceil(math.log10((peak8 or peak) * 1.5)), height - 62, 16, log=True)
    body = _log_axes(xs, ys, "arithmetic intensity (FLOP per byte moved)", "attainable TFLOP/s")

    def roof(top: float, kind: str, name: str) -> None:
        ridge = top / bw
        x0, y0, xr, yr = xs(xs.lo), ys(bw * xs.lo), xs(ridge), ys(top)
        path = f"M{_fmt(x0)},{_fmt(y0)} L{_fmt(xr)},{_fmt(yr)} L{_fmt(xs(xs.hi))},{_fmt(yr)}"
        body.append(f'<path d="{path}" class="plot-roof plot-roof--{kind}"/>')
        body.append(f'<circle cx="{_fmt(xr)}" cy="{_fmt(yr)}" r="4" class="plot-ridge plot-ridge--{kind}"/>')
        # Up and left of the ridge, where the slope below leaves the space empty.
        body.append(_text(xs(ridge) - 8, ys(top) - 8, f"{name} {top:,.0f} TFLOP/s, ridge {ridge:,.0f} FLOP/B",
                          "plot-note", "end"))

    if peak8:
        roof(peak8, "fp8", "fp8 dense")
    roof(peak, "bf16", "bf16 dense")
    # The bandwidth slope, labelled along its length.
    lx = 2.0
    angle = -math.degrees(math.atan2(ys(bw * lx * 4) - ys(bw * lx), xs(lx * 4) - xs(lx)))
    body.append(_text(xs(lx), ys(bw * lx) - 8, f"HBM {bw:g} TB/s", "plot-note", "start",
                      f' transform="rotate({_fmt(-angle)} {_fmt(xs(lx))} {_fmt(ys(bw * lx) - 8)})"'))
    for i, p in enumerate(points):
        attained = min(peak, bw * p.intensity)
        x, y = xs(p.intensity), ys(attained)
        cls = f"plot-point plot-point--{p.phase}"
        body.append(f'<circle cx="{_fmt(x)}" cy="{_fmt(y)}" r="5.5" class="{cls}"><title>{_esc(p.label)}: '
                    f'{p.intensity:,.1f} FLOP/B, {attained:,.0f} TFLOP/s at the roof</title></circle>')
        # Below the roof is empty space: every label goes under its point.
        body.append(_text(x, y + 20, p.label, f"plot-point-label plot-point-label--{p.phase}", "middle"))
    title = f"Roofline of the {gpu.display_name} with {model.display_name} decode and prefill steps"
    return _svg(width, height, title, body, "plot--roofline")


def roofline_figure(gpu, model, context: int, decode_batches, prefill_batches, kv_bytes_per_token: int) -> str:
    points = work_points(model, context, decode_batches, prefill_batches, kv_bytes_per_token)
    bw, peak = gpu.hbm_bandwidth_tbps, gpu.dense_tflops["bf16"]
    rows = []
    for p in points:
        t_compute = p.flops / (peak * 1e12)
        t_memory = p.bytes / (bw * 1e12)
        bound = "memory" if t_memory > t_compute else "compute"
        rows.append([
            p.phase, f"{p.batch:,}", f"{p.batch:,} × {p.tokens:,}", _si(p.flops) + "FLOP", _si(p.bytes) + "B",
            f"{p.intensity:,.1f}", bound, f"{max(t_compute, t_memory) * 1e3:,.2f} ms",
        ])
    table = _table(["Step", "Batch", "Tokens", "FLOPs", "Bytes moved", "FLOP/byte", "Bound by",
                    "Time at the roof"], rows)
    caption = (
        f"<strong>{_esc(gpu.display_name)}</strong>: {bw:g} TB/s of HBM bandwidth, {peak:,g} dense bf16 "
        f"TFLOP/s (datasheet, <code>labs/data/gpus.yaml</code>). Points: {_esc(model.display_name)} in bf16 at "
        f"{context:,} tokens of context, <em>derived</em> from its config (FLOPs ÷ bytes moved), not measured."
    )
    return _figure(roofline_svg(gpu, model, points), caption, table)


# ---------------------------------------------------------------------------
# KV budget per model
# ---------------------------------------------------------------------------

BUDGET_SEGMENTS = (
    # (Budget field or key, legend label, css modifier)
    ("weights", "weights", "weights"),
    ("overhead", "activations, workspaces, CUDA graphs (estimated)", "overhead"),
    ("kv_pool", "KV pool", "kv"),
    ("headroom", "left out by gpu_memory_utilization", "headroom"),
)


def smallest_fitting_tp(budget_fn: Callable, model, gpu, max_model_len: int, choices=(1, 2, 4, 8)):
    """The budget at the smallest tensor-parallel size (of `choices`) at which one full request fits."""
    last_error = None
    for tp in choices:
        try:
            b = budget_fn(model, gpu, max_model_len, tensor_parallel_size=tp)
        except ValueError as err:  # TP that the heads do not divide
            last_error = err
            continue
        if b.error is None:
            return b
        last_error = b.error
    raise PlotError(f"{model.name} on {gpu.name}: no TP in {choices} fits one {max_model_len}-token request "
                    f"({last_error})")


def kv_budget_svg(budgets: list, model_names: dict[str, str]) -> str:
    """Stacked bars, one per model: where one GPU's memory goes, and the concurrency the KV pool buys."""
    row_h, top, left, right_label = 34, 44, 250, 110
    width = 760
    height = top + row_h * len(budgets) + 24
    total = max(b.total_memory for b in budgets)
    xs = Scale(0, total / GIB, left, width - right_label)
    body = []
    # Legend.
    lx = 20
    for _, label, mod in BUDGET_SEGMENTS:
        body.append(f'<rect x="{_fmt(lx)}" y="10" width="12" height="12" class="plot-seg plot-seg--{mod}"/>')
        body.append(_text(lx + 17, 21, label, "plot-note"))
        lx += 17 + 6.6 * len(label) + 16  # about 6.6 px per character at 12 px
    for tick in range(0, int(total / GIB) + 1, 20):
        x = xs(tick)
        body.append(_line(x, top - 6, x, height - 22, "plot-grid"))
        body.append(_text(x, height - 6, f"{tick} GiB", "plot-tick", "middle"))
    for i, b in enumerate(budgets):
        y = top + i * row_h
        values = {
            "weights": b.weights,
            "overhead": b.activation_peak + b.non_torch + b.cudagraph,
            "kv_pool": max(b.kv_pool, 0),
            "headroom": b.total_memory - b.requested_memory,
        }
        name = model_names[b.model] + (f" (TP={b.tensor_parallel_size})" if b.tensor_parallel_size > 1 else "")
        body.append(_text(left - 10, y + row_h / 2 + 4, name, "plot-tick", "end"))
        x = xs(0)
        for key, label, mod in BUDGET_SEGMENTS:
            w = xs(values[key] / GIB) - xs(0)
            body.append(f'<rect x="{_fmt(x)}" y="{_fmt(y + 5)}" width="{_fmt(max(w, 0))}" height="{row_h - 10}" '
                        f'class="plot-seg plot-seg--{mod}"><title>{_esc(label)}: {values[key] / GIB:,.1f} GiB'
                        f'</title></rect>')
            x += w
        body.append(_text(xs(b.total_memory / GIB) + 8, y + row_h / 2 + 4,
                          f"{b.max_concurrency:,.1f} requests", "plot-note"))
    return _svg(width, height, "Where one GPU's memory goes, per model, and how many full-length requests "
                "its KV pool holds", body, "plot--budget")


def kv_budget_figure(budgets: list, model_names: dict[str, str], gpu, max_model_len: int, vllm_version: str) -> str:
    rows = [[
        model_names[b.model], str(b.tensor_parallel_size), f"{b.weights / GIB:,.1f}",
        f"{(b.activation_peak + b.non_torch + b.cudagraph) / GIB:,.1f}", f"{b.kv_pool / GIB:,.1f}",
        f"{b.kv_bytes_per_token:,}", f"{b.max_concurrency:,.1f}",
    ] for b in budgets]
    table = _table(["Model", "TP", "Weights (GiB/GPU)", "Overhead (GiB, estimated)", "KV pool (GiB)",
                    "KV bytes/token/GPU", f"Max concurrency at {max_model_len:,}"], rows)
    caption = (
        f"One {_esc(gpu.display_name)} ({budgets[0].total_memory / GIB:,.1f} GiB as CUDA reports it) under vLLM "
        f"{vllm_version} defaults, each model at the smallest tensor-parallel size that fits one "
        f"{max_model_len:,}-token request. <em>Derived</em> by <code>labs.kv_sizing.budget</code>; the overhead "
        "terms are the lab's labelled estimates."
    )
    return _figure(kv_budget_svg(budgets, model_names), caption, table)


# ---------------------------------------------------------------------------
# Measured: the paged-attention kernel against the copy bandwidth
# ---------------------------------------------------------------------------


def paged_attention_svg(label: str, rows: list[dict]) -> str:
    """Per shape: the kernel's achieved TB/s and SDPA's, against the device's measured copy bandwidth."""
    copies = {r["run"]["copy_tb_s"] for r in rows}
    copy = max(copies)  # one run, one value; rows of several runs show the highest they were measured against
    row_h, top, left = 30, 40, 150
    width = 720
    height = top + row_h * len(rows) + 40
    hi = max([copy, *(r["tb_s"] for r in rows), *(r["kv_bytes"] / r["sdpa_time_us"] / 1e6 for r in rows)]) * 1.08
    xs = Scale(0, hi, left, width - 30)
    body = [
        f'<rect x="{left}" y="10" width="12" height="12" class="plot-seg plot-seg--kv"/>',
        _text(left + 17, 21, "paged kernel (Triton)", "plot-note"),
        f'<circle cx="{left + 186}" cy="16" r="5" class="plot-point plot-point--sdpa"/>',
        _text(left + 196, 21, "PyTorch SDPA, contiguous KV", "plot-note"),
    ]
    step = 0.5 if hi < 4 else 1
    tick = 0.0
    while tick <= hi:
        x = xs(tick)
        body.append(_line(x, top - 6, x, height - 34, "plot-grid"))
        body.append(_text(x, height - 20, f"{tick:g}", "plot-tick", "middle"))
        tick += step
    body.append(_text((xs.start + xs.end) / 2, height - 4, "achieved bandwidth, TB/s (KV bytes ÷ time)",
                      "plot-label", "middle"))
    for i, r in enumerate(rows):
        y = top + i * row_h
        sdpa = r["kv_bytes"] / r["sdpa_time_us"] / 1e6
        body.append(_text(left - 10, y + row_h / 2 + 4, r["shape"], "plot-tick", "end"))
        body.append(f'<rect x="{left}" y="{_fmt(y + 6)}" width="{_fmt(xs(r["tb_s"]) - left)}" height="{row_h - 12}" '
                    f'class="plot-seg plot-seg--kv"><title>{_esc(r["shape"])}: {r["tb_s"]:.2f} TB/s, '
                    f'{r["copy_fraction"]:.0%} of copy</title></rect>')
        body.append(f'<circle cx="{_fmt(xs(sdpa))}" cy="{_fmt(y + row_h / 2)}" r="5" class="plot-point '
                    f'plot-point--sdpa"><title>SDPA: {sdpa:.2f} TB/s</title></circle>')
    x = xs(copy)
    body.append(_line(x, top - 8, x, height - 34, "plot-roof plot-roof--copy"))
    body.append(_text(x - 4, top - 12, f"copy {copy:.2f} TB/s", "plot-note", "end"))
    return _svg(width, height, f"Paged decode kernel bandwidth per shape on {label}", body, "plot--paged")


def paged_attention_figures(gpu: str, path: Path | None = None, with_table: bool = True) -> str:
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
    rows = [[
        r["shape"], f"{r['batch']}", f"{r['context_len']:,}", f"{r['q_heads']}/{r['kv_heads']}",
        f"{r['kv_bytes'] / 2**20:,.1f}", f"{r['time_us']:,.1f}", f"{r['tb_s']:.2f}", f"{r['copy_fraction']:.0%}",
        f"{r['sdpa_time_us']:,.1f}",
    ] for r in shapes]
    table = _table(["Shape", "Batch", "Context", "Heads q/kv", "KV read (MiB)", "Kernel (µs)", "TB/s",
                    "of copy", "SDPA (µs)"], rows)
    runs = "; ".join(
        f"measured {_esc(run['date'])} (torch {_esc(run['torch'])}, Triton {_esc(run['triton'])}, "
        f"CUDA {_esc(run['cuda'])}), copy bandwidth in the same run {run['copy_tb_s']:.2f} TB/s"
        for run in m.runs)
    caption = f"<strong>{_esc(m.label)}</strong>, {runs}. Median of CUDA-graph replays with the L2 cleared."
    return _figure(paged_attention_svg(m.label, shapes), caption, table if with_table else "")


# ---------------------------------------------------------------------------
# The KV-cache calculator: data for docs/javascripts/kv-calculator.js
# ---------------------------------------------------------------------------


def calculator_data(specs, formula, memory_budget, vllm_version: str) -> dict:
    """Everything the in-page calculator needs, read from the same modules the Python lab uses.

    The calculator mirrors labs/kv_sizing/formula.py and memory_budget.budget in
    JavaScript; the numbers it starts from (geometry, memory sizes, vLLM's
    defaults, the estimates' constants) all come from here, so the data is typed
    once. Three values are exported already derived: a model's weight bytes
    (stated parameter count x bytes per parameter), a GPU's total memory as vLLM
    sees it (labs.specs `memory_bytes_budget`), and vLLM's per-GPU batch
    defaults (memory_budget.vllm_batch_defaults).
    """
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
