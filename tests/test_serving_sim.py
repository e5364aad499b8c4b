"""The serving simulator's claims, checked on small traces (CPU, no torch).

Each test states a behaviour the lessons rely on: continuous batching beats
static batching only when lengths vary, chunked prefill bounds the decode stall
by the token budget, a KV pool that admitted requests outgrow forces
preemptions that capacity knobs remove, and the speculative-decoding closed
form matches simulated acceptances.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from labs.serving_sim import metrics as report
from labs.serving_sim import scenarios, spec_decode
from labs.serving_sim.cost import Chunk, Roofline
from labs.serving_sim.defaults import batch_defaults
from labs.serving_sim.driver import run_continuous, run_static, sim_config
from labs.serving_sim.trace import LengthRange, make_trace
from labs.specs import SpecError, get_gpu, get_model

ROOT = Path(__file__).resolve().parent.parent

MODELS = ["llama-3.1-8b", "qwen3-8b"]
GPUS = ["h200", "h100-sxm"]
ALPHAS = [0.0, 0.3, 0.6, 0.8, 0.95, 1.0]
KS = [1, 3, 7]
BUDGETS = [256, 1000, 4096]  # 1000: not a multiple of the block size


@pytest.fixture(scope="module")
def llama_h200() -> Roofline:
    return Roofline(get_model("llama-3.1-8b"), get_gpu("h200"))


def _cfg(**kw) -> EngineConfig:
    base = dict(max_num_seqs=32, max_num_batched_tokens=4096, num_blocks=20000, block_size=16)
    base.update(kw)
    return sim_config(**base)


# ---------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpu", GPUS)
def test_decode_at_batch_one_is_weight_read_time(model, gpu):
    """A batch-1 decode step is memory-bound: about the weights over HBM bandwidth."""
    c = Roofline(get_model(model), get_gpu(gpu))
    weights_s = c.weight_bytes_per_step / (get_gpu(gpu).hbm_bandwidth_tbps * 1e12)
    assert c.decode_step_time(1, 1) == pytest.approx(weights_s, rel=1e-3)


def test_batching_decode_is_nearly_free_below_the_ridge(llama_h200):
    """64 decodes cost far less than 64 single decodes; a long prefill is compute-bound."""
    one, many = llama_h200.decode_step_time(1, 512), llama_h200.decode_step_time(64, 512)
    assert many < 2 * one
    prefill = llama_h200.step_time([Chunk(8192, 0)])
    assert prefill == pytest.approx(llama_h200.step_flops([Chunk(8192, 0)]) / llama_h200.flops)
    assert 100 < llama_h200.ridge_tokens() < 400


def test_uniform_step_matches_list_step(llama_h200):
    for batch, new, cached in [(1, 1, 0), (7, 1, 1023), (3, 513, 0)]:
        assert llama_h200.uniform_step_time(batch, new, cached) == pytest.approx(
            llama_h200.step_time([Chunk(new, cached)] * batch))


def test_moe_and_sliding_models_are_refused():
    for name in ("mixtral-8x7b", "deepseek-v3", "gemma-2-9b"):
        with pytest.raises(SpecError, match="dense full-attention"):
            Roofline(get_model(name), get_gpu("h200"))


# ---------------------------------------------------------------------------
# Static vs continuous batching
# ---------------------------------------------------------------------------


def test_continuous_beats_static_when_output_lengths_vary(llama_h200):
    trace = make_trace(160, LengthRange(128, 1024), LengthRange(8, 256), seed=1)
    st = report.summary(run_static(trace, llama_h200, 32, 20000))
    co = report.summary(run_continuous(trace, llama_h200, _cfg()))
    assert co["output_tok_per_s"] > 1.5 * st["output_tok_per_s"]
    assert co["ttft_mean_s"] < st["ttft_mean_s"]
    assert st["wasted_token_fraction"] > 0.2  # padding and finished rows
    assert co["wasted_token_fraction"] == 0.0


def test_no_gain_without_length_spread(llama_h200):
    """Equal prompts and outputs, all arriving together: continuous ~ static (within 5%)."""
    trace = make_trace(128, LengthRange(512, 512), LengthRange(128, 128), seed=2)
    st = report.summary(run_static(trace, llama_h200, 32, 20000))
    co = report.summary(run_continuous(trace, llama_h200, _cfg()))
    assert co["output_tok_per_s"] == pytest.approx(st["output_tok_per_s"], rel=0.05)


@pytest.mark.parametrize("budget", BUDGETS)
def test_every_step_respects_budget_seqs_and_pool(llama_h200, budget):
    trace = make_trace(60, LengthRange(100, 3000), LengthRange(1, 300), rate=50.0, seed=3)
    cfg = _cfg(max_num_batched_tokens=budget, max_num_seqs=12, num_blocks=900)
    res = run_continuous(trace, llama_h200, cfg, record=True)
    assert res.step_log and all(tokens <= budget for _, tokens, _, _ in res.step_log)
    assert all(reqs <= 12 for _, _, reqs, _ in res.step_log)
    assert all(used <= 900 for *_, used in res.step_log)
    # Every request finishes with exactly its output length, preempted or not.
    assert all(r.num_output == r.params.max_tokens and r.finish_time is not None for r in res.requests)
    assert all(len(r.token_times) == r.params.max_tokens for r in res.requests)


def test_runs_are_deterministic(llama_h200):
    trace = make_trace(40, LengthRange(64, 900), LengthRange(4, 200), rate=30.0, seed=9)
    a = report.summary(run_continuous(trace, llama_h200, _cfg()))
    b = report.summary(run_continuous(make_trace(40, LengthRange(64, 900), LengthRange(4, 200), rate=30.0, seed=9),
                                      llama_h200, _cfg()))
    assert a == b


# ---------------------------------------------------------------------------
# Chunked prefill
# ---------------------------------------------------------------------------


def _long_prompt_run(cost, chunked: bool, budget: int):
    decodes = make_trace(16, LengthRange(256, 256), LengthRange(400, 400), seed=4)
    long_req = make_trace(1, LengthRange(12000, 12000), LengthRange(4, 4), start=0.3, first_rid=16, seed=4)
    cfg = _cfg(max_num_batched_tokens=budget, enable_chunked_prefill=chunked, max_model_len=16384)
    res = run_continuous(decodes + long_req, cost, cfg)
    lr = next(r for r in res.requests if r.seq_id == 16)
    gaps = report.itls([r for r in res.requests if r.seq_id < 16], 0.3, lr.first_token_time)
    return max(gaps), lr.first_token_time - 0.3


@pytest.mark.parametrize("budget", BUDGETS)
def test_chunked_prefill_bounds_the_decode_stall(llama_h200, budget):
    """With chunking, no decode gap exceeds one budget-sized step; without, it spans the whole prefill."""
    stall_off, ttft_off = _long_prompt_run(llama_h200, False, budget)
    stall_on, ttft_on = _long_prompt_run(llama_h200, True, budget)
    whole_prefill = llama_h200.step_time([Chunk(12000, 0)])
    assert stall_off >= 0.95 * whole_prefill
    # One step of `budget` tokens attending to the whole prompt, plus the decodes: the worst a gap can be.
    worst_step = llama_h200.step_time([Chunk(budget, 12000)] + [Chunk(1, 700)] * 16)
    assert stall_on <= worst_step
    assert stall_on < stall_off / 2
    assert ttft_on >= 0.99 * ttft_off  # chunking never makes the long prompt's first token earlier here


def test_chunking_off_raises_budget_to_max_model_len():
    cfg = _cfg(max_num_batched_tokens=2048, enable_chunked_prefill=False, max_model_len=32768)
    assert cfg.token_budget == 32768


# ---------------------------------------------------------------------------
# Preemption
# ---------------------------------------------------------------------------


def test_small_pool_preempts_and_recomputes(llama_h200):
    trace = make_trace(32, LengthRange(256, 256), LengthRange(512, 512), seed=5)
    res = run_continuous(trace, llama_h200, _cfg(num_blocks=600, max_num_seqs=32))
    assert res.preemptions > 0 and res.recomputed_tokens > 0
    assert report.summary(res)["requests_finished"] == 32


def test_capacity_knobs_stop_preemption(llama_h200):
    """Admitting only what the pool holds at full length (max_num_seqs x (prompt + output) <= slots) never preempts."""
    trace = make_trace(32, LengthRange(256, 256), LengthRange(512, 512), seed=5)
    slots = 600 * 16
    seqs = slots // (256 + 512)
    assert run_continuous(trace, llama_h200, _cfg(num_blocks=600, max_num_seqs=seqs)).preemptions == 0
    assert run_continuous(trace, llama_h200, _cfg(num_blocks=32 * 48, max_num_seqs=32)).preemptions == 0


def test_request_that_can_never_fit_is_an_error(llama_h200):
    trace = make_trace(1, LengthRange(4000, 4000), LengthRange(10, 10))
    with pytest.raises(SpecError, match="could never finish"):
        run_continuous(trace, llama_h200, _cfg(num_blocks=100))


# ---------------------------------------------------------------------------
# Speculative decoding
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("k", KS)
def test_expected_tokens_matches_monte_carlo(alpha, k):
    trials = 20000
    formula = spec_decode.expected_tokens(alpha, k)
    mc = spec_decode.monte_carlo_tokens(alpha, k, trials, seed=7)
    # Tokens per step lie in [1, k + 1]: standard error <= k / (2 sqrt(trials)); allow 4 of them.
    assert abs(mc - formula) <= 4 * k / (2 * math.sqrt(trials)) + 1e-12
    assert 1.0 <= formula <= k + 1


def test_expected_tokens_limits():
    assert spec_decode.expected_tokens(0.0, 5) == 1.0
    assert spec_decode.expected_tokens(1.0, 5) == 6.0
    assert spec_decode.expected_tokens(0.5, 1) == pytest.approx(1.5)


def test_draft_acceptance_rate_is_not_alpha():
    """vLLM's accepted/drafted ratio under i.i.d. acceptance: 0.51 at alpha 0.7, k 3; equal to alpha at k 1."""
    assert spec_decode.draft_acceptance_rate(0.7, 3) == pytest.approx((0.7 - 0.7 ** 4) / (3 * 0.3))
    assert spec_decode.draft_acceptance_rate(0.7, 3) == pytest.approx(0.511, abs=1e-3)
    assert spec_decode.draft_acceptance_rate(0.7, 1) == pytest.approx(0.7)
    rng = random.Random(3)
    drafted = accepted = 0
    per_pos, drafts = [0, 0, 0], 20000
    for _ in range(drafts):
        n = 0
        while n < 3 and rng.random() < 0.7:
            per_pos[n] += 1
            n += 1
        drafted, accepted = drafted + 3, accepted + n
    assert accepted / drafted == pytest.approx(spec_decode.draft_acceptance_rate(0.7, 3), abs=0.01)
    assert spec_decode.per_position_alpha(per_pos, drafts) == pytest.approx([0.7] * 3, abs=0.02)
    assert spec_decode.alpha_from_mean_accepted(accepted / drafts, 3) == pytest.approx(0.7, abs=0.01)


