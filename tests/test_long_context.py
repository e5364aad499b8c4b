"""The long-context lab: RoPE scaling rules, the KV wall in the cost model, the decode bench's rows.

CPU: each rule against values derived by hand from its formula, the properties the lesson
states (PI maps s x p onto p's angle; YaRN and llama3 leave the fast pairs alone and divide
the slow ones by s), llama3 against the engine's torch implementation (Hugging Face's rule),
the KV wall against vLLM's block accounting, the bench rows from fake timings, the CLI.
GPU: the bench's case at small contexts against the fp32 reference, bf16 and fp8.
"""

from __future__ import annotations

import math

import pytest

from labs import roofline, specs
from labs.kv_sizing import formula
from labs.long_context import decode_bench, rope as R

M8 = specs.get_model("llama-3.1-8b")


def test_base_frequencies_are_theta_to_the_minus_two_i_over_d():
    f = R.base_inv_freq(128, 500000.0)
    assert len(f) == 64 and f[0] == 1.0
    assert math.isclose(f[1], 500000.0 ** (-2 / 128)) and math.isclose(f[63], 500000.0 ** (-126 / 128))
    assert all(a > b for a, b in zip(f, f[1:]))


@pytest.mark.parametrize("s,position", [(8.0, 8192), (4.0, 1000), (16.0, 4095)])
def test_pi_maps_position_s_times_p_onto_the_angle_of_p(s, position):
    plain, pi = R.Rope("rope", factor=s), R.Rope("pi", factor=s)
    for f, g in zip(R.inv_freq(plain), R.inv_freq(pi)):
        assert math.isclose(position * s * g, position * f, rel_tol=1e-12)
    assert R.reach(pi) == pytest.approx(s * pi.original_len)


def test_plain_rope_leaves_the_trained_angles_right_after_the_trained_length():
    r = R.Rope("rope")
    # Pairs with wavelength > L = 8192: 2 pi 500000^(2i/128) > 8192 for i >= 35, so 29 of 64.
    assert R.partial_pairs(r) == 29
    assert R.unseen_pairs(r, 8192) == 0 and R.unseen_pairs(r, 8193) == 29
    assert R.reach(r) == 8192


def test_ntk_keeps_the_fastest_pair_and_divides_the_slowest_by_s():
    s, d = 8.0, 128
    st = R.stretch(R.Rope("ntk", head_dim=d, factor=s))
    assert st[0] == pytest.approx(1.0)
    assert st[-1] == pytest.approx(s)
    # In between: s ** (2i / (d - 2)), rising with i.
    assert st[10] == pytest.approx(s ** (20 / 126))
    assert all(a < b for a, b in zip(st, st[1:]))


def test_yarn_leaves_fast_pairs_unscaled_and_divides_slow_ones_by_s():
    r = R.Rope("yarn", factor=8.0)
    base, st = R.base_inv_freq(128, 500000.0), R.stretch(r)
    for f, x in zip(base, st):
        turns = r.original_len * f / (2 * math.pi)
        if turns > 32:
            assert x == pytest.approx(1.0)
        elif turns < 1:
            assert x == pytest.approx(8.0)
        else:  # gamma = (turns - 1) / 31 and f' = (1 - gamma) f / s + gamma f
            gamma = (turns - 1) / 31
            assert x == pytest.approx(1 / ((1 - gamma) / 8 + gamma))
    assert R.logit_scale(r) == pytest.approx((0.1 * math.log(8) + 1) ** 2)
    assert R.logit_scale(R.Rope("pi")) == 1.0


def test_yarn_index_ramp_is_vllms_correction_range():
    # vLLM 0.33 common.py: low = floor(d ln(L / (32 * 2 pi)) / (2 ln theta)), high = ceil(same with 1 turn).
    r = R.Rope("yarn", factor=8.0, yarn_ramp="index")
    lo = math.floor(128 * math.log(8192 / (32 * 2 * math.pi)) / (2 * math.log(500000)))
    hi = math.ceil(128 * math.log(8192 / (2 * math.pi)) / (2 * math.log(500000)))
    st = R.stretch(r)
    assert (lo, hi) == (18, 35)  # 128 ln(8192 / 64 pi) / (2 ln 500000) = 18.08; 128 ln(8192 / 2 pi) / (2 ln 500000) = 34.98
    assert all(x == pytest.approx(1.0) for x in st[:lo + 1])
    assert all(x == pytest.approx(8.0) for x in st[hi:])
    mid = (lo + hi) // 2
    keep = 1 - (mid - lo) / (hi - lo)
    assert st[mid] == pytest.approx(1 / ((1 - keep) / 8 + keep))


