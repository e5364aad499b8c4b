"""The paged-KV worked examples (labs/worked/paged_kv.py) against hand calculations from the specs.

The pages that quote them: docs/lessons/part-3/paged-attention-kernel.md,
docs/lessons/part-5/paged-attention-block-manager.md, questions/part-3/paged-attention-kernel.yaml
and questions/part-5/paged-attention-kv-memory.yaml.
"""

from __future__ import annotations

import pytest

from conftest import ROOT
from labs import roofline
from labs.specs import SpecError, get_gpu
from labs.worked import paged_kv

# Llama-3.1-8B (labs/data/models.yaml): 32 layers, 8 KV heads, head_dim 128, bf16 (2 bytes).
LLAMA_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 131,072 bytes
LLAMA_BLOCK = 16 * LLAMA_KV_PER_TOKEN  # 2 MiB, 16-token blocks
# Qwen3-8B: 36 layers, 8 KV heads, head_dim 128, bf16.
QWEN_KV_PER_TOKEN = 2 * 36 * 8 * 128 * 2  # 147,456 bytes


def test_decode_step_llama_8b_h200():
    ex = paged_kv.paged_kv_decode_step("llama-3.1-8b", "h200", 32, 4096)
    bandwidth = get_gpu("h200").hbm_bandwidth_tbps * 1e12  # 4.8 TB/s datasheet
    step_bytes = 32 * 4096 * LLAMA_KV_PER_TOKEN  # 16 GiB
    assert ex.kv_bytes_per_element == 2
    assert ex.kv_row_bytes == 128 * 2 == 256
    assert ex.block_layer_bytes == 16 * 2 * 8 * 128 * 2 == 64 * 1024
    assert ex.blocks_per_sequence == 4096 // 16 == 256
    assert ex.block_table_bytes == 32 * 256 * 4 == 32 * 1024
    assert ex.kv_read_bytes == step_bytes == 16 * 2**30
    assert ex.layer_kv_read_bytes == step_bytes / 32 == 512 * 2**20
    assert ex.layer_kv_read_s == pytest.approx(step_bytes / 32 / bandwidth)
    assert ex.gather_copy_s == pytest.approx(3 * step_bytes / bandwidth)  # about 10.7 ms
    assert ex.triton_split_max_sequences == 128 // 8 == 16
    assert ex.no_gqa_flop_per_byte == 1
    assert ex.no_gqa_padded_flop_per_byte == 16


def test_decode_step_scales_with_the_batch():
    one = paged_kv.paged_kv_decode_step("llama-3.1-8b", "h200", 1, 4096)
    assert one.block_table_bytes == 256 * 4
    assert one.layer_kv_read_bytes == 4096 * LLAMA_KV_PER_TOKEN / 32


def test_request_blocks_llama_8b():
    ex = paged_kv.paged_kv_request_blocks("llama-3.1-8b", 500, 300, 256)
    assert ex.block_size == 16
    assert ex.bytes_per_block == LLAMA_BLOCK == 2 * 2**20
    assert ex.cached_blocks == 16
    assert ex.prompt_blocks == 32  # ceil(500 / 16)
    assert ex.new_prompt_blocks == 16
    assert ex.last_prompt_block_tokens == 500 - 31 * 16 == 4
    assert ex.decode_blocks == 50 - 32 == 18  # ceil(800 / 16) = 50
    assert ex.final_blocks == 50
    assert ex.final_bytes == 50 * LLAMA_BLOCK == 100 * 2**20


def test_request_blocks_at_a_block_boundary():
    ex = paged_kv.paged_kv_request_blocks("llama-3.1-8b", 512, 1, 100)
    assert ex.last_prompt_block_tokens == 16  # a full last block, not 512 % 16 = 0
    assert ex.cached_blocks == 6  # only whole blocks of the cached 100 tokens
    assert ex.decode_blocks == 1


