"""The FlashAttention lab's recorded results as Markdown for the site (torch-free).

macros.py registers `MACROS`: `flash_attention_table("prefill", "H200")`, one case with
`flash_attention_row(...)` inside `{% if flash_attention_recorded("H200") %}`.
"""

from __future__ import annotations

from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.results import RESULTS_DIR

_COLS = [Column("Case", "case", "`{}`"), Column("GFLOP", "flops", "{:,.1f}"),
         Column("Naive HBM (MB)", "naive_bytes", "{:,.0f}"), Column("Flash HBM, least (MB)", "min_bytes", "{:,.1f}"),
         Column("Naive (µs)", "naive_us", "{:,.1f}"), Column("Ours (µs)", "flash_us", "{:,.1f}"),
         Column("SDPA (µs)", "sdpa_us", "{:,.1f}"), Column("Naive ÷ ours", "naive_vs_flash", "{:.2f}"),
         Column("Ours TFLOP/s", "flash_tflop_s", "{:,.0f}"), Column("SDPA TFLOP/s", "sdpa_tflop_s", "{:,.0f}")]




RESULTS = LabResults("flash_attention", RESULTS_DIR / "flash_attention.json",
                     "python -m labs.flash_attention --out out/flash --record", {"prefill": _COLS, "decode": _COLS})


def flash_attention_recorded(gpu: str) -> bool:
    """True when labs/results/flash_attention.json holds an entry for `gpu`."""
    return RESULTS.recorded(gpu)


def flash_attention_table(section: str, gpu: str) -> str:
    """The prefill or decode rows, or "not recorded yet"."""
    if not RESULTS.recorded(gpu):
        return RESULTS.missing()
    rows = [{**r, "flops": r["flops"] / 1e9, "naive_bytes": r["naive_bytes"] / 1e6, "min_bytes": r["min_bytes"] / 1e6}
            for r in RESULTS.rows(section, gpu)]
    return _render(section, rows, gpu)


def _render(section: str, rows: list[dict], gpu: str) -> str:
    cols = RESULTS.columns[section]
    lines = ["| " + " | ".join(c.header for c in cols) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(cols))) + " |"]
    for r in rows:
        lines.append("| " + " | ".join("—" if r.get(c.key) is None else c.fmt.format(r[c.key]) for c in cols) + " |")
    return RESULTS.env_line(gpu) + "\n\n" + "\n".join(lines) + "\n"


def flash_attention_row(case: str, gpu: str) -> dict:
    """One case's recorded row by name (e.g. "prefill-b1-q16384-kv16384-causal")."""
    return RESULTS.row(case.split("-", 1)[0], "case", case, gpu)


def flash_attention_env(gpu: str) -> str:
    """Where and when the rows were measured, or "not recorded yet"."""
    return RESULTS.env_line(gpu)


def attention_io(q_len: int, kv_len: int, causal: bool, io: str, batch: int = 1, model: str = "llama-3.1-8b",
                 gpu: str = "h200", block_m: int = 128):
    """The cost model's attention forward (labs/roofline.py attention_forward) with a model's heads."""
    from labs import roofline
    from labs.specs import get_model

    m = get_model(model)
    return roofline.attention_forward(gpu, batch, m.n_heads, m.n_kv_heads, q_len, kv_len, m.head_dim, causal, io,
                                      block_m=block_m)


QUOTED = ("prefill-b1-q16384-kv16384-full", "prefill-b1-q256-kv256-full")


def flash_attention_complete(gpu: str) -> bool:
    """True when the rows the lesson quotes were recorded with a naive time (naive can run out of memory)."""
    if not RESULTS.recorded(gpu):
        return False
    try:
        return all(flash_attention_row(c, gpu).get("naive_vs_flash") is not None for c in QUOTED)
    except (LookupError, ValueError):
        return False


MACROS = [flash_attention_complete, attention_io, flash_attention_recorded, flash_attention_table, flash_attention_row, flash_attention_env]
