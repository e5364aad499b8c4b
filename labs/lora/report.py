"""The multi-LoRA lab's tables and plot for the site (torch-free).

macros.py registers `MACROS`. The timings come from labs/results/lora.json (measured by
`python -m labs.lora.bench --record`; "not recorded yet" until a GPU run); the adapter
sizes from the cost model (labs/roofline.py), computed when the page builds.
"""

from __future__ import annotations

from labs import roofline, specs
from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR
from labs.lora import lab

_COMMON = [Column("Layer", "layer", "`{}`"), Column("Rows T", "tokens", "{:,}"),
           Column("Adapters", "adapters", "{}"), Column("Rank", "rank", "{}"),
           Column("Base (µs)", "graph_base_us", "{:,.1f}"), Column("Loop (µs)", "graph_loop_us", "{:,.1f}"),
           Column("Segmented (µs)", "graph_segmented_us", "{:,.1f}"),
           Column("Loop overhead", "graph_loop_overhead", "{:.0%}"),
           Column("Segmented overhead", "graph_segmented_overhead", "{:.0%}"),
           Column("Eager segmented overhead", "segmented_overhead", "{:.0%}"),
           Column("Floor overhead (derived)", "floor_overhead", "{:.1%}")]
LORA = LabResults("lora", RESULTS_DIR / "lora.json", "python -m labs.lora.bench --out out/lora --record",
                  {"adapters": _COMMON, "ranks": _COMMON})


def lora_recorded(gpu: str) -> bool:
    return LORA.recorded(gpu)


def lora_env(gpu: str) -> str:
    return LORA.env_line(gpu)


def lora_date(gpu: str) -> str:
    """When the GPU's rows were measured (a date, or a range over several runs)."""
    return LORA.entry(gpu)["date"]


def lora_table(section: str, gpu: str, layer: str | None = None, tokens: int | None = None) -> str:
    """One sweep's measured rows (CUDA-graph replays; the eager overhead beside them)."""
    where = {k: v for k, v in (("layer", layer), ("tokens", tokens)) if v is not None}
    return LORA.table(section, gpu, where)


def lora_row(section: str, layer: str, tokens: int, adapters: int, rank: int, gpu: str) -> dict:
    """One measured row, for a page that quotes it (guard with lora_recorded)."""
    for r in LORA.rows(section, gpu):
        if (r["layer"], r["tokens"], r["adapters"], r["rank"]) == (layer, tokens, adapters, rank):
            return r
    raise ValueError(f"lora results: no {section} row {layer} T={tokens} n={adapters} r={rank}")


def lora_bytes_table(model: str = "llama-3.1-8b", gpu: str = "h200") -> str:
    """Adapter bytes per rank and target set beside the base weights (derived by the cost model)."""
    dep = roofline.deployment(model, gpu)
    sets = (("all seven projections", roofline.LORA_TARGETS), ("q_proj and v_proj", ("q_proj", "v_proj")))
    lines = ["| Rank | Targets | Adapter (MiB) | Of the base weights | Adapters in the base's bytes |",
             "| ---: | --- | ---: | ---: | ---: |"]
    for rank in (8, 16, 32, 64):
        for label, targets in sets:
            a = dep.lora_adapter(rank, targets)
            lines.append(f"| {rank} | {label} | {a.bytes / 2**20:,.1f} | {a.fraction:.2%} | {a.per_base:,} |")
    m = specs.get_model(model)
    return (f"{m.display_name}, {m.serving_dtype}, weights {dep.weight_bytes() / 2**30:,.1f} GiB "
            "(derived, `labs/roofline.py` `lora_adapter`):\n\n" + "\n".join(lines) + "\n")


def lora_allowed_ranks() -> str:
    """The --max-lora-rank values vLLM 0.33 accepts (MaxLoRARanks), from labs/data/vllm.yaml."""
    from labs import vllm_facts

    return ", ".join(str(r) for r in vllm_facts.arg("max_lora_rank")["choices"])


def lora_floor_overhead(layer: str, tokens: int, adapters: int, rank: int) -> float:
    """The cost model's LoRA floor over the base GEMM's floor for one projection (derived)."""
    return lab.floors(lab.Case("adapters", layer, tokens, adapters, rank))["floor_overhead"]


MACROS = [lora_recorded, lora_env, lora_date, lora_table, lora_row, lora_bytes_table, lora_allowed_ranks, lora_floor_overhead]


def lora_overhead_plot(page_url: str, gpu: str, layer: str = "q_proj") -> str:
    """LoRA time over base time against distinct adapters (rank 16), loop and segmented, per row count."""
    if not LORA.recorded(gpu):
        return LORA.missing()
    import plotting

    rows = [r for r in LORA.rows("adapters", gpu) if r["layer"] == layer]
    series, table = {}, []
    for tokens in (16, 256, 2048):
        for path, label in (("loop", "loop"), ("segmented", "segmented")):
            pts = sorted((r["adapters"], r[f"graph_{path}_overhead"]) for r in rows
                         if r["tokens"] == tokens and r.get(f"graph_{path}_overhead") is not None)
            if len(pts) < 2:
                continue
            name = f"{label}, T = {tokens:,}"
            series[name] = ([p[0] for p in pts], [100 * p[1] for p in pts])
            table += [[name, str(n), f"{v:.0%}"] for n, v in pts]
    n_in, n_out = lab.shape(layer)
    return plotting.lines(
        f"lora-overhead-{layer}", page_url, series, x_label="distinct adapters in the batch (log)",
        y_label="LoRA time / base time (%, log)", log_x=True, log_y=True,
        title=f"LoRA overhead over the base {layer} ({n_in:,} × {n_out:,}), rank {lab.SWEEP_RANK}, {gpu} (measured)",
        caption="The loop's cost grows with every adapter it launches for; the segmented path stays the same few "
                "launches (shrink and expand, plus a zero-fill when the shrink splits K) and grows only with the "
                "adapter bytes it reads. CUDA-graph replays, medians, L2 flushed.",
        table=plotting.markdown_table(["Series", "Adapters", "Overhead"], table), size=(6.4, 4.2))


MACROS += [lora_overhead_plot]
