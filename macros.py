"""Macros for the site's pages (mkdocs-macros-plugin, `module_name: macros`).

Pages never type a number that a data file holds: they call these macros, which
read the same files the labs read (labs/data/*.yaml through labs.specs and
labs.kv_sizing) and the vLLM facts file. Link macros resolve through the bank
and raise on an unknown id, so a page cannot ship a dead link.

Layout: data loading, then small helpers, then `define_env` registering the
public macros. Nothing here imports torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
sys.path.insert(0, str(ROOT))

import bank as bank_lib  # noqa: E402
from bank_render import rel_link  # noqa: E402

# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

def vllm_facts() -> dict[str, Any]:
    """The vLLM facts file (labs/data/vllm.yaml), through the labs' own loader."""
    import labs.vllm_facts

    return labs.vllm_facts.load()


# ---------------------------------------------------------------------------
# Helper functions
# ---------------------------------------------------------------------------


class MacroError(ValueError):
    """A macro called with a name the data files do not hold."""


def num(value: float, digits: int = 0) -> str:
    """Thousands separators and a fixed number of decimals: 131072 -> '131,072'."""
    return f"{value:,.{digits}f}"


def kib(n_bytes: float, digits: int = 0) -> str:
    return f"{num(n_bytes / 1024, digits)} KiB"


def mib(n_bytes: float, digits: int = 1) -> str:
    return f"{num(n_bytes / 2**20, digits)} MiB"


def gib(n_bytes: float, digits: int = 1) -> str:
    return f"{num(n_bytes / 2**30, digits)} GiB"


def gb(n_bytes: float, digits: int = 1) -> str:
    """Decimal gigabytes, the unit bandwidth and datasheets use: 15009849344 -> '15.0 GB'."""
    return f"{num(n_bytes / 1e9, digits)} GB"


def ms(seconds: float, digits: int = 2) -> str:
    return f"{num(seconds * 1e3, digits)} ms"


def sec(seconds: float, digits: int = 1) -> str:
    return f"{num(seconds, digits)} s"


def us(seconds: float, digits: int = 1) -> str:
    return f"{num(seconds * 1e6, digits)} µs"


def gflop(flops: float, digits: int = 1) -> str:
    return f"{num(flops / 1e9, digits)} GFLOP"


def tflop(flops: float, digits: int = 1) -> str:
    return f"{num(flops / 1e12, digits)} TFLOP"


def tbps(bytes_per_s: float, digits: int = 2) -> str:
    return f"{num(bytes_per_s / 1e12, digits)} TB/s"


def pct(fraction: float, digits: int = 0) -> str:
    """A fraction as a percentage: 0.934 -> '93%'."""
    return f"{num(fraction * 100, digits)}%"


def fit(count: float) -> str:
    """A count of things that must fit (requests, blocks, tokens): rounded down, never to nearest."""
    import math

    return num(math.floor(count + 1e-9))


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)  # Python spelling, as vLLM's Python API takes it
    if isinstance(value, dict):  # a config object's default, as its JSON flag takes it
        import json

        return json.dumps(value)
    return "None" if value is None else str(value)


# ---------------------------------------------------------------------------
# Macros
# ---------------------------------------------------------------------------


def define_env(env):
    def _page_uri() -> str:
        return env.page.file.src_uri

    def _bank() -> bank_lib.Bank:
        return bank_lib.get_bank(ROOT)

    @env.macro
    def lesson(lesson_id: str, text: str | None = None) -> str:
        """A link to a lesson by id (part-N/<slug>), titled with the lesson's title."""
        found = _bank().lessons.get(lesson_id)
        if found is None:
            raise MacroError(f"lesson('{lesson_id}'): no docs/lessons/{lesson_id}.md")
        return f"[{text or found.meta.title}]({rel_link(_page_uri(), found.src_uri)})"

    @env.macro
    def question(slug: str, text: str | None = None) -> str:
        """A link to a bank question by slug, titled with the question."""
        found = _bank().questions.get(slug)
        if found is None:
            raise MacroError(f"question('{slug}'): no questions/part-N/{slug}.yaml")
        return f"[{text or found.q.title}]({rel_link(_page_uri(), found.src_uri)})"

    @env.macro
    def modules_summary() -> str:
        """How many modules have lessons, counted from the lessons (docs/.hooks/sections.py)."""
        import sections

        return sections.module_summary(_bank()).sentence

    @env.macro
    def page_link(uri: str, text: str) -> str:
        """A link to a hand-written page by its path under docs/ (and #anchor), checked to exist.

        The anchor is checked by the strict build (validation.anchors)."""
        path, _, anchor = uri.partition("#")
        if not (ROOT / "docs" / path).is_file():
            raise MacroError(f"page_link('{uri}'): docs/{path} does not exist")
        return f"[{text}]({rel_link(_page_uri(), path)}{'#' + anchor if anchor else ''})"

    env.macro(lambda name: _specs().get_model(name), "model")
    env.macro(lambda name: _specs().get_gpu(name), "gpu")
    env.macro(kv_bytes_per_token)
    env.macro(bytes_per_block)
    for fn in (num, kib, mib, gib, gb, sec, ms, us, gflop, tflop, tbps, pct, fit):
        env.macro(fn)
        env.filter(fn)
    register_cost_macros(env)
    register_plot_macros(env)
    register_vllm_macros(env)
    register_lab_reports(env)
    register_worked_examples(env)


