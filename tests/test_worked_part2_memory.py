"""The part-2 memory examples (labs/worked/part2_memory.py) against hand calculations from the specs.

Each expected figure is worked from config numbers (layers, KV heads, head dim, parameter count),
the GPU's memory sizes or the OOM lab's recorded JSON read directly, not by calling the module's
own helpers again.
"""

from __future__ import annotations

import json
import math

import pytest

from labs import specs
from labs.kv_sizing.memory_budget import DEFAULT_GPU_MEMORY_UTILIZATION
from labs.kv_sizing.report import kv_budget
from labs.oom.report import RESULT, ReportError
from labs.worked import part2_memory as worked

GIB = 2**30
L = 32768


def test_naive_envelope_of_70b_on_two_h100s():
    ex = worked.memory_naive_envelope("llama-3.1-70b", "h100-sxm", L, n_gpus=2)
    kv_per_token = 2 * 80 * 8 * 128 * 2  # K and V, 80 layers, 8 KV heads, head dim 128, bf16
    weights = 70_553_706_496 * 2
    assert ex.kv_bytes_per_token == kv_per_token == 327_680
    assert ex.weight_bytes == weights
    assert ex.marketed_bytes == 160_000_000_000
    assert ex.naive_requests == pytest.approx((160e9 - weights) / (kv_per_token * L))
    assert f"{ex.naive_requests:.1f}" == "1.8"  # the lesson's "room for 1.8 such requests"
    # vLLM's budget holds less than one request: the shortfall is the rest of it.
    assert 0 < ex.max_concurrency < 1
    assert ex.shortfall_of_one_request == pytest.approx(1 - ex.max_concurrency)


def test_no_shortfall_when_one_request_fits():
    ex = worked.memory_naive_envelope("llama-3.1-70b", "h200", L, n_gpus=2)
    assert ex.max_concurrency > 1
    assert ex.shortfall_of_one_request == 0


def test_budget_shares_of_qwen3_8b_on_one_h100():
    ex = worked.memory_budget_shares("qwen3-8b", "h100-sxm", L, raised_utilization=0.95)
    total = 81_559 * 2**20  # nvidia-smi's MiB: no cudaMemGetInfo total recorded for the H100
    requested = math.ceil(total * DEFAULT_GPU_MEMORY_UTILIZATION)
    weights = 8_190_735_360 * 2
    assert ex.weights_share == pytest.approx(weights / requested)
    b = kv_budget("qwen3-8b", "h100-sxm", L)
    assert ex.runtime_overhead_share == pytest.approx((b.activation_peak + b.non_torch + b.cudagraph) / requested)
    # Only the requested budget moves with u; every other term stays, so the pool gains the difference.
    assert ex.pool_gain_at_raised_utilization == math.ceil(total * 0.95) - requested
    kv_per_token = 2 * 36 * 8 * 128 * 2
    assert ex.tokens_per_offloaded_gib == GIB // kv_per_token == 7_281
    assert ex.requests_per_offloaded_gib == pytest.approx(GIB / (kv_per_token * L))


def test_utilization_point_of_an_h200():
    ex = worked.memory_utilization_point("h200")
    assert ex.total_memory == 143_155 * 2**20  # cudaMemGetInfo's total, measured
    assert ex.bytes_per_point == pytest.approx(143_155 * 2**20 / 100)


def test_sliding_window_kv_of_gemma3_12b():
    ex = worked.memory_sliding_window_kv("gemma-3-12b")
    per_layer = 2 * 8 * 256 * 2  # K and V, 8 KV heads, head dim 256, bf16
    assert (ex.n_layers, ex.n_full_layers) == (48, 8)
    assert ex.kv_bytes_per_token == 8 * per_layer == 65_536
    assert ex.kv_bytes_per_token_every_layer == 48 * per_layer == 393_216


def test_log_rounding_in_blocks_of_llama_8b():
    ex = worked.memory_log_rounding("llama-3.1-8b", 0.01)
    bpb = 2 * 32 * 16 * 8 * 128 * 2  # 16-token blocks over 32 layers
    assert ex.bytes_per_block == bpb == 2_097_152
    assert ex.blocks_per_log_step == pytest.approx(0.01 * GIB / bpb)  # 5.12


def _recorded(scenario: str) -> dict:
    rows = json.loads(RESULT.read_text())["machines"]["NVIDIA H200"]["rows"]
    return next(r for r in rows if r["scenario"] == scenario)


def test_oom_evidence_from_the_recorded_runs():
    ex = worked.memory_oom_evidence("H200")
    pf, fr = _recorded("prefill-activation"), _recorded("fragmentation")
    assert ex.prefill_cached_unused == pf["evidence"]["reserved"] - pf["evidence"]["allocated"]
    assert ex.prefill_one_step_bytes == pf["setup"]["batched_tokens"] * pf["activation_bytes_per_token"]
    gap = fr["evidence"]["reserved"] - fr["evidence"]["allocated"]
    assert ex.fragmentation_cached_unused == gap
    assert ex.fragmentation_cache_per_request == pytest.approx(gap / fr["evidence"]["requested"])
    # What the diagnosis rests on: little spare cache in the prefill case, several requests' worth
    # in the fragmented one.
    assert ex.prefill_cached_unused < pf["evidence"]["requested"] < ex.prefill_one_step_bytes
    assert ex.fragmentation_cache_per_request > 1


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(specs.SpecError, match="unknown model"):
        worked.memory_naive_envelope("llama-9", "h100-sxm", L)
    with pytest.raises(specs.SpecError, match="unknown GPU"):
        worked.memory_utilization_point("h900")
    with pytest.raises(specs.SpecError, match="unknown model"):
        worked.memory_sliding_window_kv("nope")
    with pytest.raises(ValueError, match="max_model_len"):
        worked.memory_budget_shares("qwen3-8b", "h100-sxm", 0)
    with pytest.raises(ValueError, match="n_gpus"):
        worked.memory_naive_envelope("llama-3.1-70b", "h100-sxm", L, n_gpus=0)
    with pytest.raises(ValueError, match="log_precision_gib"):
        worked.memory_log_rounding("llama-3.1-8b", -0.01)
    with pytest.raises(ReportError):
        worked.memory_oom_evidence("B300")
