"""The cost model (labs/roofline.py) against values derived by hand from the model and GPU data files.

Each expected value is written out from config.json geometry and datasheet
figures, not recomputed through the module, so a change to what counts (the
embedding, the LM head, causal halving, MoE activity, MLA latents) fails here.
"""

import math
from pathlib import Path

import pytest

from labs import roofline as r
from labs.specs import get_gpu, get_model

ROOT = Path(__file__).resolve().parent.parent


# --- Llama-3.1-8B on an H200, bf16, TP 1 -------------------------------------
# params 8,030,261,248; embedding table = LM head = 128,256 x 4,096 = 525,336,576 (untied)
L8_TABLE = 128_256 * 4_096
L8_BODY = 8_030_261_248 - 2 * L8_TABLE  # 6,979,588,096: every token passes through these
L8_KV = 32 * 2 * 8 * 128 * 2  # layers x (K,V) x KV heads x head dim x bytes = 131,072
L8_PAIR = 4 * 32 * 32 * 128  # QK^T + PV, 2 x d each, per head per layer per (query, key) pair


@pytest.fixture(scope="module")
def l8():
    return r.deployment("llama-3.1-8b", "h200")


def test_llama8b_weights_and_kv(l8):
    assert L8_BODY == 6_979_588_096
    assert r.weight_bytes(l8) == 8_030_261_248 * 2
    assert r.kv_bytes_per_token(l8) == L8_KV == 131_072


def test_llama8b_decode_reads_weights_once_without_the_embedding(l8):
    step = r.decode(l8, 1, 1024)
    weights = (L8_BODY + L8_TABLE) * 2  # 15,009,849,344: the LM head is read, the input table is not
    assert step.weight_bytes == weights == 15_009_849_344
    assert step.kv_read_bytes == 1024 * L8_KV
    assert step.kv_write_bytes == L8_KV
    assert step.flops == 2 * (L8_BODY + L8_TABLE) + L8_PAIR * 1025
    assert step.memory_s == pytest.approx((weights + 1025 * L8_KV) / 4.8e12)
    assert step.bound == "memory"
    assert step.floor_s == pytest.approx(3.155e-3, abs=1e-6)


def test_llama8b_batched_decode_shares_the_weights(l8):
    one, many = r.decode(l8, 1, 4096), r.decode(l8, 64, 4096)
    assert many.weight_bytes == one.weight_bytes
    assert many.kv_read_bytes == 64 * one.kv_read_bytes
    assert many.flops == pytest.approx(64 * one.flops)


def test_llama8b_prefill_is_causal_halved_and_samples_once(l8):
    n = 2048
    step = r.prefill(l8, n)
    # LM head on the last row only; n(n+1)/2 causal pairs
    assert step.flops == 2 * L8_BODY * n + 2 * L8_TABLE + L8_PAIR * n * (n + 1) // 2
    assert step.kv_write_bytes == n * L8_KV and step.kv_read_bytes == 0
    assert step.compute_s == pytest.approx(step.flops / 989.5e12)
    assert step.bound == "compute"


def test_llama8b_ridge(l8):
    ridge = r.ridge(l8)
    assert ridge.flop_per_byte == pytest.approx(989.5 / 4.8)  # 206.1
    # decode batch B: 2 (body + head) B FLOPs against 2 (body + head) bytes: B = F / BW
    assert ridge.decode_batch == pytest.approx(989.5 / 4.8, rel=1e-9)
    # prefill of n: 2 body n + 2 head = F / BW x 2 (body + head)  ->  n = 221.6
    n = (989.5e12 / 4.8e12 * 2 * (L8_BODY + L8_TABLE) - 2 * L8_TABLE) / (2 * L8_BODY)
    assert ridge.prefill_tokens == pytest.approx(n, rel=1e-9)
    assert round(ridge.prefill_tokens) == 222 and round(ridge.decode_batch) == 206