# ---------------------------------------------------------------------------
# Lab-backed numbers (labs.specs and labs.kv_sizing are torch-free)
# ---------------------------------------------------------------------------


def _specs():
    import labs.specs

    return labs.specs


def kv_bytes_per_token(model_name: str, kv_dtype: str = "auto") -> int:
    """KV-cache bytes per token of a model from labs/data/models.yaml (the KV-sizing lab's formula)."""
    from labs.kv_sizing.formula import kv_bytes_per_token as formula

    return formula(_specs().get_model(model_name), kv_dtype)


def bytes_per_block(model_name: str, block_size: int | None = None, kv_dtype: str = "auto") -> int:
    from labs.kv_sizing.formula import bytes_per_block as formula

    import labs.vllm_facts

    size = block_size if block_size is not None else labs.vllm_facts.resolved_default("block_size")
    return formula(_specs().get_model(model_name), size, kv_dtype)


NUMBERS_GPUS = ("a100-80gb", "h100-sxm", "h200", "b200")


def numbers_table(gpu: str, max_model_len: int = 8192, context: int = 1024, models: list[str] | None = None) -> str:
    """The "numbers to know" rows of one GPU: every model at the fewest GPUs that hold one request (labs.roofline)."""
    from labs import roofline

    specs = _specs()
    g = specs.get_gpu(gpu)
    upper = g.memory_mib_cuda is None
    mark = "≤ " if upper else ""
    lines = ["| Model | TP to fit | Weights per GPU | KV per token per GPU | Decode floor, B = 1 | "
             "Ridge, prefill tokens | KV pool per GPU | Tokens in pool (vLLM's log) | Requests at full L |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in models or list(specs.all_models()):
        m = specs.get_model(name)
        d = roofline.smallest_tp(m, g, max_model_len)
        if d is None:
            lines.append(f"| {m.display_name} | > 8 | | | | | | | |")
            continue
        pool = d.kv_pool(max_model_len)
        lines.append(
            f"| {m.display_name} | {d.tp} | {gib(d.weight_bytes())} | {kib(d.kv_bytes_per_token(), 0)} "
            f"| {ms(d.decode(1, context).floor_s)} | {num(d.ridge().prefill_tokens)} "
            f"| {mark}{gib(pool.kv_pool)} | {mark}{num(pool.kv_cache_tokens)} | {mark}{fit(pool.max_concurrency)} |")
    basis = (f"nvidia-smi's total ({num(g.memory_mib_reported)} MiB, reported in public logs): cudaMemGetInfo's, "
             "which vLLM budgets from, has not been measured on this GPU and is a few hundred MiB lower, so the "
             "pool columns (marked ≤) are upper bounds" if upper else
             f"the cudaMemGetInfo total measured on this project's {g.display_name} ({num(g.memory_mib_cuda)} MiB)")
    bw = roofline.bandwidth(g, "datasheet")
    lines += ["", f"{g.display_name}: {bw.label}, {num(g.dense_tflops['bf16'], 1)} TFLOP/s dense bf16"
                  + (f", {num(g.dense_tflops['fp8'])} fp8" if g.dense_tflops.get("fp8") else ", no fp8 tensor cores")
                  + f". Memory: {basis}. Decode floor: one sequence at {num(context)} tokens of context, datasheet "
                  f"bandwidth. Pool: vLLM {vllm_facts()['version']} defaults, max_model_len {num(max_model_len)}."]
    return "\n".join(lines)


def gpu_numbers_table(gpus: tuple[str, ...] = NUMBERS_GPUS) -> str:
    """Per GPU: the two bandwidths, the dense rates, the ridge point and the memory vLLM budgets from."""
    from labs import roofline

    specs = _specs()
    lines = ["| GPU | HBM bandwidth (datasheet) | Copy bandwidth (measured) | Dense bf16 | Dense fp8 "
             "| Ridge, bf16 | Memory vLLM budgets from |", "|---|---:|---:|---:|---:|---:|---|"]
    for name in gpus:
        g = specs.get_gpu(name)
        measured = (roofline.bandwidth(g, "measured").label if roofline.has_measured_bandwidth(g)
                    else "not measured")
        fp8 = f"{num(g.dense_tflops['fp8'])} TFLOP/s" if g.dense_tflops.get("fp8") else "none"
        ridge = roofline.deployment("llama-3.1-8b", g).ridge().flop_per_byte
        memory = (f"{mib(g.memory_bytes_budget, 0)} (cudaMemGetInfo, measured)" if g.memory_mib_cuda else
                  f"≤ {mib(g.memory_bytes_budget, 0)} (nvidia-smi's; cudaMemGetInfo's not measured)")
        lines.append(f"| {g.display_name} | {g.hbm_bandwidth_tbps:g} TB/s | {measured} "
                     f"| {num(g.dense_tflops['bf16'], 1)} TFLOP/s | {fp8} | {num(ridge)} FLOP/byte | {memory} |")
    return "\n".join(lines)


def model_numbers_table(gpu: str = "h200") -> str:
    """Per model, whole model on one rank: parameters, weight bytes, KV bytes per token, prefill and decode work."""
    from labs import roofline

    specs = _specs()
    lines = ["| Model | Parameters (total / active; active excludes the input embedding) | Weights | KV per token, bf16 / fp8 | Matmul FLOPs per decode token "
             "| Attention |", "|---|---:|---:|---:|---:|---|"]
    for name, m in specs.all_models().items():
        d = roofline.deployment(m, gpu)
        split = d.params
        active = f" / {num(split.active / 1e9, 1)}B" if m.moe is not None else ""
        kv8 = roofline.deployment(m, gpu, kv_dtype="fp8").kv_bytes_per_token()
        lines.append(f"| {m.display_name} | {num(m.params / 1e9, 1)}B{active} "
                     f"| {gb(d.weight_bytes())} ({m.weight_dtype or m.serving_dtype}) "
                     f"| {kib(d.kv_bytes_per_token(), 0)} / {kib(kv8, 0)} | {gflop(d.decode(1, 0).flops)} "
                     f"| {m.attention.upper()}" + (", sliding window" if m.sliding_window else "") + " |")
    return "\n".join(lines)


def register_cost_macros(env) -> None:
    """The cost model (labs/roofline.py) for pages: every FLOP, byte, floor, ridge and pool a page shows.

        {% set d = cost("llama-3.1-70b", "h100-sxm", tp=4) %}
        {{ d.decode(64, 1024).floor_s | ms }}, ridge {{ d.ridge().prefill_tokens | num }} tokens,
        pool {{ d.kv_pool(8192).kv_pool | gib }}

    `bandwidth="measured"` uses the copy bandwidth the labs recorded on that GPU
    instead of the datasheet's; a page says which one its number uses.
    """
    from labs import roofline

    @env.macro
    def cost(model: str = "llama-3.1-8b", gpu: str = "h200", tp: int = 1, kv_dtype: str = "auto",
             weight_dtype: str | None = None, bandwidth: str = "datasheet", gemm_tflops: float | None = None):
        try:
            return roofline.deployment(model, gpu, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype,
                                       bandwidth=bandwidth, gemm_tflops=gemm_tflops)
        except _specs().SpecError as err:
            raise MacroError(f"cost({model!r}, {gpu!r}): {err}") from None

    @env.macro
    def chunk(new: int, cached: int = 0, samples: bool = True):
        """One sequence's share of a mixed step, for cost(...).mixed([...])."""
        return roofline.Chunk(new, cached, samples)

    @env.macro
    def smallest_tp(model: str, gpu: str, max_model_len: int, **fields):
        """The cost(...) deployment with the fewest GPUs whose KV pool holds one max_model_len request, or None."""
        return roofline.smallest_tp(_specs().get_model(model), _specs().get_gpu(gpu), max_model_len, **fields)

    @env.macro
    def spec_step(model: str = "llama-3.1-8b", gpu: str = "h200", drafter: str = "eagle", alpha: float = 0.7,
                  k: int = 3, batch: int = 1, context: int = 1024) -> dict:
        """One speculative-decoding step against a plain decode step, both costed by the cost model."""
        from labs.serving_sim import spec_decode
        from labs.serving_sim.cost import Chunk, Roofline

        target = Roofline(_specs().get_model(model), _specs().get_gpu(gpu))
        draft = spec_decode.make_drafter(drafter, target)
        base = target.decode_step_time(batch, context)
        verify = target.step_time([Chunk(k + 1, context)] * batch)
        draft_s = draft.time(batch, context)
        expected = spec_decode.expected_tokens(alpha, k)
        return {
            "expected_tokens": expected, "draft_acceptance_rate": spec_decode.draft_acceptance_rate(alpha, k),
            "mean_accepted": expected - 1, "draft_ratio": spec_decode.draft_cost_ratio(target, draft, batch, context),
            "speedup": spec_decode.speedup(target, draft, alpha, k, batch, context),
            "base_s": base, "verify_s": verify, "draft_s": draft_s,
            "verify_tokens": batch * (k + 1), "verify_only_speedup": expected * base / verify,
            "user_tokens_per_s": 1 / base, "spec_user_tokens_per_s": expected / (k * draft_s + verify),
            "layer_params": target.body_params // target.model.n_layers, "lm_head_params": target.lm_head_params,
        }

    @env.macro
    def spec_alpha(mean_accepted: float, k: int) -> float:
        """The per-position acceptance rate that gives `mean_accepted` accepted drafts per step (i.i.d. model)."""
        from labs.serving_sim import spec_decode

        return spec_decode.alpha_from_mean_accepted(mean_accepted, k)

    @env.macro
    def float_formats() -> list:
        """The float formats labs/number_formats.py rounds to, with their range and precision."""
        from labs import number_formats

        return [f for f in number_formats.FORMATS if isinstance(f, number_formats.FloatFormat)]

    @env.macro
    def blocks(model: str, tokens: int, block_size: int | None = None) -> int:
        """Blocks one request of `tokens` tokens holds (labs/kv_sizing/formula.py blocks_per_request)."""
        from labs.kv_sizing import formula

        m = _specs().get_model(model)
        return formula.blocks_per_request(m, tokens, block_size or formula.default_block_size(m))

    @env.macro
    def design(name: str):
        """A worked system design of labs/design.py (chat, lora, rag): every figure from the cost model."""
        from labs import design as designs

        try:
            return designs.design(name)
        except designs.DesignError as err:
            raise MacroError(str(err)) from None

    @env.macro
    def design_assumptions():
        """The GPU-hour prices and network bandwidth the designs assume (labs/data/design.yaml)."""
        from labs import design as designs

        return designs.assumptions()

    env.macro(numbers_table)
    env.macro(gpu_numbers_table)
    env.macro(model_numbers_table)


def register_lab_reports(env) -> None:
    """Register the macros each lab offers for its page: `MACROS` in labs/<lab>/report.py.

    A lab's page shows its recorded results through functions that live beside the lab
    (torch-free, returning Markdown), so the lab owns how its results read and a new lab
    needs no edit here. A name registered twice is an error, not a silent override.
    """
    import importlib

    seen: dict[str, str] = {}
    for report in sorted((ROOT / "labs").glob("*/report.py")):
        module = importlib.import_module(f"labs.{report.parent.name}.report")
        for fn in getattr(module, "MACROS", []):
            if fn.__name__ in seen or fn.__name__ in env.macros:
                raise MacroError(f"macro '{fn.__name__}' from {report} is already defined "
                                 f"({seen.get(fn.__name__, 'macros.py')})")
            seen[fn.__name__] = str(report.relative_to(ROOT))
            env.macro(fn)


def register_worked_examples(env) -> None:
    """Register every worked example of labs/worked (its modules' `EXAMPLES`) under its own name.

    A lesson's worked example quotes figures a page must not compute; labs/worked computes
    them from the cost model and the specs. A name registered twice is an error."""
    from labs import worked

    for module, fn in worked.examples():
        if fn.__name__ in env.macros:
            raise MacroError(f"worked example '{fn.__name__}' from {module} is already a macro")
        env.macro(fn)


# --- plots and calculator (begin) ---
# Figures drawn through matplotlib from the cost model and lab results, and the
# in-page KV-cache calculator. The drawing lives in docs/.hooks/plots.py (on
# docs/.hooks/plotting.py); these wrappers only check the names and call it.


def register_plot_macros(env) -> None:
    import plots
    from labs.kv_sizing import formula, memory_budget

    def _model(name: str):
        try:
            return _specs().get_model(name)
        except _specs().SpecError as err:
            raise MacroError(str(err)) from None

    def _gpu(name: str):
        try:
            return _specs().get_gpu(name)
        except _specs().SpecError as err:
            raise MacroError(str(err)) from None

    from labs import roofline

    def _url() -> str:
        return env.page.url

    def _checked(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (plots.PlotError, _specs().SpecError) as err:
            raise MacroError(str(err)) from None

    @env.macro
    def roofline_svg(gpu: str, model: str = "llama-3.1-8b", context: int = 2048,
                     decode_batches=(1, 256), prefill_batches=(1, 8)) -> str:
        """One GPU's roofline with a dense model's decode and prefill steps on it (cost model, derived)."""
        _model(model), _gpu(gpu)
        return _checked(plots.roofline_figure, roofline, _url(), model, gpu, context, tuple(decode_batches),
                        tuple(prefill_batches))

    @env.macro
    def engine_decode_plot(gpu: str) -> str:
        """The engine's measured decode step against batch, per context, with the cost model's floors."""
        from labs.engine.report import ResultsError

        try:
            return plots.engine_decode_figure(_url(), gpu)
        except (plots.PlotError, ResultsError) as err:
            raise MacroError(str(err)) from None

    @env.macro
    def server_knee_plot(mode: str, gpu: str = "H200") -> str:
        """The recorded server sweep: throughput and p99 latency against load, with the knee."""
        from labs.loadgen.report import ReportError

        try:
            return plots.server_knee_figure(_url(), mode, gpu)
        except (plots.PlotError, ReportError) as err:
            raise MacroError(str(err)) from None

    @env.macro
    def rooflines(model: str = "llama-3.1-8b", context: int = 2048, heading: str = "###") -> str:
        """A roofline per GPU of labs/data/gpus.yaml, each under its own heading."""
        return "\n".join(f"{heading} {g.display_name}\n\n" + roofline_svg(name, model, context)
                         for name, g in _specs().all_gpus().items())

    @env.macro
    def kv_budget_plot(gpu: str = "h200", max_model_len: int = 8192, models: list[str] | None = None) -> str:
        """Where one GPU's memory goes for each model (cost model kv_pool), at the smallest TP that fits."""
        _gpu(gpu)
        names = list(models or _specs().all_models())
        for name in names:
            _model(name)
        return _checked(plots.kv_budget_figure, roofline, _url(), gpu, max_model_len, names,
                        vllm_facts()["version"])

    @env.macro
    def roofline_lab_plot(gpu: str) -> str:
        """The roofline lab's measured GEMM and attention points on the GPU's roofline (labs/results/)."""
        from labs.roofline_lab.report import roofline_lab_plot as plot

        return plot(gpu, _url())

    @env.macro
    def paged_attention_plot(gpu: str, table: bool = True) -> str:
        """The named GPU's paged-kernel bandwidth per shape against its copy bandwidth (labs/results/)."""
        return plots.paged_attention_figures(_url(), gpu, with_table=table)

    @env.macro
    def long_context_score_plot(model: str = "llama-3.1-8b") -> str:
        """The illustrative RoPE score against distance under each scaling rule (labs/long_context, derived)."""
        from labs.long_context.plots import score_plot

        return score_plot(_url(), model)

    @env.macro
    def long_context_stretch_plot(model: str = "llama-3.1-8b") -> str:
        """How much each scaling rule slows every rotary pair (labs/long_context, derived)."""
        from labs.long_context.plots import stretch_plot

        return stretch_plot(_url(), model)

    @env.macro
    def long_context_decode_plot(gpu: str) -> str:
        """Measured decode attention time against context with the paged kernel (labs/results/long_context.json)."""
        from labs.long_context.plots import decode_plot

        return decode_plot(_url(), gpu)

    @env.macro
    def fleet_plot(kind: str) -> str:
        """The fleet simulator's autoscalers over the day: ready replicas or requests waiting (labs/results/)."""
        from labs.fleet.report import FleetResultsError

        try:
            return plots.fleet_figure(_url(), kind)
        except (plots.PlotError, FleetResultsError) as err:
            raise MacroError(str(err)) from None

    @env.macro
    def kv_calculator(model: str = "llama-3.1-8b", gpu: str = "h200", max_model_len: int = 8192) -> str:
        """The in-page KV-cache calculator, with the data files inlined for it."""
        facts = vllm_facts()
        data = plots.calculator_data(_specs(), formula, memory_budget, facts["version"], facts)
        return plots.calculator_html(data, model, gpu, max_model_len)


# --- plots and calculator (end) ---


# --- vLLM facts (begin) ---
# Every vLLM name a page states (flag, default, metric, endpoint, environment
# variable, request field, method) goes through these macros, which read
# labs/data/vllm.yaml via labs.vllm_facts. An unknown name fails the build with
# the closest known names; a removed one is refused unless written through
# removed(). Each rendered name links to its row on the reference page, whose
# tables vllm_facts_table() generates from the same file.

VLLM_FACTS_PAGE = "reference/vllm-facts.md"

# Reference-page table per kind: (facts section, anchor prefix, table title).
VLLM_FACT_KINDS = {
    "engine_args": ("engine_args", "arg", "Engine arguments"),
    "server_args": ("server_args", "arg", "Server arguments"),
    "bench_args": ("bench_args", "bench", "Benchmark arguments"),
    "batch_defaults": ("batch_defaults", "batch", "Batch defaults by GPU and entry point"),
    "metrics": ("metrics", "metric", "Prometheus metrics"),
    "endpoints": ("endpoints", "endpoint", "HTTP endpoints"),
    "env_vars": ("env_vars", "env", "Environment variables"),
    "request_fields": ("request_fields", "field", "Request fields"),
    "speculative_methods": ("speculative_methods", "spec", "Speculative-decoding methods"),
    "quantization_methods": ("quantization_methods", "quant", "Quantization methods"),
    "structured_output_backends": ("structured_output_backends", "so", "Structured-output backends"),
    "kernel_constants": ("kernel_constants", "const", "Kernel constants"),
    "removed": ("removed", "removed", "Removed names"),
}


def vllm_anchor(kind: str, name: str) -> str:
    """The id of a name's row on the reference page: `arg-gpu-memory-utilization`, `metric-kv-cache-usage-perc`."""
    prefix = VLLM_FACT_KINDS[kind][1]
    slug = name.removeprefix("vllm:").removeprefix("--").lower()
    slug = "".join(c if c.isalnum() else "-" for c in slug).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return f"{prefix}-{slug or 'root'}"


def _cell(value: Any) -> str:
    """A value as a table cell: code-formatted, pipes escaped, None spelled as Python does."""
    if isinstance(value, float) and value == float("inf"):
        text = "inf"
    elif isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value) if value else "`[]`"
    elif isinstance(value, dict):
        return "; ".join(f"{k}: {_cell(v)}" for k, v in value.items())
    else:
        text = _fmt_value(value)
    return "`" + text.replace("|", "\\|") + "`"


def _prose(text: Any) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _row_id(kind: str, name: str) -> str:
    return f'<span id="{vllm_anchor(kind, name)}"></span>'


def _args_table(section: str, kind: str) -> str:
    from labs import vllm_facts as facts

    lines = ["| Flag | Default | What it does, what vLLM uses when it is not given, and where |", "|---|---|---|"]
    for name, entry in facts.section(section).items():
        flags = "<br>".join(_cell(f) for f in [entry["flag"], *entry.get("aliases", [])])
        if entry.get("hidden_aliases"):
            flags += "<br>accepted, not in `--help`: " + ", ".join(_cell(f) for f in entry["hidden_aliases"])
        details = [_prose(entry["meaning"])] if entry.get("meaning") else []
        if "resolved" in entry:
            target = entry.get("resolved_for")
            where = ""
            if target:
                gpu = _specs().get_gpu(target["gpu"]).display_name
                where = f" for `{target.get('entry', 'vllm serve')}` on an {gpu}"
            details.append(f"**When not given:** {_cell(entry['resolved'])}{where}. {_prose(entry.get('resolved_how'))}")
        elif entry.get("resolved_how"):
            details.append(f"**When not given:** {_prose(entry['resolved_how'])}")
        if "llm_default" in entry:
            details.append(f"The `LLM` class passes {_cell(entry['llm_default'])} unless told otherwise.")
        details.append(f"Python name `{name}`. Source: {_prose(entry.get('source'))}")
        lines.append(f"| {_row_id(kind, entry['flag'])}{flags} | {_cell(entry['default'])} | {'<br>'.join(details)} |")
    return "\n".join(lines)


def _bench_table() -> str:
    from labs import vllm_facts as facts

    blocks = []
    for command, bench in facts.section("bench_args").items():
        engine = " It also takes every engine argument." if bench.get("engine_flags") else ""
        lines = [f"`vllm bench {command}` ({_prose(bench['source'])}).{engine}", "",
                 "| Flag | Default | Meaning |", "|---|---|---|"]
        for flag, entry in bench["flags"].items():
            lines.append(f"| {_row_id('bench_args', command + ' ' + flag)}`{flag}` | {_cell(entry['default'])} "
                         f"| {_prose(entry.get('meaning'))} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _batch_table() -> str:
    from labs import vllm_facts as facts

    table = facts.section("batch_defaults")
    lines = ["| Total GPU memory (driver-reported) | Excluded | `vllm serve`: tokens, seqs | `LLM` class: tokens, seqs |",
             "|---|---|---|---|"]
    for tier in table["tiers"]:
        excluded = ", ".join([*tier.get("exclude_device_names", []), *(f"capability {c}" for c in
                                                                        tier.get("exclude_capabilities", []))])
        serve, llm = tier["OPENAI_API_SERVER"], tier["LLM_CLASS"]
        lines.append(f"| {_row_id('batch_defaults', str(tier['min_memory_gib']))}at least {tier['min_memory_gib']} GiB "
                     f"| {excluded or '-'} | {num(serve['max_num_batched_tokens'])}, {serve['max_num_seqs']} "
                     f"| {num(llm['max_num_batched_tokens'])}, {llm['max_num_seqs']} |")
    fb = table["fallback"]
    lines.append(f"| any other entry point | - | {num(fb['max_num_batched_tokens'])}, {fb['max_num_seqs']} | |")
    return "\n".join(lines) + f"\n\nSource: {_prose(table['source'])}."


def _named_table(section: str, kind: str, columns: list[tuple[str, str]]) -> str:
    from labs import vllm_facts as facts

    header = "| Name | " + " | ".join(title for title, _ in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for name, entry in facts.section(section).items():
        cells = []
        for _, key in columns:
            value = entry.get(key)
            if key in ("meaning", "source", "note", "when", "replaced_by", "evidence"):
                cells.append(_prose(value))
            elif key == "api_key":
                cells.append("yes" if value else "no")
            elif key == "requires":
                cells.append("; ".join(f"{k} {_cell(v)}" for k, v in value.items()) if value else "always")
            elif key == "defaults":
                cells.append("; ".join(f"{cls}: {_cell(v)}" for cls, v in (value or {}).items()))
            else:
                cells.append(_cell(value) if value is not None else "")
        lines.append(f"| {_row_id(kind, name)}`{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def vllm_facts_table(kind: str) -> str:
    """One section of labs/data/vllm.yaml as a Markdown table, one anchored row per name."""
    if kind not in VLLM_FACT_KINDS:
        raise MacroError(f"vllm_facts_table('{kind}'): kinds are {sorted(VLLM_FACT_KINDS)}")
    if kind in ("engine_args", "server_args"):
        return _args_table(kind, kind)
    if kind == "bench_args":
        return _bench_table()
    if kind == "batch_defaults":
        return _batch_table()
    columns = {
        "metrics": [("Type", "type"), ("Labels", "labels"), ("Only with", "when"), ("Meaning", "meaning"),
                    ("Source", "source")],
        "endpoints": [("Methods", "methods"), ("API key", "api_key"), ("Registered", "requires"),
                      ("Meaning", "meaning"), ("Source", "source")],
        "env_vars": [("Default", "default"), ("Meaning", "meaning"), ("Source", "source")],
        "request_fields": [("Default by class", "defaults"), ("Meaning", "meaning")],
        "speculative_methods": [("Meaning", "meaning"), ("Source", "source")],
        "quantization_methods": [("Meaning", "meaning"), ("Source", "source")],
        "structured_output_backends": [("Meaning", "meaning"), ("Source", "source")],
        "kernel_constants": [("Value", "value"), ("Meaning", "meaning"), ("Source", "source")],
        "removed": [("Kind", "kind"), ("Removed in", "removed_in"), ("What it was", "note"),
                    ("Use instead", "replaced_by"), ("Evidence", "evidence")],
    }[kind]
    table = _named_table(VLLM_FACT_KINDS[kind][0], kind, columns)
    if kind == "endpoints":
        guarded = facts_section("api_key_prefixes")
        prefixes = ", ".join(f"`{p}`" for p in guarded.get("prefixes", []))
        table = (f"The API key guards exactly the paths that start with {prefixes} "
                 f"({_prose(guarded.get('source'))}).\n\n{table}")
    if kind == "request_fields":
        classes = facts_section("request_classes")
        table += "\n\nSources: " + "; ".join(_prose(c["source"]) for c in classes.values()) + "."
    return table


def facts_section(name: str) -> dict[str, Any]:
    from labs import vllm_facts as facts

    return facts.section(name)


def register_vllm_macros(env) -> None:
    from labs import vllm_facts as facts

    def _checked(lookup, *args):
        try:
            return lookup(*args)
        except facts.FactError as err:
            raise MacroError(str(err)) from None

    def _link(text: str, kind: str, name: str) -> str:
        page = env.page.file.src_uri if env.page is not None else ""
        target = "" if page == VLLM_FACTS_PAGE else rel_link(page, VLLM_FACTS_PAGE)
        return f"[{text}]({target}#{vllm_anchor(kind, name)})"

    @env.macro
    def flag(name: str) -> str:
        """`--flag` linked to its reference row, with the default vLLM uses when it is not given."""
        entry = _checked(facts.arg, name)
        kind = _checked(facts.arg_section, name)
        link = _link(f"`{entry['flag']}`", kind, entry["flag"])
        version = facts.version()
        value = _checked(facts.resolved_default, name)
        target = entry.get("resolved_for")
        if target:
            gpu = _specs().get_gpu(target["gpu"]).display_name
            return (f"{link} (default `{_fmt_value(value)}` for `{target.get('entry', 'vllm serve')}` on an {gpu} "
                    f"in vLLM {version}; it depends on the GPU)")
        return f"{link} (default `{_fmt_value(value)}` in vLLM {version})"

    @env.macro
    def default(name: str) -> Any:
        """The value vLLM uses when the argument is not given (engine or server argument)."""
        return _checked(facts.resolved_default, name)

    @env.macro
    def metric(name: str) -> str:
        """`vllm:<name>` (or its _total/_bucket/... exposition form), checked and linked."""
        base, _ = _checked(facts.metric, name)
        return _link(f"`{name}`", "metrics", base)

    @env.macro
    def endpoint(path: str, method: bool = False) -> str:
        """An HTTP path of `vllm serve`, checked and linked; `method=True` prefixes its first method."""
        key, entry = _checked(facts.endpoint, path)
        text = f"{entry['methods'][0]} {path}" if method else path
        return _link(f"`{text}`", "endpoints", key)

    @env.macro
    def env_var(name: str) -> str:
        _checked(facts.env_var, name)
        return _link(f"`{name}`", "env_vars", name)

    @env.macro
    def request_field(name: str) -> str:
        _checked(facts.request_field, name)
        return _link(f"`{name}`", "request_fields", name)

    @env.macro
    def vllm_name(kind: str, name: str) -> str:
        """A speculative method, quantization method or structured-output backend, checked and linked."""
        _checked(facts.named, kind, name)
        return _link(f"`{name}`", kind + "s", name)

    @env.macro
    def vllm_constant(name: str) -> int | float:
        """A constant of vLLM's kernels (`MIN_LAUNCH_GRID_SIZE_2D`), checked against the facts file."""
        return _checked(facts.kernel_constant, name)

    @env.macro
    def batch_default(name: str, gpu: str = "h200", entry: str = "vllm serve") -> int:
        """max_num_batched_tokens or max_num_seqs as vLLM picks it for this GPU and entry point."""
        return _checked(facts.gpu_batch_default, name, _specs().get_gpu(gpu), entry)

    @env.macro
    def removed(name: str, version: str | None = None, note: str | None = None) -> str:
        """A deliberate mention of a name vLLM dropped: ~~`--swap-space`~~ (removed in vLLM 0.18.0)."""
        entry = _checked(facts.removed, name)
        known = entry.get("removed_in")
        if version is not None and str(version) != str(known):
            raise MacroError(f"removed('{name}', '{version}'): labs/data/vllm.yaml says it was removed in "
                             f"{known or 'an unknown version'}; fix the call or the file (with evidence)")
        when = f"removed in vLLM {known}" if known else f"gone by vLLM {facts.version()}"
        text = f"~~`{name}`~~ ({_link(when, 'removed', name)})"
        return f"{text}: {note}" if note else text

    env.macro(vllm_facts_table)
    env.macro(lambda: facts.version(), "vllm_version")


# --- vLLM facts (end) ---
