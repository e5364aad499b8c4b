"""The part-5 worked examples (labs/worked/part5_serving.py) against hand calculations from the specs.

Each expected figure is worked out here from the raw numbers of labs/data (layers, heads,
vocabulary, parameters, datasheet FLOP/s and bandwidth), not by calling the cost model again.
"""

from __future__ import annotations

import pytest

from labs import specs
from labs.worked import part5_serving as ex

LLAMA = specs.get_model("llama-3.1-8b")
H100 = specs.get_gpu("h100-sxm")
H200 = specs.get_gpu("h200")


def kv_per_token(m) -> int:
    """K and V, every KV head, every layer, 2 bytes (bf16)."""
    return 2 * m.n_kv_heads * m.head_dim * 2 * m.n_layers


def decode_floor_s(m, g, batch: int, context: int) -> float:
    """A dense full-attention model's decode step: the slower of FLOPs at peak and bytes at bandwidth."""
    table = m.vocab_size * m.hidden_size
    head = table
    body = m.params - head - (0 if m.tie_word_embeddings else table)
    attention = 4 * m.n_heads * m.head_dim * m.n_layers * batch * (context + 1)
    flops = 2 * (body + head) * batch + attention
    kv = kv_per_token(m)
    moved = 2 * (body + head) + batch * context * kv + batch * kv
    return max(flops / (g.dense_tflops["bf16"] * 1e12), moved / (g.hbm_bandwidth_tbps * 1e12))


def test_prefix_cache_hit_lesson_example():
    r = ex.prefix_cache_hit_example("llama-3.1-8b", "h100-sxm", 2000, 200)
    assert r.block_size == 16
    assert (r.hit_tokens, r.hit_blocks, r.prompt_tokens) == (2000, 125, 2200)
    assert r.hit_rate == pytest.approx(2000 / 2200)
    # Skipped: the matmuls of 2,000 tokens (LM head only on the last row, which still runs)
    # and their causal attention over themselves, 2000 * 2001 / 2 query-key pairs.
    body = LLAMA.params - 2 * LLAMA.vocab_size * LLAMA.hidden_size
    skipped = 2 * body * 2000 + 4 * LLAMA.n_heads * LLAMA.head_dim * LLAMA.n_layers * 2000 * 2001 // 2
    assert r.flops_saved == pytest.approx(skipped, rel=1e-9)
    assert r.compute_s_saved == pytest.approx(skipped / 989.5e12, rel=1e-9)
    assert r.compute_s_saved * 1e3 == pytest.approx(29.3, abs=0.05)  # the lesson's "29.3 ms"
    assert r.flops_saved / 1e12 == pytest.approx(29.0, abs=0.05)
    assert r.warm.tokens == 200 and r.cold.tokens == 2200
    assert r.hit_kv_bytes == 2000 * 131072  # 128 KiB per token