def test_llama8b_pool_matches_the_recorded_h200_check(l8):
    from labs import recorded

    check = recorded.load_results(ROOT / "labs/results/kv_alloc_check.json").machine("NVIDIA H200")
    expected = check.row(label="gqa-bf16")["budget"]
    pool = r.kv_pool(l8, 8192)
    # cudaMemGetInfo's 143,155 MiB (gpus.yaml; 150,109,880,320 bytes measured) x 0.92,
    # less weights, activation peak, non-torch memory and CUDA graphs
    assert pool.total_memory == 143_155 * 2**20 and pool.total_measured
    assert pool.requested_memory == math.ceil(143_155 * 2**20 * 0.92)
    assert pool.weights == 16_060_522_496
    assert pool.kv_pool == pool.requested_memory - pool.weights - pool.activation_peak - pool.non_torch - pool.cudagraph
    assert pool.kv_pool == pytest.approx(expected["kv_pool"], abs=2**20)  # the file rounds the total to MiB
    assert pool.num_blocks == expected["num_blocks"] == 57_158


def test_measured_bandwidth_is_the_recorded_copy_bandwidth():
    from labs.paged_attention.report import load_results

    # The latest recorded run of the paged-attention lab on the H200 is the source, whatever it measured.
    runs = [run for run in load_results().machine("NVIDIA H200").runs if run.get("copy_tb_s")]
    latest = max(runs, key=lambda run: run["date"])
    measured = r.deployment("llama-3.1-8b", "h200", bandwidth="measured")
    assert measured.memory_bandwidth.bytes_per_s == pytest.approx(float(latest["copy_tb_s"]) * 1e12)
    assert measured.memory_bandwidth.source == "measured"
    assert latest["date"] in measured.memory_bandwidth.label
    datasheet = r.deployment("llama-3.1-8b", "h200")
    assert r.decode(measured, 1, 0).memory_s == pytest.approx(
        r.decode(datasheet, 1, 0).memory_s * 4.8 / float(latest["copy_tb_s"]))
    assert r.has_measured_bandwidth(get_gpu("h200")) and not r.has_measured_bandwidth(get_gpu("a100-80gb"))
    with pytest.raises(r.CostModelError, match="no measured copy bandwidth for a100-80gb"):
        r.deployment("llama-3.1-8b", "a100-80gb", bandwidth="measured").memory_bandwidth
    with pytest.raises(r.CostModelError, match="bandwidth source must be one of datasheet, measured"):
        r.deployment("llama-3.1-8b", "h200", bandwidth="peak")


# --- Llama-3.1-70B on H100 SXM, TP 4 -----------------------------------------


def test_llama70b_tp4_is_one_ranks_share():
    dep = r.deployment("llama-3.1-70b", "h100-sxm", tp=4)
    table = 128_256 * 8_192
    assert r.weight_bytes(dep) == 70_553_706_496 * 2 // 4 == 35_276_853_248
    # 8 KV heads over 4 ranks: 2 per rank
    assert r.kv_bytes_per_token(dep) == 80 * 2 * 2 * 128 * 2 == 81_920
    step = r.decode(dep, 8, 4096)
    assert step.weight_bytes == (70_553_706_496 - table) * 2 / 4
    assert step.kv_read_bytes == 8 * 4096 * 81_920
    pair = 4 * 80 * 64 * 128
    assert step.flops == pytest.approx((8 * 2 * (70_553_706_496 - table) + 8 * pair * 4097) / 4)
    assert step.memory_s == pytest.approx(step.bytes / 3.35e12)
    assert r.ridge(dep).flop_per_byte == pytest.approx(989.5 / 3.35)
    pool = r.kv_pool(dep, 8192)
    assert pool.weights == 35_276_853_248
    assert not pool.total_measured  # no cudaMemGetInfo total recorded for the H100: nvidia-smi's, an upper bound
    assert pool.total_memory == 81_559 * 2**20


def test_tp_must_divide_the_heads():
    with pytest.raises(r.SpecError, match="not divisible by tensor parallel size 3"):
        r.deployment("llama-3.1-70b", "h100-sxm", tp=3)


# --- Mixtral-8x7B: active vs total -------------------------------------------


def test_mixtral_active_and_total():
    dep = r.deployment("mixtral-8x7b", "h100-sxm")
    routed = 32 * 8 * 3 * 4_096 * 14_336  # 45,097,156,608
    table = 32_000 * 4_096
    split = dep.params
    assert split.routed_experts == routed
    # Mistral's 12.9B "active" counts the input table; the FLOPs do not (it is a lookup)
    assert split.active + table == 12_879_925_248 == get_model("mixtral-8x7b").params_active  # 2 of 8 experts
    one = r.decode(dep, 1, 0)
    # one token touches 2 of 8 experts per layer: the active weights, less the input table
    assert one.weight_bytes == pytest.approx((12_879_925_248 - table) * 2)
    # a big batch touches 1 - (3/4)^B of them: nearly every weight
    big = r.decode(dep, 256, 0)
    assert big.weight_bytes == pytest.approx((46_702_792_704 - table) * 2, rel=1e-12)
    # FLOPs follow the active parameters however many experts the batch touches
    assert big.flops == pytest.approx(256 * (2 * (12_879_925_248 - table) + 4 * 32 * 32 * 128))
    assert r.weight_bytes(dep) == 46_702_792_704 * 2