def test_alpha_from_mean_accepted_inverts_expected_tokens():
    for alpha in (0.0, 0.3, 0.7, 0.95):
        mean = spec_decode.expected_tokens(alpha, 4) - 1
        assert spec_decode.alpha_from_mean_accepted(mean, 4) == pytest.approx(alpha, abs=1e-9)
    with pytest.raises(SpecError, match="mean accepted"):
        spec_decode.alpha_from_mean_accepted(5, 4)


def test_speedup_approaches_expected_tokens_for_a_free_drafter_at_batch_one(llama_h200):
    """ngram drafts cost nothing and a batch-1 verify is memory-bound: speedup ~ E[tokens]."""
    d = spec_decode.make_drafter("ngram", llama_h200)
    for alpha, k in [(0.6, 3), (0.8, 5)]:
        s = spec_decode.speedup(llama_h200, d, alpha, k, batch=1, context=1024)
        assert s == pytest.approx(spec_decode.expected_tokens(alpha, k), rel=0.02)


def test_speculation_backfires_at_large_batch(llama_h200):
    d = spec_decode.make_drafter("eagle", llama_h200)
    assert spec_decode.speedup(llama_h200, d, 0.7, 3, batch=1, context=1024) > 1.5
    assert spec_decode.speedup(llama_h200, d, 0.5, 5, batch=1024, context=256) < 1.0
    # Low acceptance with a costly k loses even at batch 1.
    assert spec_decode.speedup(llama_h200, d, 0.1, 7, batch=1, context=1024) < 1.0


