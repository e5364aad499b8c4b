"""Figures drawn at build time (docs/.hooks/plots.py): right numbers, valid SVG, colours from the theme."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("jinja2")

from site_helpers import ROOT  # noqa: E402

sys.path[:0] = [str(ROOT), str(ROOT / "docs" / ".hooks")]
import plots  # noqa: E402
from labs import specs  # noqa: E402
from labs.kv_sizing import budget, formula, memory_budget  # noqa: E402
from labs.paged_attention import bench  # noqa: E402

SVG = re.compile(r"<svg .*?</svg>", re.S)


def _svgs(markdown: str) -> list[ET.Element]:
    return [ET.fromstring(svg) for svg in SVG.findall(markdown)]


def _points(model: str = "llama-3.1-8b", context: int = 2048):
    m = specs.get_model(model)
    return m, plots.work_points(m, context, (1, 256), (1, 8), formula.kv_bytes_per_token(m))


def test_decode_at_batch_one_moves_about_one_flop_per_byte():
    m, points = _points()
    decode1 = next(p for p in points if p.phase == "decode" and p.batch == 1)
    # 2 FLOPs per parameter, plus QK^T and PV over 2,048 cached tokens; the weights once plus the KV read.
    flops = 2 * m.params + 4 * m.head_dim * m.n_heads * m.n_layers * 2048
    moved = m.weight_bytes + 2048 * formula.kv_bytes_per_token(m)
    assert decode1.flops == flops and decode1.bytes == moved
    assert 0.9 < decode1.intensity < 1.2


def test_decode_stays_below_every_ridge_and_a_long_prefill_above_it():
    _, points = _points()
    for gpu in specs.all_gpus().values():
        ridge = gpu.dense_tflops["bf16"] / gpu.hbm_bandwidth_tbps
        for p in points:
            below = p.intensity < ridge
            assert below == (p.phase == "decode"), \
                f"{gpu.name}: {p.label} at {p.intensity:.1f} FLOP/B, ridge {ridge:.0f}"


def test_moe_and_mla_models_are_refused_by_name():
    with pytest.raises(plots.PlotError, match="dense models only"):
        _points("deepseek-v3")


def test_roofline_figure_is_valid_svg_that_takes_its_colours_from_the_theme():
    m = specs.get_model("llama-3.1-8b")
    figure = plots.roofline_figure(specs.get_gpu("h200"), m, 2048, (1, 256), (1, 8), formula.kv_bytes_per_token(m))
    (svg,) = _svgs(figure)
    assert svg.find("{http://www.w3.org/2000/svg}title").text.startswith("Roofline of the NVIDIA H200")
    assert not re.search(r'(fill|stroke)="#', figure), "colours belong in extra.css, keyed to the palette"
    assert figure.count('class="plot-point plot-point--decode"') == 2
    assert "| decode | 1 |" in figure and "derived" in figure
    assert "\n\n" not in SVG.search(figure).group(0), "a blank line would end Markdown's raw HTML block"


def test_kv_budget_figure_has_a_bar_per_model_at_a_tp_that_fits():
    gpu = specs.get_gpu("h200")
    models = list(specs.all_models().values())
    budgets = [plots.smallest_fitting_tp(budget, m, gpu, 8192) for m in models]
    assert all(b.error is None for b in budgets)
    figure = plots.kv_budget_figure(budgets, {m.name: m.display_name for m in models}, gpu, 8192, "0.33.0")
    (svg,) = _svgs(figure)
    assert len([r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if "plot-seg--kv" in r.get("class", "")]) \
        == len(models) + 1  # one per model, one in the legend
    for m in models:
        assert m.display_name in figure


RUN = {
    "schema": 1, "lab": "paged_attention",
    "gpus": {"NVIDIA H200": {
        "gpu": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "driver": "580", "torch": "2.11.0",
        "cuda": "12.8", "triton": "3.6.0", "date": "2026-11-29", "copy_tb_s": 4.1, "sdpa_backend": "flash",
        "sdpa_kernels": [], "max_memory_reserved_gib": 3.2, "table": "shape  time_us  ...",
        "rows": [
            {"shape": "b1-l4k", "batch": 1, "context_len": 4096, "q_heads": 32, "kv_heads": 8, "head_dim": 128,
             "block_size": 16, "dtype": "bfloat16", "num_splits": 8, "tile_n": 64, "num_warps": 4, "num_stages": 2,
             "kv_bytes": 16777216, "floor_us": 4.09, "time_us": 9.5, "rerun_spread": 0.01, "tb_s": 1.766,
             "copy_fraction": 0.431, "sdpa_time_us": 12.0, "ratio_to_sdpa": 0.79, "sdpa_us_by_backend": {},
             "rel_err": 0.002, "sdpa_rel_err": 0.002},
            {"shape": "b32-l4k", "batch": 32, "context_len": 4096, "q_heads": 32, "kv_heads": 8, "head_dim": 128,
             "block_size": 16, "dtype": "bfloat16", "num_splits": 1, "tile_n": 64, "num_warps": 4, "num_stages": 2,
             "kv_bytes": 536870912, "floor_us": 130.9, "time_us": 150.2, "rerun_spread": 0.004, "tb_s": 3.574,
             "copy_fraction": 0.872, "sdpa_time_us": 160.0, "ratio_to_sdpa": 0.94, "sdpa_us_by_backend": {},
             "rel_err": 0.002, "sdpa_rel_err": 0.002},
        ],
    }},
}


def test_paged_attention_figure_draws_every_recorded_shape_against_the_copy_bandwidth(tmp_path):
    path = tmp_path / "paged_attention.json"
    bench.record(RUN["gpus"]["NVIDIA H200"], path)
    figure = plots.paged_attention_figures("H200", path)
    (svg,) = _svgs(figure)
    bars = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if "plot-seg--kv" in r.get("class", "")]
    assert len(bars) == 2 + 1  # two shapes, one legend swatch
    assert "copy 4.10 TB/s" in figure and "measured 2026-11-29" in figure
    assert "| b32-l4k | 32 | 4,096 | 32/8 | 512.0 | 150.2 | 3.57 | 87% | 160.0 |" in figure


def test_paged_attention_figure_says_so_when_nothing_is_recorded(tmp_path):
    assert "No results recorded yet" in plots.paged_attention_figures("H200", tmp_path / "missing.json")


def test_calculator_data_is_the_labs_data():
    data = plots.calculator_data(specs, formula, memory_budget, "0.33.0")
    assert list(data["models"]) == list(specs.all_models())
    for name, gpu in specs.all_gpus().items():
        assert data["gpus"][name]["total_memory"] == gpu.memory_bytes_budget
        assert (data["gpus"][name]["max_num_batched_tokens"], data["gpus"][name]["max_num_seqs"]) == \
            memory_budget.vllm_batch_defaults(gpu)
    assert data["gpu_memory_utilization"] == memory_budget.DEFAULT_GPU_MEMORY_UTILIZATION
    html = plots.calculator_html(data, "llama-3.1-8b", "h200", 8192)
    assert "\n\n" not in html, "one raw HTML block for Markdown"
    assert "<script" not in html, "instant navigation re-runs every script it swaps in, JSON ones included"
    with pytest.raises(plots.PlotError, match="unknown model 'llama-9'"):
        plots.calculator_html(data, "llama-9", "h200", 8192)