def test_llama3_follows_its_piecewise_rule_on_llama_3_1s_config():
    r = R.for_model("llama3", M8)
    assert (r.factor, r.original_len, r.low_freq_factor, r.high_freq_factor) == (8.0, 8192, 1.0, 4.0)
    for f, g in zip(R.base_inv_freq(128, 500000.0), R.inv_freq(r)):
        lam = 2 * math.pi / f
        if lam < 8192 / 4:
            assert g == f
        elif lam > 8192:
            assert g == pytest.approx(f / 8)
        else:
            smooth = (8192 / lam - 1) / 3
            assert g == pytest.approx((1 - smooth) * f / 8 + smooth * f)
    st = R.stretch(r)
    assert sum(1 for x in st if x == 1.0) == 29 and sum(1 for x in st if x == pytest.approx(8.0)) == 29
    # Alone, the rule keeps every pair within its trained angles up to s x L = 65,536 positions.
    assert R.reach(r) == pytest.approx(65536)


def test_llama3_matches_the_engines_torch_rope():
    torch = pytest.importorskip("torch")
    from labs.engine.config import ModelConfig
    from labs.engine.model import rope_inv_freq

    ours = torch.tensor(R.inv_freq(R.for_model("llama3", M8)), dtype=torch.float64)
    theirs = rope_inv_freq(ModelConfig.from_spec("llama-3.1-8b")).double()
    assert torch.allclose(ours, theirs, rtol=1e-6)


def test_score_is_one_at_distance_zero_and_yarn_scales_it():
    assert R.score(R.Rope("rope"), 0) == pytest.approx(1.0)
    assert R.score(R.Rope("pi"), 0) == pytest.approx(1.0)
    assert R.score(R.Rope("yarn"), 0) == pytest.approx((0.1 * math.log(8) + 1) ** 2)
    # PI's score at s x p equals plain RoPE's at p.
    assert R.score(R.Rope("pi"), 8 * 3000) == pytest.approx(R.score(R.Rope("rope"), 3000))


@pytest.mark.parametrize("bad", [dict(method="alibi"), dict(method="pi", factor=0.5), dict(method="pi", head_dim=7),
                                 dict(method="yarn", yarn_alpha=40), dict(method="llama3", low_freq_factor=5)])
def test_impossible_rules_are_refused(bad):
    with pytest.raises(R.RopeError):
        R.Rope(**bad)


# ---------------------------------------------------------------------------
# The KV wall (labs/roofline.py max_context)
# ---------------------------------------------------------------------------


def test_the_kv_wall_is_the_pools_whole_blocks_for_full_attention():
    dep = roofline.deployment("llama-3.1-8b", "h200")
    wall, pool = dep.max_context(), dep.kv_pool(8192)
    blocks = (pool.kv_pool - pool.bytes_per_block) // pool.bytes_per_block
    assert wall.tokens == blocks * pool.block_size
    assert wall.positions == 131072 and wall.max_model_len == 131072 and wall.bound == "positions"
    # vLLM's own estimate agrees where it searches (up to the model's positions).
    assert dep.kv_pool(wall.tokens).fits_one_request
    assert not dep.kv_pool(wall.tokens + pool.block_size).fits_one_request