# --- DeepSeek-V3: MLA latent, fp8 weights ------------------------------------


def test_deepseek_v3_mla():
    dep = r.deployment("deepseek-v3", "h200", tp=8)
    # one latent of kv_lora_rank + rope = 512 + 64 per layer per token, bf16, on every rank
    assert r.kv_bytes_per_token(dep) == 61 * 576 * 2 == 70_272
    # fp8: one byte per matmul weight; the embedding and LM head (129,280 x 7,168 each) stay bf16
    tables = 2 * 129_280 * 7_168
    assert r.weight_bytes(dep) == (671_000_000_000 - tables) // 8 + tables * 2 // 8
    assert dep.compute_dtype == "fp8" and dep.flops_per_s == 1979e12
    assert r.deployment("deepseek-v3", "a100-80gb", tp=8).compute_dtype == "bf16"  # no fp8 tensor cores
    # active parameters from the geometry: 8 of 256 routed experts of 58 MoE layers
    split = dep.params
    assert split.routed_experts == 58 * 256 * 3 * 7_168 * 2_048
    assert split.active + split.embedding == pytest.approx(37e9, rel=0.02)  # the report's "37B activated"
    # decode attends in the latent space, prefill in per-head K/V of width 192 (and V 128)
    absorbed = 2 * 128 * 576 + 2 * 128 * 512
    expanded = 2 * 128 * 192 + 2 * 128 * 128
    d0, d1 = r.decode(dep, 1, 1000), r.decode(dep, 1, 2000)
    assert d1.flops - d0.flops == pytest.approx(61 * absorbed * 1000 / 8)
    assert d1.kv_read_bytes - d0.kv_read_bytes == 1000 * 70_272
    p0, p1 = r.prefill(dep, 64), r.prefill(dep, 128)
    matmul = 2 * (split.body + split.routed_experts / 32) * 64
    causal = 128 * 129 // 2 - 64 * 65 // 2
    assert p1.flops - p0.flops == pytest.approx((matmul + 61 * expanded * causal) / 8)


# --- Sliding windows, mixed steps, rules -------------------------------------


@pytest.mark.parametrize("cached,new,window", [(0, 1, 4), (0, 10, 4), (3, 5, 4), (10, 3, 4), (0, 7, 100), (4, 1, 4)])
def test_causal_keys_closed_form(cached, new, window):
    brute = sum(min(p, window) for p in range(cached + 1, cached + new + 1))
    assert r._causal_keys(cached, new, window) == brute
    assert r._causal_keys(cached, new) == sum(range(cached + 1, cached + new + 1))


def test_sliding_layers_attend_within_the_window():
    dep = r.deployment("gemma-2-9b", "h100-sxm")  # 21 sliding (W 4096), 21 full
    pair = 4 * 16 * 256
    short, long = r.decode(dep, 1, 3000), r.decode(dep, 1, 9000)
    # past the window only the 21 full layers add keys
    assert long.flops - short.flops == pytest.approx(pair * (21 * 6000 + 21 * (4096 - 3001)))


def test_mixed_step_is_the_sum_of_its_chunks(l8):
    chunks = [r.Chunk(512, 0, False), r.Chunk(256, 512, True), r.Chunk(1, 3000), r.Chunk(1, 100)]
    step = r.mixed(l8, chunks)
    assert step.tokens == 770 and step.sequences == 4
    alone = [r.mixed(l8, [c]) for c in chunks]
    assert step.flops == pytest.approx(sum(a.flops for a in alone))
    assert step.kv_read_bytes == (512 + 3000 + 100) * L8_KV
    assert step.weight_bytes == alone[0].weight_bytes  # read once for the whole step
    # the first chunk does not sample: no LM head row
    assert alone[0].flops == 2 * L8_BODY * 512 + L8_PAIR * 512 * 513 // 2
    with pytest.raises(r.CostModelError, match="at least one chunk"):
        r.mixed(l8, [])


