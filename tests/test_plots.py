"""Figures drawn at build time (docs/.hooks/plots.py on plotting.py): right numbers, text kept as text, both schemes."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("jinja2")
pytest.importorskip("matplotlib")

from site_helpers import ROOT  # noqa: E402

sys.path[:0] = [str(ROOT), str(ROOT / "docs" / ".hooks")]
import plots  # noqa: E402
import plotting  # noqa: E402
from labs import roofline, specs  # noqa: E402
from labs.kv_sizing import formula, memory_budget  # noqa: E402
from labs.paged_attention import bench  # noqa: E402

SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(autouse=True)
def plot_cache(tmp_path, monkeypatch):
    """Every test renders into its own cache: a test never reads another's files."""
    monkeypatch.setenv("LLM_BANK_CACHE_DIR", str(tmp_path / "cache"))
    plotting.reset_build()
    return tmp_path / "cache" / "plots"


def _svgs(name_prefix: str) -> dict[str, str]:
    """theme -> SVG text of the one plot this build rendered under `name_prefix`."""
    found = {p.name.rsplit("-", 1)[1][:-4]: p.read_text(encoding="utf-8")
             for n, p in plotting.BUILT.items() if n.startswith(name_prefix)}
    assert set(found) == {"light", "dark"}, f"want one light and one dark SVG, got {sorted(plotting.BUILT)}"
    return found


def _texts(svg: str) -> list[str]:
    return ["".join(t.itertext()).strip() for t in ET.fromstring(svg).iter(f"{SVG_NS}text")]


def test_roofline_points_come_from_the_cost_model():
    data = plots.roofline_data(roofline, "llama-3.1-8b", "h200", 2048, (1, 256), (1, 8))
    dep = roofline.deployment("llama-3.1-8b", "h200")
    decode1 = next(p for p in data["points"] if p["phase"] == "decode" and p["batch"] == 1)
    cost = roofline.decode(dep, 1, 2048)
    assert (decode1["flops"], decode1["bytes"], decode1["floor_s"]) == (cost.flops, cost.bytes, cost.floor_s)
    assert 0.9 < decode1["intensity"] < 1.2
    bf16 = next(r for r in data["roofs"] if r["kind"] == "bf16")
    assert bf16["ridge"] == roofline.ridge(dep).flop_per_byte


def test_decode_stays_below_every_ridge_and_a_long_prefill_above_it():
    for gpu in specs.all_gpus():
        data = plots.roofline_data(roofline, "llama-3.1-8b", gpu, 2048, (1, 256), (1, 8))
        ridge = next(r for r in data["roofs"] if r["kind"] == "bf16")["ridge"]
        for p in data["points"]:
            assert (p["intensity"] < ridge) == (p["phase"] == "decode"), f"{gpu}: {p}"


def test_moe_and_mla_models_are_refused_by_name():
    with pytest.raises(plots.PlotError, match="dense models only"):
        plots.roofline_data(roofline, "deepseek-v3", "h200", 2048, (1,), (1,))


def test_roofline_figure_is_text_svg_in_both_schemes_with_its_table(plot_cache):
    html = plots.roofline_figure(roofline, "reference/rooflines/", "llama-3.1-8b", "h200")
    svgs = _svgs("roofline-h200-llama-3.1-8b-2048")
    for theme, svg in svgs.items():
        assert "<path" in svg and "font-size" in svg
        texts = _texts(svg)
        assert "decode B=1" in texts and "prefill B=8" in texts, texts
        assert any(t.startswith("HBM ") for t in texts)
    assert svgs["light"] != svgs["dark"], "the dark variant has its own colours"
    assert '#only-light"' in html and '#only-dark"' in html
    assert 'src="../../assets/plots/roofline-h200-llama-3.1-8b-2048-' in html
    assert "| decode | 1 |" in html and "derived" in html
    assert "\n\n" not in html.split("</figure>")[0], "a blank line would end Markdown's raw HTML block"


def test_a_plot_is_redrawn_only_when_its_inputs_change(plot_cache):
    plots.roofline_figure(roofline, "x/", "llama-3.1-8b", "h200")
    assert plotting.stats() == {"rendered": 1, "cached": 0}
    plots.roofline_figure(roofline, "x/", "llama-3.1-8b", "h200")
    assert plotting.stats() == {"rendered": 1, "cached": 1}
    plots.roofline_figure(roofline, "x/", "llama-3.1-8b", "h200", context=4096)
    assert plotting.stats() == {"rendered": 2, "cached": 1}
    assert len(list(plot_cache.glob("*.svg"))) == 4


def test_minimum_width_keeps_the_smallest_text_readable(plot_cache):
    rendered = plotting.render("t", plots.draw_roofline,
                               plots.roofline_data(roofline, "llama-3.1-8b", "h200", 2048, (1,), (1,)), (6.4, 3.9))
    svg = rendered.files["light"].read_text(encoding="utf-8")
    smallest = min(float(s) for s in re.findall(r"font-size: ([\d.]+)px", svg))
    width_units = float(re.search(r'viewBox="0 0 ([\d.]+) ', svg).group(1))
    assert smallest * rendered.min_width_px / width_units >= plotting.MIN_TEXT_PX - 0.05


