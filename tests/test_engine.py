"""The engine on the CPU, fp32, tiny Llama: token-exact against transformers, and its books balance.

Decode attention runs labs/paged_attention's Triton kernel in the interpreter
(TRITON_INTERPRET=1, set by conftest.py) in the transformers comparison: at this size a
step takes tens of milliseconds there. The other tests use the runner's torch decode path
(the kernel lab's gather-then-attend reference) to stay fast; the two give the same tokens
(`test_decode_paths_agree`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from engine_helpers import hf_greedy, hf_reference, random_prompts, small_config
from labs.engine import LLM, SamplingParams
from labs.engine.block_manager import BlockManager
from labs.engine.config import ConfigError, EngineConfig
from labs.engine.scheduler import Scheduler
from labs.engine.sequence import RequestError, Sequence

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
CFG = small_config()
GREEDY = SamplingParams(max_tokens=10, temperature=0.0)


def _llm(**kw) -> LLM:
    args = dict(model_config=CFG, device="cpu", dtype="float32", decode_attention="torch", max_model_len=256,
                max_num_seqs=4, max_num_batched_tokens=32, block_size=8, num_blocks=64)
    args.update(kw)
    return LLM(**args)


def _record_steps(llm: LLM) -> list:
    """Keep every SchedulerOutput the engine runs."""
    seen, schedule = [], llm.scheduler.schedule

    def wrapped():
        out = schedule()
        seen.append([(c.seq.seq_id, c.start, c.num_tokens) for c in out.chunks] + [("preempted", len(out.preempted))])
        return out

    llm.scheduler.schedule = wrapped
    return seen


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    return hf_reference(_llm().model)


# ---------------------------------------------------------------------------
# Against transformers
# ---------------------------------------------------------------------------


def test_greedy_is_token_exact_with_batching_chunks_preemption_and_prefix_hits(hf):
    """Triton kernel (interpreter) for decode. Eight mixed-length prompts, at most 4 running, a
    32-token budget (prompts of 33+ tokens are chunked), a 16-block pool (decodes outgrow it:
    preemption), and three prompts sharing a 24-token prefix with an earlier one (prefix hits)."""
    prompts = random_prompts([5, 17, 33, 40, 3, 64, 9, 12], CFG.vocab_size, seed=1)
    for i in (5, 6, 7):
        prompts[i] = prompts[3][:24] + prompts[i]
    llm = _llm(decode_attention="triton", num_blocks=16)
    seen = _record_steps(llm)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, GREEDY.max_tokens) for p in prompts]
    chunks = [c for step in seen for c in step[:-1]]
    assert any(start > 0 and n > 1 for _, start, n in chunks), "no prefill was chunked"
    assert max(len(step) - 1 for step in seen) == 4  # continuous batching up to max_num_seqs
    assert llm.scheduler.preemptions > 0, "the pool never ran out"
    assert llm.blocks.hit_tokens > 0 and any(o.num_cached_tokens == 24 for o in outs[5:])
    assert llm.blocks.num_free == llm.blocks.num_usable  # every block back


def test_decode_paths_agree():
    prompts = random_prompts([7, 30, 2], CFG.vocab_size, seed=2)
    a = _llm(decode_attention="torch").generate(prompts, GREEDY)
    b = _llm(decode_attention="triton").generate(prompts, GREEDY)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_varlen_mixed_steps_are_token_exact(hf):
    """Every eager step (prefill chunks and decodes together) through one varlen kernel launch per layer."""
    prompts = random_prompts([5, 40, 3, 19], CFG.vocab_size, seed=4)
    llm = _llm(decode_attention="triton", mixed_attention="varlen", cuda_graphs=False, max_num_batched_tokens=24)
    seen = _record_steps(llm)
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0))
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 4) for p in prompts]
    assert any(any(n == 1 for _, _, n in step[:-1]) and any(n > 1 for _, _, n in step[:-1]) for step in seen)


def test_fixed_shape_decode_step_matches_transformers(hf):
    """What a CUDA graph replays, run eagerly (cuda_graphs="emulate"): batch buckets with padding
    rows on the null block, max_seq_len fixed at the table's capacity, a fixed 2-way split."""
    prompts = random_prompts([11, 4, 26], CFG.vocab_size, seed=9)
    lengths = (7, 3, 5)  # the batch shrinks 3 -> 2 -> 1: buckets 4 (one padding row), 2 and 1
    llm = _llm(decode_attention="triton", cuda_graphs="emulate")
    outs = llm.generate(prompts, [SamplingParams(max_tokens=n, temperature=0) for n in lengths])
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, n) for p, n in zip(prompts, lengths)]
    assert sorted(llm.runner.graphs) == [1, 2, 4]