def test_a_verify_chunk_runs_the_lm_head_on_every_scored_position(l8):
    """k drafts plus the bonus position: k + 1 LM-head rows, on both step paths."""
    one, five = r.Chunk(5, 1000), r.Chunk(5, 1000, 5)
    head_row = 2 * L8_TABLE
    assert r.mixed(l8, [five]).flops - r.mixed(l8, [one]).flops == pytest.approx(4 * head_row)
    assert r.uniform(l8, 8, five).flops - r.uniform(l8, 8, one).flops == pytest.approx(8 * 4 * head_row)
    with pytest.raises(r.CostModelError, match="0 to `new` rows"):
        r.mixed(l8, [r.Chunk(5, 1000, 6)])


def test_offline_throughput_bound_by_hand(l8):
    p, o, n, c = 1000, 101, 64, 32
    bound = r.offline_throughput_bound(l8, [(p, o)] * n, c)
    prefill = r.prefill(l8, p).flops
    assert bound.prefill_flops == n * prefill and bound.prefill_s == n * prefill / 989.5e12
    # 100 decode tokens per request after the prefill's first, in full batches of 32
    steps = n * 100 / c
    kv = n * sum((p + j - 1) + 1 for j in range(1, 101)) * L8_KV
    assert bound.decode_steps == steps
    assert bound.decode_bytes == pytest.approx(steps * 15_009_849_344 + kv)
    assert bound.decode_s == pytest.approx(bound.decode_bytes / 4.8e12)
    assert bound.output_tokens_per_s == pytest.approx(n * o / (bound.prefill_s + bound.decode_s))
    more = r.offline_throughput_bound(l8, [(p, o)] * n, 64)
    assert more.decode_s < bound.decode_s  # a fuller batch shares the weights over more tokens
    assert r.offline_throughput_bound(l8, [(p, o)] * n, 10_000).concurrency == n
    with pytest.raises(r.CostModelError, match="concurrency must be >= 1"):
        r.offline_throughput_bound(l8, [(p, o)], 0)


def test_no_torch_or_pydantic():
    import subprocess
    import sys

    code = ("import sys, labs.roofline as r; r.kv_pool(r.deployment('llama-3.1-8b', 'h200'), 8192); "
            "r.bandwidth(r.get_gpu('h200'), 'measured'); "
            "print(any(m in sys.modules for m in ('torch', 'pydantic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name,tp", [("llama-3.1-8b", 1), ("gemma-2-9b", 1), ("deepseek-v3", 8), ("mixtral-8x7b", 2)])
def test_mixed_agrees_with_uniform_steps(name, tp):
    """The engines' hot path (mixed, one chunk at a time) and the grouped path give the same step."""
    dep = r.deployment(name, "h200", tp=tp)
    chunks = [(300, 5000, False), (1, 4500), (1, 4500), (1, 10), (64, 0)]
    step = r.mixed(dep, chunks)
    parts = [r.uniform(dep, 1, r.Chunk(*c)) for c in chunks]
    assert step.flops == pytest.approx(sum(p.flops for p in parts))  # FLOPs add up; weights are read once
    assert step.kv_read_bytes == sum(p.kv_read_bytes for p in parts)
    assert step.kv_write_bytes == sum(p.kv_write_bytes for p in parts)
    assert step.tokens == 367 and step.sequences == 5


def test_step_growth_and_kv_to_weights_say_where_batching_is_free():
    d = r.deployment("llama-3.1-8b", "h200")
    one, big = r.decode(d, 1, 1024), r.decode(d, 64, 1024)
    assert d.step_growth(64, 1024) == pytest.approx(big.floor_s / one.floor_s)
    # 64 x 1,024 tokens x 128 KiB = 8 GiB of KV against 14.96 GiB of weights: not flat
    assert big.kv_to_weights == pytest.approx(64 * 1024 * 131072 / big.weight_bytes)
    assert 1.5 < d.step_growth(64, 1024) < 1.6
    assert r.decode(d, 64, 8192).kv_to_weights == pytest.approx(4.58, abs=0.01)
    assert d.step_growth(1, 1024) == 1


