"""The long-context lab for the site (torch-free): RoPE tables and figures, the KV wall, the decode bench.

macros.py registers `MACROS` (tables and numbers) and wraps the three figures, which need
the page's URL: `long_context_score_plot()`, `long_context_stretch_plot()` and
`long_context_decode_plot("H200")`. Every number comes from labs/long_context/rope.py, the
cost model (labs/roofline.py max_context, kv_pool) or labs/results/long_context.json.
"""

from __future__ import annotations

import math

from labs import roofline, specs
from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR
from labs.long_context import rope as R

RESULTS = LabResults(
    "long_context", RESULTS_DIR / "long_context.json", "python -m labs.long_context.decode_bench --out out/lc --record",
    {"decode": [Column("KV", "kv"), Column("B", "batch", "{:,}"), Column("L", "context", "{:,}"),
                Column("Time (µs)", "time_us", "{:,.1f}"), Column("KV read (MiB)", "kv_mib", "{:,.0f}"),
                Column("TB/s", "tb_s", "{:.2f}"), Column("Of copy", "of_copy", "{:.2f}"),
                Column("Cost model (µs)", "model_us", "{:,.1f}"), Column("Model ÷ time", "of_model", "{:.2f}"),
                Column("× 32 layers (ms)", "step_attention_ms", "{:.2f}")]},
)
MODEL = "llama-3.1-8b"
DISTANCES = tuple(sorted({int(round(2 ** (k / 4))) for k in range(0, 69)}))  # 1 .. 131,072, 4 per octave


def _rope(method: str, model: str = MODEL, factor: float | None = None) -> R.Rope:
    return R.for_model(method, specs.get_model(model), factor)


def rope_rule(method: str, model: str = MODEL, factor: float | None = None) -> dict:
    """One rule's summary on a model: pairs kept, pairs divided by s, reach, logit scale."""
    rp = _rope(method, model, factor)
    st = R.stretch(rp)
    kept = sum(1 for x in st if abs(x - 1) < 1e-9)
    full = sum(1 for x in st if abs(x - rp.factor) < 1e-9 * rp.factor)
    return {"method": method, "name": rp.name, "pairs": rp.pairs, "kept": kept, "full": full,
            "blended": rp.pairs - kept - full, "reach": R.reach(rp), "factor": rp.factor,
            "original_len": rp.original_len, "extended_len": int(rp.factor * rp.original_len),
            "logit_scale": R.logit_scale(rp), "partial_pairs": R.partial_pairs(rp),
            "unseen_at_max": R.unseen_pairs(rp, specs.get_model(model).max_position_embeddings)}


def rope_table(model: str = MODEL, positions=(16384, 65536, 131072)) -> str:
    """Markdown: per rule, pairs kept / blended / divided by s, reach, pairs outside trained angles at each position."""
    head = ["Rule", "Pairs kept", "Blended", "Divided by s", "In trained angles up to"] + [
        f"Unseen pairs at {p:,}" for p in positions]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for method in R.METHODS:
        r = rope_rule(method, model)
        rp = _rope(method, model)
        reach = "∞" if math.isinf(r["reach"]) else f"{r['reach']:,.0f}"
        cells = [r["name"], str(r["kept"]), str(r["blended"]), str(r["full"]), reach] + [
            str(R.unseen_pairs(rp, p)) for p in positions]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def score_series(model: str = MODEL) -> dict:
    return {_rope(m, model).name: (list(DISTANCES), [R.score(_rope(m, model), x) for x in DISTANCES])
            for m in R.METHODS}


def stretch_series(model: str = MODEL) -> dict:
    out = {}
    for m in R.METHODS:
        rp = _rope(m, model)
        out[rp.name] = (list(range(rp.pairs)), R.stretch(rp))
    return out


def kv_wall(model: str, gpu: str, kv_dtype: str = "auto", tp: int = 1, weight_dtype: str | None = None,
            requests: int = 1) -> roofline.KVWall:
    """The cost model's KV wall (labs/roofline.py max_context) for one deployment."""
    return roofline.deployment(model, gpu, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype).max_context(requests)


WALL_CASES = (("llama-3.1-8b", "l40s", 1, None), ("llama-3.1-8b", "h100-sxm", 1, None),
              ("llama-3.1-8b", "h200", 1, None), ("llama-3.1-70b", "h100-sxm", 1, "fp8"),
              ("llama-3.1-70b", "h200", 1, "fp8"), ("llama-3.1-70b", "h200", 2, None),
              ("gemma-3-12b", "h200", 1, None), ("qwen3-8b", "h100-sxm", 1, None))