def test_static_batching_gives_the_same_tokens(hf):
    prompts = random_prompts([6, 21, 3, 14, 9], CFG.vocab_size, seed=3)
    llm = _llm(policy="static", max_num_seqs=2)
    seen = _record_steps(llm)
    outs = llm.generate(prompts, [SamplingParams(max_tokens=n, temperature=0) for n in (3, 8, 5, 2, 6)])
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, n) for p, n in zip(prompts, (3, 8, 5, 2, 6))]
    # A new batch starts only when the last one has drained: the first step prefills 2 whole prompts.
    assert [n for _, _, n in seen[0][:-1]] == [6, 21]


# ---------------------------------------------------------------------------
# Blocks and the prefix cache
# ---------------------------------------------------------------------------


def test_prefix_cache_hits_as_predicted_and_change_no_token():
    """A hit is every full block of the longest shared prefix, never the prompt's last token."""
    base = random_prompts([40], CFG.vocab_size, seed=4)[0]
    llm, cold = _llm(), _llm(enable_prefix_caching=False)
    first = llm.generate([base], GREEDY)[0]
    assert first.num_cached_tokens == 0
    again = llm.generate([base], GREEDY)[0]  # 40 tokens: blocks 0-3 (32 tokens); block 4 holds the last one
    assert again.num_cached_tokens == 32 and again.token_ids == first.token_ids
    other = base[:35] + random_prompts([10], CFG.vocab_size, seed=5)[0]
    hit = llm.generate([other], GREEDY)[0]
    assert hit.num_cached_tokens == 32  # 35 shared tokens = 4 full blocks + 3
    assert hit.token_ids == cold.generate([other], GREEDY)[0].token_ids
    exact = llm.generate([base[:33]], GREEDY)[0]  # 33 tokens: 4 full blocks, the 33rd is computed
    assert exact.num_cached_tokens == 32
    short = llm.generate([base[:32]], GREEDY)[0]  # 32 tokens: the 4th block holds the last token
    assert short.num_cached_tokens == 24
    assert llm.blocks.num_free == llm.blocks.num_usable


def test_abort_and_finish_free_every_block():
    llm = _llm(num_blocks=30)
    seqs = [llm.add_request(p, GREEDY)[0] for p in random_prompts([20, 30, 11, 25, 8, 40], CFG.vocab_size, seed=6)]
    for _ in range(3):
        llm.step()
    running, waiting = llm.scheduler.running[0], llm.scheduler.waiting[-1]
    llm.abort(running)
    llm.abort(waiting)
    while llm.scheduler.has_work():
        llm.step()
    assert running.finish_reason == waiting.finish_reason == "abort"
    assert all(s.finished for s in seqs)
    assert llm.blocks.num_free == llm.blocks.num_usable
    assert all(llm.blocks.allocator.refcount(b) == 0 for b in range(1, llm.blocks.allocator.num_blocks))


def test_shared_blocks_are_counted_once_and_freed_by_the_last_user():
    bm = BlockManager(num_blocks=11, block_size=8, enable_prefix_caching=True)
    sched = Scheduler(EngineConfig(max_model_len=64, max_num_batched_tokens=64, block_size=8, num_blocks=10),
                      bm, clock=lambda: 0.0)
    a = Sequence(0, list(range(25)), GREEDY)
    sched.add(a)
    out = sched.schedule()
    sched.update(out, [7])
    assert bm.num_free == 10 - 4  # 25 tokens computed: 4 blocks, 3 of them full
    b = Sequence(1, list(range(25)) + [99], GREEDY)
    sched.add(b)
    out = sched.schedule()
    assert b.num_cached_tokens == 24  # a's 3 full blocks
    assert [c.num_tokens for c in out.chunks] == [1, 2]  # a's decode; b's last 2 prompt tokens
    sched.update(out, [5, 6])
    assert bm.num_free == 10 - 4 - 1  # b shares 3 blocks and owns 1
    sched.abort(a)
    assert bm.num_free == 10 - 4  # a's private block back; the shared ones stay with b
    sched.abort(b)
    assert bm.num_free == 10


