"""The quantization lab's page macros (torch-free): recorded error tables and the cost-model serving view."""

from __future__ import annotations

import pytest

from labs import roofline
from labs.quantization import report


def test_recorded_error_tables_render_every_scheme():
    table = report.quant_scheme_table("q_proj")
    assert table.count("\n") == 1 + 18  # header, rule, one row per weight scheme: 20 lines
    assert "`int4-sym-g128`" in table and "`fp8-e4m3-per-tensor`" in table
    assert report.quant_error("methods", "RTN-outliers", "output_err") > 0
    with pytest.raises(ValueError, match="no methods row"):
        report.quant_error("methods", "nope", "output_err")


def test_the_recorded_run_shows_what_the_pages_say():
    """The lessons state these orderings in prose; a re-recorded run that broke them must fail here."""
    e = report.quant_error
    assert e("schemes", "q_proj-int4-sym-g128-outliers", "output_err") < \
        e("schemes", "q_proj-int4-sym-per-tensor-outliers", "output_err")
    assert e("methods", "GPTQ-outliers", "output_err") < e("methods", "RTN-outliers", "output_err")
    assert e("methods", "AWQ-outliers", "output_err") < e("methods", "RTN-outliers", "output_err")
    assert e("smoothquant", "alpha=0.5-outliers", "output_err") < e("smoothquant", "no smoothing-outliers", "output_err")
    assert e("activations", "int8-sym-per-tensor-outliers", "bulk_err") > \
        e("activations", "int8-sym-per-token-outliers", "bulk_err")


def test_serving_view_fp8_kv_doubles_the_requests_a_pool_holds():
    for model, gpu, tp in report.SERVING:
        auto = roofline.deployment(model, gpu, tp=tp, weight_dtype="fp8").kv_pool(8192)
        fp8 = roofline.deployment(model, gpu, tp=tp, weight_dtype="fp8", kv_dtype="fp8").kv_pool(8192)
        assert fp8.max_requests in (2 * auto.max_requests, 2 * auto.max_requests + 1)
    assert report.quant_serving_table().count("\n") == 1 + len(report.SERVING) * len(report.SERVING_SCHEMES)


def test_speed_table_says_not_recorded_without_a_run():
    if report.quant_speed_recorded("H200"):
        pytest.skip("recorded")
    assert "not recorded yet" in report.quant_speed_table("H200").lower()