def test_prefix_hit_never_takes_the_last_prompt_token():
    """A prompt cached whole recomputes its last block: the hit is capped at N - 1 tokens."""
    r = ex.prefix_cache_hit_example("llama-3.1-8b", "h200", 2000, 0)
    assert r.hit_tokens == 16 * (1999 // 16) == 1984
    assert r.warm.tokens == 16
    partial = ex.prefix_cache_hit_example("llama-3.1-8b", "h200", 2008, 150)
    assert partial.hit_tokens == 2000  # the 8 tokens of the partial block miss


def test_prefix_cache_copies():
    r = ex.prefix_cache_copies_example("llama-3.1-8b", "h100-sxm", 2000, 100)
    assert r.kv_bytes_per_copy == 2000 * kv_per_token(LLAMA)
    assert r.kv_bytes == 100 * 2000 * 131072
    assert r.kv_bytes / 2**30 == pytest.approx(24.4, abs=0.05)  # the lesson's "24.4 GiB"


@pytest.mark.parametrize("batch", [1, 64, 256, 1024])
def test_sampling_pass(batch):
    r = ex.sampling_pass_example("llama-3.1-8b", "h200", batch, 1024)
    logits = batch * LLAMA.vocab_size * 4
    assert r.logits_bytes == logits
    assert r.pass_s == pytest.approx(2 * logits / 4.8e12, rel=1e-12)
    assert r.step_s == pytest.approx(decode_floor_s(LLAMA, H200, batch, 1024), rel=1e-9)
    assert r.pass_fraction == pytest.approx(r.pass_s / r.step_s)
    assert r.pass_fraction < 0.01  # the lesson's point: under a percent of the step


def test_sampling_prompt_logprobs():
    r = ex.sampling_prompt_logprobs_example("llama-3.1-8b", "h200", 8192)
    assert r.logits_bytes == 8192 * 128256 * 4
    assert r.lm_head_s == pytest.approx(2 * 128256 * 4096 * 8192 / 989.5e12, rel=1e-12)
    assert r.lm_head_s * 1e3 == pytest.approx(8.7, abs=0.05)


def test_lifecycle_serial_loop():
    r = ex.lifecycle_serial_loop_example("llama-3.1-8b", "h200", 1024, 0.001)
    step = decode_floor_s(LLAMA, H200, 1, 1024)
    assert r.gpu_step_s == pytest.approx(step, rel=1e-9)
    assert r.gpu_idle_fraction == pytest.approx(0.001 / (step + 0.001), rel=1e-9)
    assert ex.lifecycle_serial_loop_example("llama-3.1-8b", "h200", 1024, 0.0).gpu_idle_fraction == 0


def test_tuning_tpot_relax():
    qwen = specs.get_model("qwen3-4b")

    def largest(target_s: float) -> int:
        b = 1
        while decode_floor_s(qwen, H100, b + 1, 2048) <= target_s:
            b += 1
        return b

    tight, loose = largest(0.010), largest(0.025)
    r = ex.tuning_tpot_relax_example("qwen3-4b", "h100-sxm", 2048, 0.010, 0.025)
    assert (r.tight_batch, r.loose_batch) == (tight, loose)
    assert r.batch_ratio == pytest.approx(loose / tight)
    per_token = lambda b: b / decode_floor_s(qwen, H100, b, 2048)  # noqa: E731
    assert r.throughput_gain == pytest.approx(per_token(loose) / per_token(tight), rel=1e-9)
    assert r.throughput_gain < r.batch_ratio  # each step is slower at the larger batch


@pytest.mark.parametrize("call, name", [
    (lambda: ex.prefix_cache_hit_example("llama-3.1-8b", "h100-sxm", 0, 200), "shared_tokens"),
    (lambda: ex.prefix_cache_hit_example("llama-3.1-8b", "h100-sxm", 2000, -1), "user_tokens"),
    (lambda: ex.prefix_cache_copies_example("llama-3.1-8b", "h100-sxm", 2000, 0), "copies"),
    (lambda: ex.sampling_pass_example("llama-3.1-8b", "h200", 0, 1024), "batch"),
    (lambda: ex.sampling_prompt_logprobs_example("llama-3.1-8b", "h200", 0), "prompt_tokens"),
    (lambda: ex.lifecycle_serial_loop_example("llama-3.1-8b", "h200", 1024, -0.001), "cpu_s"),
    (lambda: ex.tuning_tpot_relax_example("qwen3-4b", "h100-sxm", 2048, 0.0001, 0.025), "tight_tpot_s"),
    (lambda: ex.tuning_tpot_relax_example("qwen3-4b", "h100-sxm", 2048, 0.025, 0.010), "loose_tpot_s"),
])
def test_bad_counts_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("fn", ex.EXAMPLES)
def test_unknown_model_is_a_spec_error(fn):
    args = {"prefix_cache_hit_example": (2000, 200), "prefix_cache_copies_example": (2000, 100),
            "sampling_pass_example": (64, 1024), "sampling_prompt_logprobs_example": (8192,),
            "lifecycle_serial_loop_example": (1024, 0.001),
            "tuning_tpot_relax_example": (2048, 0.010, 0.025)}[fn.__name__]
    with pytest.raises(specs.SpecError, match="no-such-model"):
        fn("no-such-model", "h200", *args)