def kv_wall_table(context: int = 131072) -> str:
    """Markdown: for each case, bf16 and fp8 KV: pool, longest single request, requests of `context` at once."""
    head = ["Model", "GPU", "TP", "Weights", "KV pool", "Positions", "Longest request, bf16 KV",
            "fp8 KV", f"{context:,}-token requests at once, bf16", "fp8"]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for model, gpu, tp, wd in WALL_CASES:
        cells = [specs.get_model(model).display_name, specs.get_gpu(gpu).display_name, str(tp)]
        walls, reqs = [], []
        for kv in ("auto", "fp8"):
            dep = roofline.deployment(model, gpu, tp=tp, kv_dtype=kv, weight_dtype=wd)
            w = dep.max_context()
            walls.append(w)
            reqs.append(dep.kv_pool(min(context, w.positions)).max_requests)
        cells.append(wd or roofline.deployment(model, gpu, tp=tp).model.serving_dtype)
        cells.append(f"{walls[0].kv_pool / 2**30:,.1f} GiB")
        cells.append(f"{walls[0].positions:,}")
        cells += [f"{w.tokens:,}" + (" (memory)" if w.bound == "memory" else "") for w in walls]
        ctx_note = "" if context <= walls[0].positions else f" (at {walls[0].positions:,})"
        cells += [f"{reqs[0]:,}{ctx_note}", f"{reqs[1]:,}{ctx_note}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The decode bench's recorded rows
# ---------------------------------------------------------------------------


def long_context_recorded(gpu: str) -> bool:
    return RESULTS.recorded(gpu)


def _rows(gpu: str) -> list[dict]:
    return [{**r, "kv_mib": r["kv_bytes"] / 2**20} for r in RESULTS.rows("decode", gpu)]


def long_context_table(gpu: str, kv: str | None = None, batch: int | None = None) -> str:
    """The recorded decode rows (optionally one KV dtype or batch), under the line saying where and when."""
    if not RESULTS.recorded(gpu):
        return RESULTS.missing()
    cols = RESULTS.columns["decode"]
    rows = [r for r in _rows(gpu) if (kv is None or r["kv"] == kv) and (batch is None or r["batch"] == batch)]
    lines = ["| " + " | ".join(c.header for c in cols) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(cols))) + " |"]
    for r in rows:
        lines.append("| " + " | ".join("—" if r.get(c.key) is None else c.fmt.format(r[c.key]) for c in cols) + " |")
    return RESULTS.env_line(gpu) + "\n\n" + "\n".join(lines) + "\n"


def long_context_row(kv: str, batch: int, context: int, gpu: str) -> dict:
    """One recorded decode row (kv "bf16" or "fp8")."""
    for r in _rows(gpu):
        if r["kv"] == kv and r["batch"] == batch and r["context"] == context:
            return r
    raise LookupError(f"long_context: no {kv} row at B = {batch}, L = {context}")


def long_context_ratio(gpu: str, kv: str, batch: int, long: int = 131072, short: int = 4096) -> float:
    """Measured time at `long` over time at `short` (same KV dtype and batch): how decode attention grows with L."""
    return long_context_row(kv, batch, long, gpu)["time_us"] / long_context_row(kv, batch, short, gpu)["time_us"]


def long_context_fp8_speedup(gpu: str, batch: int, context: int = 131072) -> float:
    """Measured bf16 time over fp8 time at one shape."""
    return long_context_row("bf16", batch, context, gpu)["time_us"] / long_context_row("fp8", batch, context, gpu)["time_us"]


def long_context_env(gpu: str) -> str:
    return RESULTS.env_line(gpu)


def decode_series(gpu: str) -> dict:
    series = {}
    for kv in ("bf16", "fp8"):
        for b in sorted({r["batch"] for r in _rows(gpu)}):
            rs = [r for r in _rows(gpu) if r["kv"] == kv and r["batch"] == b]
            if rs:
                series[f"{kv} KV, B = {b}, measured"] = ([r["context"] for r in rs], [r["time_us"] for r in rs])
    for kv in ("bf16", "fp8"):  # the floor only for the largest batch: the small one is launch-bound
        b = max(r["batch"] for r in _rows(gpu))
        rs = [r for r in _rows(gpu) if r["kv"] == kv and r["batch"] == b]
        if rs:
            series[f"{kv} KV, B = {b}, cost-model floor"] = ([r["context"] for r in rs], [r["model_us"] for r in rs])
    return series


def rope_fact(method: str, key: str, model: str = MODEL):
    """One field of rope_rule, for prose: rope_fact("llama3", "reach")."""
    return rope_rule(method, model)[key]


MACROS = [rope_rule, rope_table, kv_wall, kv_wall_table, long_context_recorded, long_context_table,
          long_context_row, long_context_ratio, long_context_fp8_speedup, long_context_env]