def test_lines_helper_draws_a_labelled_curve_with_marks(plot_cache):
    html = plotting.lines("step-time", "labs/x/", {"derived": ([1, 2, 4], [3.0, 3.1, 3.3])},
                          x_label="batch", y_label="step time (ms)", title="Step time", caption="c",
                          marks=[plotting.Mark("x", 2, "knee")])
    texts = _texts(_svgs("step-time")["light"])
    assert "knee" in texts and "batch" in texts and "step time (ms)" in texts
    assert "<figcaption>c</figcaption>" in html


def test_log_axes_label_ticks_as_plain_numbers_and_pair_a_floor_with_its_curve(plot_cache):
    plotting.lines("log-ticks", "labs/x/", {"L = 128 measured": ([1, 16, 1000], [5.0, 6.0, 40.0]),
                                            "L = 128 floor": ([1, 16, 1000], [3.5, 3.6, 20.0])},
                   x_label="batch", y_label="ms", title="t", caption="c", log_x=True, log_y=True)
    svg = _svgs("log-ticks")["light"]
    texts = _texts(svg)
    assert {"1", "10", "100", "1k"} <= set(texts), texts  # not 10^0 … 10^3
    assert not any("10^" in t or "\\times" in t for t in texts)
    assert "5" in texts and "20" in texts  # minor ticks at 2 and 5 × 10^n carry labels on a short axis
    assert "3" not in texts and "7" not in texts  # and only those


def test_server_knee_figure_marks_the_recorded_knee(plot_cache):
    from labs.loadgen import report

    knee = report.sweep_knee("concurrency")
    html = plots.server_knee_figure("labs/server/", "concurrency", "H200")
    texts = _texts(_svgs("server-knee-concurrency")["light"])
    assert f"knee {knee['load']:g}" in texts
    assert {"output tok/s", "TTFT p50 (ms)", "TPOT p50 (ms)"} <= set(texts)
    assert report.sweep_run()["date"] in html


def test_kv_budget_figure_has_a_bar_per_model_at_a_tp_that_fits(plot_cache):
    models = list(specs.all_models())
    data = plots.kv_budget_data(roofline, models, "h200", 8192)
    for bar, name in zip(data["bars"], models):
        dep = roofline.smallest_tp(specs.get_model(name), specs.get_gpu("h200"), 8192)
        assert (bar["tp"], bar["kv_pool"]) == (dep.tp, roofline.kv_pool(dep, 8192).kv_pool)
    html = plots.kv_budget_figure(roofline, "reference/rooflines/", "h200", 8192, models, "0.33.0")
    texts = _texts(_svgs("kv-budget-h200-8192")["light"])
    for m in specs.all_models().values():
        assert any(t.startswith(m.display_name) for t in texts), m.display_name
        assert m.display_name in html
    # Counts that must fit round down, in the plot and in the table.
    first = data["bars"][0]
    assert f"{int(first['max_concurrency']):,} requests" in texts


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


def test_paged_attention_figure_draws_every_recorded_shape_against_the_copy_bandwidth(tmp_path, plot_cache):
    path = tmp_path / "paged_attention.json"
    bench.record(RUN["gpus"]["NVIDIA H200"], path)
    html = plots.paged_attention_figures("labs/paged-attention/", "H200", path)
    texts = _texts(_svgs("paged-attention-nvidia-h200")["light"])
    assert "b1-l4k" in texts and "b32-l4k" in texts and "copy 4.10 TB/s" in texts
    assert "measured 2026-11-29" in html
    assert "| b32-l4k | 32 | 4,096 | 32/8 | 512.0 | 150.2 | 3.57 | 87% | 160.0 |" in html


def test_paged_attention_figure_says_so_when_nothing_is_recorded(tmp_path):
    assert "No results recorded yet" in plots.paged_attention_figures("x/", "H200", tmp_path / "missing.json")


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


def test_calculator_quotes_vllms_refusal_past_the_models_length():
    """The calculator's message past max_position_embeddings is the one vLLM 0.33 raises."""
    data = plots.calculator_data(specs, formula, memory_budget, "0.33.0")
    assert data["long_max_model_len_env"] == "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
    with pytest.raises(plots.PlotError, match="no environment variable VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        plots.calculator_data(specs, formula, memory_budget, "0.33.0", {"env_vars": {}})
    ours = data["max_model_len_error"].format(max_model_len=500000, limit=131072, env=data["long_max_model_len_env"])
    model_config = pytest.importorskip("vllm.config.model")
    from types import SimpleNamespace

    arch = SimpleNamespace(derived_max_model_len_and_key=(131072, "max_position_embeddings"))
    with pytest.raises(ValueError) as refused:
        model_config._get_and_verify_max_len(SimpleNamespace(model_type="llama", rope_parameters=None), arch,
                                             None, 500000, False, None)
    assert str(refused.value).startswith(ours)
