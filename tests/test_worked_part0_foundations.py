"""The part-0 worked examples (labs/worked/part0_foundations.py) against hand calculations.

Each expected figure is worked from the spec numbers in labs/data (layers, heads, head
dims, SM count, bandwidth) with the textbook formula, not by calling the example's code.

Pages: docs/lessons/part-0/attention-variants.md, gpu-memory-roofline.md,
kv-cache-throughput-ceiling.md and questions/part-0/attention-variants.yaml,
gpu-memory-roofline.yaml.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from labs.kv_sizing import memory_budget
from labs.specs import SpecError, get_gpu, get_model
from labs.worked import part0_foundations as worked

BF16 = 2
BLOCK = 16


def gqa_kv_per_token(name: str, kv_heads: int | None = None) -> int:
    m = get_model(name)
    return 2 * m.n_layers * (kv_heads or m.n_kv_heads) * m.head_dim * BF16


def test_tokens_in_100_gib():
    for name in ("llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b"):
        ex = worked.part0_tokens_in_memory(name, 100)
        assert ex.kv_bytes_per_token == gqa_kv_per_token(name)
        assert ex.tokens == 100 * 2**30 // gqa_kv_per_token(name)  # a count that must fit rounds down
    assert worked.part0_tokens_in_memory("llama-3.1-8b", 100).tokens == 819_200  # 100 GiB / 128 KiB
    d3 = get_model("deepseek-v3")
    latent = d3.n_layers * (d3.mla.kv_lora_rank + d3.mla.qk_rope_head_dim) * BF16
    assert worked.part0_tokens_in_memory("deepseek-v3", 100).tokens == 100 * 2**30 // latent == 1_527_979


def test_mla_against_mha():
    d3 = get_model("deepseek-v3")
    ex = worked.part0_mla_saving("deepseek-v3")
    mha = d3.n_layers * d3.n_heads * ((d3.mla.qk_nope_head_dim + d3.mla.qk_rope_head_dim) + d3.mla.v_head_dim) * BF16
    latent = d3.n_layers * (d3.mla.kv_lora_rank + d3.mla.qk_rope_head_dim) * BF16
    assert (ex.mha_kv_bytes_per_token, ex.latent_kv_bytes_per_token) == (mha, latent)
    assert ex.saving == pytest.approx(mha / latent)
    assert round(ex.saving) == 71  # 61 x 128 x (192 + 128) x 2 over 61 x 576 x 2
    with pytest.raises(SpecError, match="not an MLA model"):
        worked.part0_mla_saving("llama-3.1-8b")


@pytest.mark.parametrize("gpu, max_model_len", [("h100-sxm", 8192), ("h200", 131072)])
def test_kv_head_variants(gpu, max_model_len):
    m = get_model("llama-3.1-8b")
    ex = worked.part0_kv_head_variants("llama-3.1-8b", gpu, max_model_len)
    assert ex.gqa_group == m.n_heads // m.n_kv_heads == 4
    assert ex.kv_bytes_per_token == gqa_kv_per_token("llama-3.1-8b")
    assert ex.mha_kv_bytes_per_token == gqa_kv_per_token("llama-3.1-8b", kv_heads=m.n_heads)
    assert ex.mqa_kv_bytes_per_token == gqa_kv_per_token("llama-3.1-8b", kv_heads=1)
    # Decode attention: 4 H_q d FLOPs on 2 H_kv d s bytes per token and layer.
    for heads, intensity in ((m.n_kv_heads, ex.flop_per_byte), (m.n_heads, ex.mha_flop_per_byte),
                             (1, ex.mqa_flop_per_byte)):
        assert intensity == pytest.approx(4 * m.n_heads * m.head_dim / (2 * heads * m.head_dim * BF16))
    assert (ex.mha_flop_per_byte, ex.flop_per_byte, ex.mqa_flop_per_byte) == (1, 4, 32)
    # Same pool, whole requests of ceil(L / 16) blocks at each variant's bytes per block.
    blocks_per_request = math.ceil(max_model_len / BLOCK)
    for per_token, requests in ((ex.kv_bytes_per_token, ex.max_requests),
                                (ex.mha_kv_bytes_per_token, ex.mha_max_requests),
                                (ex.mqa_kv_bytes_per_token, ex.mqa_max_requests)):
        assert requests == ex.kv_pool // (BLOCK * per_token) // blocks_per_request
    assert ex.mha_max_requests <= ex.max_requests // ex.gqa_group + 1
    if max_model_len == 131072:
        assert (ex.max_requests, ex.mha_max_requests) == (6, 1)  # the H200 at the full 128K context


def test_tensor_parallel_split():
    m70 = get_model("llama-3.1-70b")
    ex = worked.part0_tensor_parallel_kv("llama-3.1-70b", 16)
    assert ex.query_heads_per_rank == m70.n_heads // 16 == 4
    assert (ex.kv_heads_per_rank, ex.kv_head_replicas) == (1, 16 // m70.n_kv_heads)
    assert ex.kv_bytes_per_token == 2 * m70.n_layers * m70.n_kv_heads * m70.head_dim * BF16
    assert ex.kv_bytes_per_token_per_rank == 2 * m70.n_layers * 1 * m70.head_dim * BF16 == 40_960
    assert ex.clean_split_kv_bytes_per_token == ex.kv_bytes_per_token / 16 == 20_480
    d3 = get_model("deepseek-v3")
    mla = worked.part0_tensor_parallel_kv("deepseek-v3", 8)
    assert mla.query_heads_per_rank == d3.n_heads // 8 == 16
    assert mla.kv_bytes_per_token_per_rank == mla.kv_bytes_per_token == d3.n_layers * d3.mla.latent_dim * BF16
    with pytest.raises(SpecError, match="not divisible"):
        worked.part0_tensor_parallel_kv("qwen2.5-7b", 8)


def test_memory_hierarchy_h200():
    m, g, h = get_model("llama-3.1-8b"), get_gpu("h200"), get_gpu("h100-sxm")
    ex = worked.part0_memory_hierarchy("llama-3.1-8b", "h200", "h100-sxm")
    # Decode reads every weight but the input embedding table (a lookup, not a matmul).
    matrix_weights = (m.params_total - m.vocab_size * m.hidden_size) * BF16
    assert ex.weight_bytes == matrix_weights
    assert ex.weights_over_l2 == pytest.approx(matrix_weights / (g.l2_mb * 1e6))
    assert ex.register_file_bytes == g.sm_count * 65_536 * 4 == 33 * 2**20
    assert ex.shared_memory_bytes_per_s == pytest.approx(g.sm_count * 32 * 4 * 1.98e9)
    assert round(ex.shared_memory_bytes_per_s / 1e12, 1) == 33.5
    assert ex.shared_over_hbm == pytest.approx(g.sm_count * 128 * 1.98e9 / (g.hbm_bandwidth_tbps * 1e12))
    assert ex.bandwidth_ratio == pytest.approx(g.hbm_bandwidth_tbps / h.hbm_bandwidth_tbps)
    assert ex.l2_kv_tokens == pytest.approx(g.l2_mb * 1e6 / gqa_kv_per_token("llama-3.1-8b"))


def test_requests_per_gpu():
    ex = worked.part0_requests_per_gpu("llama-3.1-8b", "llama-3.1-70b", "h200", 8192, tp=1, versus_tp=2)
    m8 = get_model("llama-3.1-8b")
    pool = memory_budget.budget(m8, get_gpu("h200"), 8192)
    # Requests are blocks in the pool over ceil(L / 16) blocks per request.
    assert ex.requests == pytest.approx((pool.kv_pool // (BLOCK * gqa_kv_per_token("llama-3.1-8b"))) / (8192 / BLOCK))
    assert ex.versus_requests_per_gpu == pytest.approx(ex.versus_requests / 2)
    assert ex.ratio_per_gpu == pytest.approx(2 * ex.requests / ex.versus_requests)
    assert worked.part0_requests_per_gpu("llama-3.1-8b", "llama-3.1-8b").ratio_per_gpu == 1


def test_bad_inputs_are_refused():
    with pytest.raises(SpecError, match="unknown model 'llama-9b'"):
        worked.part0_tokens_in_memory("llama-9b", 100)
    with pytest.raises(ValueError, match="memory_gib must be positive"):
        worked.part0_tokens_in_memory("llama-3.1-8b", 0)
    with pytest.raises(SpecError, match="unknown GPU"):
        worked.part0_kv_head_variants("llama-3.1-8b", "h300")
    with pytest.raises(SpecError, match="max model length"):
        worked.part0_kv_head_variants("llama-3.1-8b", "h200", 0)
    with pytest.raises(SpecError, match="MLA model has no MHA/MQA variant"):
        worked.part0_kv_head_variants("deepseek-v3", "h200")
    with pytest.raises(SpecError, match="tensor parallel size must be >= 1"):
        worked.part0_tensor_parallel_kv("llama-3.1-70b", 0)
    with pytest.raises(SpecError, match="has no sm_clock_mhz"):
        worked.part0_memory_hierarchy("llama-3.1-8b", "a100-80gb")
    with pytest.raises(SpecError, match="max model length"):
        worked.part0_requests_per_gpu("llama-3.1-8b", "llama-3.1-70b", max_model_len=-1)


def test_imports_without_torch():
    code = "import sys, labs.worked.part0_foundations; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
