"""The long-context lab's three figures, drawn at build time through docs/.hooks/plotting.py.

Only the site build imports this (plotting is on its path there); the numbers come from
labs/long_context/report.py, which takes them from rope.py, the cost model or the results file.
"""

from __future__ import annotations

import plotting  # docs/.hooks, on the path during the site build

from labs import specs
from labs.long_context import report


def score_plot(page_url: str, model: str = report.MODEL) -> str:
    series = report.score_series(model)
    m = specs.get_model(model)
    r = report.rope_rule("rope", model)
    picks = (1024, 8192, 65536, 131072)
    rows = [[name] + [f"{ys[xs.index(min(xs, key=lambda x: abs(x - p)))]:.3f}" for p in picks]
            for name, (xs, ys) in series.items()]
    table = plotting.markdown_table(["Rule"] + [f"Score at ≈{p:,}" for p in picks], rows)
    return plotting.lines(
        f"long-context-score-{model}", page_url, series, x_label="distance between query and key (tokens)",
        y_label="score q·R(Δ)q / |q|²", title=f"RoPE score against distance, {m.display_name}'s geometry",
        caption=(f"Derived (labs/long_context/rope.py): the mean of cos(Δ·f′ᵢ) over the {r['pairs']} rotary pairs, "
                 f"d = {m.head_dim}, θ = {m.rope_theta:,.0f}, L = {r['original_len']:,}, s = {r['factor']:g}; YaRN "
                 "includes its logit scale. Equal weight on every pair: the geometry, not a trained model."),
        table=table, log_x=True,
        marks=[plotting.Mark("x", r["original_len"], "trained L"), plotting.Mark("x", r["extended_len"], "s × L")])


def stretch_plot(page_url: str, model: str = report.MODEL) -> str:
    series = report.stretch_series(model)
    m = specs.get_model(model)
    rows = []
    for method in ("pi", "ntk", "yarn", "llama3"):
        r = report.rope_rule(method, model)
        rows.append([r["name"], str(r["kept"]), str(r["blended"]), str(r["full"])])
    table = plotting.markdown_table(["Rule", "Pairs kept (×1)", "Blended", "Divided by s"], rows)
    rr = report.rope_rule("rope", model)
    return plotting.lines(
        f"long-context-stretch-{model}", page_url, series, x_label="rotary pair i (0 = fastest)",
        y_label="slow-down f_i / f′_i", title=f"How each rule slows every rotary pair, s = {rr['factor']:g}",
        caption=(f"Derived (labs/long_context/rope.py) on {m.display_name}'s d = {m.head_dim} and "
                 f"θ = {m.rope_theta:,.0f}: 1 leaves a pair alone, s interpolates it fully. Pairs from "
                 f"{rr['pairs'] - rr['partial_pairs']} on never made a full turn in L = {rr['original_len']:,} tokens."),
        table=table,
        marks=[plotting.Mark("x", rr["pairs"] - rr["partial_pairs"], "first pair slower than L")])


def decode_plot(page_url: str, gpu: str) -> str:
    if not report.long_context_recorded(gpu):
        return report.RESULTS.missing()
    series = report.decode_series(gpu)
    rows = [[f"{r['kv']}", f"{r['batch']}", f"{r['context']:,}", f"{r['time_us']:,.1f}", f"{r['model_us']:,.1f}",
             f"{r['of_copy']:.2f}"] for r in report._rows(gpu)]
    table = plotting.markdown_table(["KV", "B", "L", "Measured (µs)", "Cost model (µs)", "Of copy"], rows)
    return plotting.lines(
        f"long-context-decode-{gpu.lower().replace(' ', '-')}", page_url, series,
        x_label="context L (tokens)", y_label="one layer's decode attention (µs)",
        title="Decode attention time against context, paged kernel, Llama-3.1-8B shapes",
        caption=(report.long_context_env(gpu) + " One layer: H_q = 32, H_kv = 8, d = 128. The cost model's "
                 "floor is the KV bytes over the datasheet bandwidth, drawn for the larger batch."),
        table=table, log_x=True, log_y=True)