def test_kv_transfer_of_two_gib_at_400_gbit_is_about_43_ms():
    """16,384 tokens of Llama-3.1-8B KV are 2 GiB; at 400 Gb/s that is 2^31 x 8 / 4e11 s."""
    dep = r.deployment("llama-3.1-8b", "h200")
    t = dep.kv_transfer(16384, gbit_per_s=400)
    assert t.bytes == 2 * 2**30
    assert t.seconds == pytest.approx(2**31 * 8 / 400e9)
    # Per layer, keys and values apart, one piece per 16-token block: 1,024 blocks x 32 layers x 2.
    assert t.copies == 1024 * 32 * 2
    assert t.copy_bytes == 16 * 8 * 128 * 2
    assert dep.kv_transfer(16384, gb_per_s=50).seconds == pytest.approx(2**31 / 50e9)


def test_kv_transfer_needs_exactly_one_positive_link_speed():
    dep = r.deployment("llama-3.1-8b", "h200")
    for kwargs in ({}, {"gbit_per_s": 400, "gb_per_s": 50}, {"gbit_per_s": 0}):
        with pytest.raises(r.SpecError, match="kv_transfer"):
            dep.kv_transfer(1024, **kwargs)


def test_kv_transfer_over_nvlink_takes_one_direction_of_the_datasheet_figure():
    dep = r.deployment("llama-3.1-8b", "h200")
    t = dep.kv_transfer(16384, nvlink=True)
    assert t.seconds == pytest.approx(2**31 / (dep.gpu.nvlink_gbps / 2 * 1e9))
    with pytest.raises(r.SpecError, match="no NVLink"):
        r.deployment("llama-3.1-8b", "l40s").kv_transfer(1024, nvlink=True)


def test_tpot_rise_spreads_the_prefill_steps_extra_time_over_the_decode_tokens(l8):
    alone = r.decode(l8, 64, 1024).floor_s
    one = r.chunked_prefill(l8, 8192, None, 64, 1024)  # one step carries the whole prompt
    assert one.count == 1
    assert one.tpot_rise(200) == pytest.approx((one.worst_s - alone) / 200)
    assert one.tpot_rise_fraction(200) == pytest.approx(one.tpot_rise(200) / alone)
    chunked = r.chunked_prefill(l8, 8192, 2048, 64, 1024)  # four steps, each longer than a decode
    assert chunked.tpot_rise(200) == pytest.approx(sum(s.floor_s - alone for s in chunked.steps) / 200)
    with pytest.raises(r.CostModelError, match="cannot arrive once per 2"):
        chunked.tpot_rise(2)


def test_kv_read_limit_is_what_decode_tokens_per_s_tends_to(l8):
    limit = r.deployment("llama-3.1-8b", "h200").kv_read_limit(2048)
    assert limit == pytest.approx(4.8e12 / (2048 * 131072))
    assert r.decode(l8, 1 << 16, 2048).tokens_per_s == pytest.approx(limit, rel=0.01)
    assert r.decode(l8, 256, 2048).tokens_per_s < limit


def test_quantized_weights_keep_the_embedding_and_lm_head_16_bit():
    """fp8 and int4 price the matmul weights; the tables stay bf16, as vLLM 0.33 loads them."""
    bf16 = r.deployment("llama-3.1-8b", "h200")
    tables = 2 * 128_256 * 4_096  # untied: input embedding and LM head
    body = 8_030_261_248 - tables
    assert r.weight_bytes(bf16) == 8_030_261_248 * 2
    assert r.weight_bytes(r.deployment("llama-3.1-8b", "h200", weight_dtype="fp8")) == body + tables * 2
    int4 = r.deployment("llama-3.1-8b", "h200", weight_dtype="int4-g128")
    assert r.weight_bytes(int4) == math.ceil(body * 4.125 / 8 + tables * 2)
    # a decode step reads the body at the weight dtype and the LM head at 2 bytes (the embedding: its rows only)
    fp8 = r.deployment("llama-3.1-8b", "h200", weight_dtype="fp8")
    assert r.decode(fp8, 1, 0).weight_bytes == pytest.approx(body + 128_256 * 4_096 * 2)
    # a tied table is counted once (Qwen3-4B)
    q = r.deployment("qwen3-4b", "h200", weight_dtype="fp8")
    one_table = 151_936 * 2_560
    assert r.weight_bytes(q) == q.model.params - one_table + one_table * 2