def test_draft_model_must_share_vocab(llama_h200):
    with pytest.raises(SpecError, match="tokenizer"):
        spec_decode.make_drafter("qwen3-4b", llama_h200)


# ---------------------------------------------------------------------------
# vLLM defaults from labs/data/vllm.yaml
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("gpu,tokens,seqs", [("h200", 8192, 1024), ("h100-sxm", 8192, 1024),
                                             ("a100-80gb", 2048, 256), ("l40s", 2048, 256),
                                             ("b200", 16384, 1024)])
def test_serve_batch_defaults_per_gpu(gpu, tokens, seqs):
    d = batch_defaults(get_gpu(gpu), "serve")
    assert (d.max_num_batched_tokens, d.max_num_seqs) == (tokens, seqs)


def test_batch_default_adjustments():
    h200 = get_gpu("h200")
    assert batch_defaults(h200, "llm").max_num_batched_tokens == 16384
    thr = batch_defaults(h200, "serve", performance_mode="throughput")
    assert (thr.max_num_batched_tokens, thr.max_num_seqs) == (16384, 2048)
    assert batch_defaults(h200, "serve", max_model_len=32768, enable_chunked_prefill=False).max_num_batched_tokens == 32768
    assert batch_defaults(h200, "serve", max_model_len=4).max_num_batched_tokens == 4096  # 1024 seqs x 4 tokens


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labs.serving_sim", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_cli_prints_a_table_writes_json_and_is_deterministic(tmp_path):
    args = ("spec-decode", "--trials", "2000", "--batches", "1,64")
    first, second = _cli(*args, "--out", str(tmp_path)), _cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert "| alpha \\ k |" in first.stdout and "derived (simulator)" in first.stdout
    data = json.loads((tmp_path / "spec-decode.json").read_text())
    assert data["command"] == "spec-decode" and data["data"]["max_abs_gap"] < 0.1