def test_fp8_kv_doubles_the_wall_and_requests_share_it():
    bf = roofline.deployment("llama-3.1-8b", "h200").max_context()
    f8 = roofline.deployment("llama-3.1-8b", "h200", kv_dtype="fp8").max_context()
    assert f8.kv_bytes_per_token * 2 == bf.kv_bytes_per_token
    assert abs(f8.tokens - 2 * bf.tokens) <= 32  # the null block: one bf16 block is two fp8 blocks
    four = roofline.deployment("llama-3.1-8b", "h200").max_context(requests=4)
    assert four.tokens == (bf.tokens // 16 // 4) * 16


def test_a_large_model_on_a_small_gpu_hits_memory_before_positions():
    w = roofline.deployment("llama-3.1-70b", "h100-sxm", weight_dtype="fp8").max_context()
    assert w.bound == "memory" and 0 < w.tokens < 131072 and w.max_model_len == w.tokens


def test_sliding_window_layers_stop_growing_at_their_window():
    dep = roofline.deployment("gemma-3-12b", "h200")
    wall, pool = dep.max_context(), dep.kv_pool(8192)
    full = formula.kv_cache_groups(dep.model)
    # Past the window only the full-attention group grows: far more tokens than if all 48 layers were full.
    per_token_all = dep.model.n_layers * pool.layer_bytes_per_token
    assert wall.tokens > 4 * (pool.kv_pool // per_token_all)
    assert any(g.kind == "sliding" for g in full)


def test_max_context_refuses_no_requests():
    with pytest.raises(roofline.CostModelError):
        roofline.deployment("llama-3.1-8b", "h200").max_context(requests=0)


# ---------------------------------------------------------------------------
# The decode bench (plain-Python parts) and the CLI
# ---------------------------------------------------------------------------


def test_a_decode_row_counts_one_layers_kv_and_compares_with_the_cost_model():
    r = decode_bench.decode_row("bf16", 8, 131072, 1000.0, 4240.0, None)
    assert r["kv_bytes"] == 2 * 8 * 131072 * 8 * 128 * 2
    assert r["tb_s"] == pytest.approx(r["kv_bytes"] / 1000e-6 / 1e12, rel=1e-3)
    assert r["of_copy"] == pytest.approx(r["tb_s"] / 4.24, rel=1e-3)
    dep = roofline.deployment("llama-3.1-8b", "h200")
    assert r["model_us"] == pytest.approx(dep.decode(8, 131072).kv_read_s / 32 * 1e6, rel=1e-3)
    assert r["step_attention_ms"] == pytest.approx(32.0)
    f8 = decode_bench.decode_row("fp8", 8, 131072, 1000.0, 4240.0, None)
    assert f8["kv_bytes"] * 2 == r["kv_bytes"] and f8["model_us"] == pytest.approx(r["model_us"] / 2, rel=1e-3)


def test_printed_rows_and_config_names_cover_every_case():
    rows = [decode_bench.decode_row(kv, b, L, 10.0 + L / 1e4, 4240.0, None)
            for kv in decode_bench.KV_DTYPES for b in decode_bench.BATCHES for L in decode_bench.CONTEXTS]
    names = {decode_bench.config_name("decode", r) for r in rows}
    assert len(names) == len(rows) == 24
    text = decode_bench.printed({"decode": rows})["decode"]
    assert text.count("\n") == 24 and "131072" in text


def test_cli_rope_and_kv_wall_print_tables(capsys):
    from labs.long_context.__main__ import main

    assert main(["rope"]) == 0
    out = capsys.readouterr().out
    assert "29 of 64 pairs never turned fully" in out and "65,536" in out
    assert main(["kv-wall", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--weight-dtype", "fp8"]) == 0
    assert "memory" in capsys.readouterr().out


def test_cli_rejects_an_impossible_tensor_parallel_size_in_one_line(capsys):
    from labs.long_context.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["kv-wall", "--model", "qwen2.5-7b", "--tensor-parallel-size", "3"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--tensor-parallel-size" in err


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kv", decode_bench.KV_DTYPES)
def test_gpu_bench_case_matches_the_reference_at_small_contexts(kv):
    import torch

    from labs.gpu_harness.timing import event_timer

    rows, failed = decode_bench.run(torch, event_timer(torch, reps=3), 4000.0, 3, ("decode",), log=lambda *_: None,
                                    contexts=(4096, 8192), batches=(1, 8), kv_dtypes=(kv,))
    assert not failed
    rows = rows["decode"]
    assert len(rows) == 4 and all(r["rel_err"] is not None and r["rel_err"] < 2e-2 for r in rows)
    assert all(r["time_us"] > 0 for r in rows)


def test_the_bench_case_runs_and_checks_under_the_interpreter():
    """The GPU path on small shapes on the CPU (TRITON_INTERPRET=1): the reference check and the row."""
    torch = pytest.importorskip("torch")
    from labs.gpu_harness.timing import summarize

    def fake_time(fn):
        fn()
        return summarize([5.0])

    rows, failed = decode_bench.run(torch, fake_time, 4000.0, 1, ("decode",), log=lambda *_: None,
                                    contexts=(48,), batches=(2,), kv_dtypes=("bf16", "fp8"), device="cpu")
    assert not failed, failed
    assert [r["kv"] for r in rows["decode"]] == ["bf16", "fp8"]
    assert all(r["rel_err"] < 2e-2 and r["time_us"] == 5.0 for r in rows["decode"])