def test_reservation_qwen3_8b_a100():
    ex = paged_kv.paged_kv_reservation("qwen3-8b", "a100-80gb", 800, 8192)
    assert ex.reserved_unused_pct == pytest.approx(100 * 7392 / 8192)  # 90%
    assert ex.contiguous_used_pct == pytest.approx(100 * 800 / 8192)  # 10%
    assert ex.paged_used_pct == pytest.approx(100.0)  # 800 tokens fill 50 blocks exactly
    assert ex.tail_waste_slots == 15
    assert ex.tail_waste_bytes == 15 * QWEN_KV_PER_TOKEN

    d = roofline.deployment("qwen3-8b", "a100-80gb")
    num_blocks = d.kv_pool(8192).num_blocks  # the pool does not depend on max_model_len's tail
    assert ex.contiguous_requests == num_blocks // (8192 // 16)
    assert ex.paged_requests_by_kv == d.kv_pool(800).num_blocks // 50
    assert ex.paged_requests == min(ex.paged_requests_by_kv, 256)  # vllm serve's max_num_seqs on an A100
    assert ex.requests_gain == pytest.approx(ex.paged_requests / ex.contiguous_requests)

    # Bandwidth-bound decode: B tokens per (weights + B x (800 read + 1 written) x KV per token) / bandwidth.
    bandwidth = get_gpu("a100-80gb").hbm_bandwidth_tbps * 1e12
    weights = d.decode(1, 0).weight_bytes  # what a decode step reads of the weights (no embedding table)

    def tokens_per_s(batch: int) -> float:
        return batch * bandwidth / (weights + batch * 801 * QWEN_KV_PER_TOKEN)

    assert ex.contiguous_tokens_per_s == pytest.approx(tokens_per_s(ex.contiguous_requests))
    assert ex.paged_tokens_per_s == pytest.approx(tokens_per_s(ex.paged_requests))
    assert ex.throughput_gain == pytest.approx(tokens_per_s(ex.paged_requests)
                                               / tokens_per_s(ex.contiguous_requests))
    assert 1 < ex.throughput_gain < ex.requests_gain


def test_measured_step_sums_the_layers():
    from labs.paged_attention.report import ResultsError, paged_attention_recorded, paged_attention_row

    if not paged_attention_recorded("H200"):
        pytest.skip("no recorded H200 paged-attention rows")
    row = paged_attention_row("b32-l4k", "H200")
    ex = paged_kv.paged_kv_measured_step("llama-3.1-8b", "b32-l4k", "H200")
    assert ex.n_layers == 32
    assert ex.layer_time_us == row["time_us"]
    assert ex.step_attention_ms == pytest.approx(row["time_us"] * 32 / 1000)
    with pytest.raises(ResultsError, match="no row"):
        paged_kv.paged_kv_measured_step("llama-3.1-8b", "b0-l0", "H200")


def test_bad_inputs_raise():
    with pytest.raises(SpecError):
        paged_kv.paged_kv_decode_step("no-such-model", "h200", 32, 4096)
    with pytest.raises(SpecError):
        paged_kv.paged_kv_decode_step("llama-3.1-8b", "no-such-gpu", 32, 4096)
    with pytest.raises(ValueError, match="batch"):
        paged_kv.paged_kv_decode_step("llama-3.1-8b", "h200", 0, 4096)
    with pytest.raises(ValueError, match="context"):
        paged_kv.paged_kv_decode_step("llama-3.1-8b", "h200", 32, -1)
    with pytest.raises(ValueError, match="used"):
        paged_kv.paged_kv_reservation("qwen3-8b", "a100-80gb", 0, 8192)
    with pytest.raises(ValueError, match="max_model_len"):
        paged_kv.paged_kv_reservation("qwen3-8b", "a100-80gb", 9000, 8192)
    with pytest.raises(ValueError, match="prompt"):
        paged_kv.paged_kv_request_blocks("llama-3.1-8b", 0, 300, 0)
    with pytest.raises(ValueError, match="output"):
        paged_kv.paged_kv_request_blocks("llama-3.1-8b", 500, 0, 0)
    with pytest.raises(ValueError, match="cached"):
        paged_kv.paged_kv_request_blocks("llama-3.1-8b", 500, 300, 600)
    with pytest.raises(SpecError):
        paged_kv.paged_kv_request_blocks("no-such-model", 500, 300, 256)


def test_examples_are_registered_and_prefixed():
    assert paged_kv.EXAMPLES == [paged_kv.paged_kv_decode_step, paged_kv.paged_kv_measured_step,
                                 paged_kv.paged_kv_reservation, paged_kv.paged_kv_request_blocks]
    assert all(fn.__name__.startswith("paged_kv_") for fn in paged_kv.EXAMPLES)


def test_the_tile_the_lesson_quotes_is_the_lab_kernels():
    """64-token tiles of 16-token blocks: 4 table lookups, from kernel.py's DEFAULT_TILE_N."""
    source = (ROOT / "labs" / "paged_attention" / "kernel.py").read_text()
    ex = paged_kv.paged_kv_decode_step("llama-3.1-8b", "h200", 32, 4096)
    assert f"\nDEFAULT_TILE_N = {ex.lab_tile_tokens}\n" in source
    assert ex.lookups_per_tile == ex.lab_tile_tokens // 16 == 4