@pytest.mark.parametrize("args,message", [
    (("batching", "--model", "mixtral-8x7b"), "dense full-attention"),
    (("batching", "--prompt-len", "9:3"), "lo <= hi"),
    (("preemption", "--cases", "10x4"), "could never finish"),
    (("spec-decode", "--alpha", "1.5"), "argument --alpha: expected a finite number in [0, 1]"),
    (("knobs", "--gpu", "tpu"), "unknown GPU"),
])
def test_cli_bad_input_names_the_problem(args, message):
    proc = _cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.parametrize("args,message", [
    (("batching", "--requests", "1000000000"), "--requests"),
    (("batching", "--requests", "20000", "--prompt-len", "4096"), "50,000,000 tokens"),
    (("knobs", "--rate", "nan"), "--rate"),
    (("chunked-prefill", "--arrival", "nan"), "--arrival"),
    (("chunked-prefill", "--arrival", "inf"), "--arrival"),
    (("batching", "--step-overhead-ms", "nan"), "--step-overhead-ms"),
    (("batching", "--step-overhead-ms", "inf"), "--step-overhead-ms"),
    (("batching", "--gpu-memory-utilization", "nan"), "--gpu-memory-utilization"),
    (("spec-decode", "--trials", "1000000000"), "--trials"),
    (("spec-decode", "--alphas", "0.5,nan"), "argument --alphas: in '0.5,nan': expected a finite number in [0, 1]"),
    (("preemption", "--cases", "99999999999x4"), "--cases"),
    (("batching", "--num-gpu-blocks-override", "99999999999"), "--num-gpu-blocks-override"),
])
def test_cli_bounds_every_run(args, message):
    """Runs stay short: huge counts, NaN and inf are refused before anything is simulated."""
    proc = _cli(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_cli_out_must_be_a_writable_folder(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = _cli("defaults", "--out", str(afile))
    assert proc.returncode == 2 and "not a folder" in proc.stderr
    proc = _cli("defaults", "--out", str(afile / "sub"))
    assert proc.returncode == 2 and "cannot write" in proc.stderr and "Traceback" not in proc.stderr


def test_scenarios_label_their_numbers_as_derived():
    s = scenarios.setup("llama-3.1-8b", "h200")
    _, text = scenarios.sampling(s)
    assert scenarios.LABEL in text and "measured" not in text.replace("not measured", "")


def test_chunked_prefill_runs_only_configs_vllm_accepts():
    """A budget below the default max_num_seqs lowers it (vLLM's EngineArgs); below an explicit one is refused."""
    data, text = scenarios.chunked_prefill(scenarios.setup("llama-3.1-8b", "h200"), budgets=(512, 2048))
    assert data["rows"]["on, 512"]["max_num_seqs"] == 512
    assert data["rows"]["on, 2,048"]["max_num_seqs"] == data["rows"]["off"]["max_num_seqs"] == 1024
    assert "| max_num_seqs |" in text
    explicit = scenarios.setup("llama-3.1-8b", "h200", max_num_seqs=1024)
    with pytest.raises(SpecError, match="--budgets: 512 is below --max-num-seqs 1,024"):
        scenarios.chunked_prefill(explicit, budgets=(512,))
    assert scenarios.setup("llama-3.1-8b", "h200", max_num_batched_tokens=512).max_num_seqs == 512
    tight = scenarios.setup("llama-3.1-8b", "h200", max_num_batched_tokens=4096, max_model_len=20000)
    with pytest.raises(SpecError, match="below max_model_len 20,000 with chunked prefill off"):
        scenarios.chunked_prefill(tight, budgets=(2048,))


def test_cli_refuses_a_budget_below_an_explicit_max_num_seqs():
    proc = _cli("chunked-prefill", "--max-num-seqs", "1024", "--budgets", "512")
    assert proc.returncode == 2 and "argument --budgets" in proc.stderr and "Traceback" not in proc.stderr