def test_eos_stops_a_request_unless_ignored():
    bm = BlockManager(num_blocks=9, block_size=8)
    sched = Scheduler(EngineConfig(max_model_len=64, block_size=8, num_blocks=8), bm, clock=lambda: 1.0,
                      eos_token_ids=(7,))
    a = Sequence(0, [1, 2, 3], SamplingParams(max_tokens=5, temperature=0))
    b = Sequence(1, [1, 2, 3], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    sched.add(a)
    sched.add(b)
    finished = sched.update(sched.schedule(), [7, 7])
    assert finished == [a] and a.finish_reason == "stop" and a.output_ids == [7]
    assert sched.running == [b] and bm.num_free == 8 - 1


# ---------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------


def test_seeded_sampling_repeats_and_ignores_the_batch():
    prompts = random_prompts([9, 14, 5], CFG.vocab_size, seed=7)
    p = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, top_k=50, seed=123)
    alone = _llm().generate([prompts[0]], p)[0].token_ids
    crowd = _llm().generate(prompts, [p, SamplingParams(max_tokens=8, temperature=1.0),
                                      SamplingParams(max_tokens=8, temperature=0.5, seed=9)])
    assert crowd[0].token_ids == alone
    greedy = _llm().generate([prompts[0]], SamplingParams(max_tokens=8, temperature=0))[0].token_ids
    assert alone != greedy  # temperature did something
    top1 = _llm().generate([prompts[0]], SamplingParams(max_tokens=8, temperature=1.0, top_k=1))[0].token_ids
    tiny_p = _llm().generate([prompts[0]], SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-6))[0].token_ids
    assert top1 == tiny_p == greedy


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_bad_requests_fail_alone():
    good = random_prompts([12, 7], CFG.vocab_size, seed=8)
    llm = _llm()
    batch = [good[0], list(range(300)), "", {"prompt": "hi", "model": "gpt-17"}, good[1], [5, 600], "ok"]
    params = [GREEDY, GREEDY, GREEDY, GREEDY, GREEDY, GREEDY, {"max_tokens": 0}]
    outs = llm.generate(batch, params)
    errors = [o.error for o in outs]
    assert errors[0] is None and errors[4] is None
    assert "max_model_len 256" in errors[1]
    assert "empty" in errors[2]
    assert "gpt-17" in errors[3]
    assert "[0, 512)" in errors[5]
    assert "max_tokens" in errors[6]
    alone = _llm().generate([good[0], good[1]], GREEDY)
    assert outs[0].token_ids == alone[0].token_ids and outs[4].token_ids == alone[1].token_ids
    assert llm.blocks.num_free == llm.blocks.num_usable


@pytest.mark.parametrize("params,message", [
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"seed": -3}, "seed"),
    ({"best_of": 2}, "unknown sampling parameter 'best_of'"),
])
def test_bad_sampling_values_are_named(params, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams.from_dict(params)
    out = _llm().generate(["a", "b"], [params, GREEDY])
    assert message.split()[0] in out[0].error and out[1].error is None and len(out[1].token_ids) == 10


def test_unknown_model_and_bad_limits_are_config_errors():
    with pytest.raises(ConfigError, match="unknown model 'gpt-17'"):
        LLM("gpt-17")
    with pytest.raises(ConfigError, match="mixtral-8x7b is not a plain Llama"):
        LLM("mixtral-8x7b")
    with pytest.raises(ConfigError, match="max_num_seqs"):
        _llm(max_num_seqs=0)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        _llm(max_model_len=10**6)


# ---------------------------------------------------------------------------
# Weights from a folder, and the CLI
# ---------------------------------------------------------------------------


def _cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labs.engine", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    """A Hugging Face-style folder (config.json + model.safetensors) holding the tiny model's weights."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny-llama")
    llm = _llm()
    (folder / "config.json").write_text(json.dumps(CFG.hf_config_dict()))
    save_file({k: v.contiguous() for k, v in llm.model.hf_state_dict().items()}, str(folder / "model.safetensors"))
    return folder


def test_cli_runs_local_weights_and_matches_the_api(weights_dir):
    prompt = "The cache"
    proc = _cli("--weights", str(weights_dir), "--device", "cpu", "--dtype", "float32", "--prompt", prompt,
                "--max-tokens", "6", "--max-model-len", "128", "--decode-attention", "torch", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    api = _llm().generate([prompt], SamplingParams(max_tokens=6, temperature=0))[0]
    assert result["outputs"][0]["token_ids"] == api.token_ids
    assert result["decode_step_ms"]["steps"] == 5


def test_cli_help():
    proc = _cli("--help")
    assert proc.returncode == 0 and "--weights" in proc.stdout and "--max-num-batched-tokens" in proc.stdout


@pytest.mark.parametrize("args,name", [
    (("--max-tokens", "0"), "--max-tokens"),
    (("--max-tokens", "abc"), "--max-tokens"),
    (("--temperature", "nan"), "--temperature"),
    (("--temperature", "inf"), "--temperature"),
    (("--top-p", "0"), "--top-p"),
    (("--top-k", "-7"), "--top-k"),
    (("--max-num-seqs", "-1"), "--max-num-seqs"),
    (("--num-prompts", "100000000"), "--num-prompts"),
    (("--prompt-len", "0"), "--prompt-len"),
    (("--block-size", "7"), "--block-size"),
    (("--layers", "0"), "--layers"),
    (("--layers", "99"), "--layers"),
    (("--model", "gpt-17"), "--model"),
    (("--weights", "/nonexistent/folder"), "--weights"),
    (("--device", "tpu"), "--device"),
    (("--max-model-len", "16", "--prompt-len", "20"), "--prompt-len"),
])
def test_cli_bad_arguments_exit_2_with_one_line(args, name):
    proc = _cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in proc.stderr, proc.stderr
