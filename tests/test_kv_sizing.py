"""The KV-sizing lab: spec files, the formula, the budget, the CLI, vLLM's own spec classes, a GPU check."""

from __future__ import annotations

import importlib.util
import json
import math
import re

import pytest

from labs import specs
from labs.kv_sizing import budget, formula
from labs.kv_sizing.__main__ import main as cli_main
from conftest import require_or_skip

MODELS = list(specs.all_models())
GPUS = list(specs.all_gpus())
BLOCK_SIZES = [1, 16, 64]
KV_DTYPES = ["auto", "fp8"]

# Bytes per token at bf16, derived by hand from each config.json:
# layers x KV heads x head_dim x 2 (K and V) x 2 bytes, or layers x latent x 2 for MLA.
# Sliding-window models count only full-attention layers (see formula.kv_bytes_per_token).
HAND_BYTES_PER_TOKEN = {
    "llama-3.1-8b": 32 * 8 * 128 * 2 * 2,    # 131,072
    "llama-3.1-70b": 80 * 8 * 128 * 2 * 2,   # 327,680
    "qwen3-8b": 36 * 8 * 128 * 2 * 2,        # 147,456
    "qwen3-4b": 36 * 8 * 128 * 2 * 2,        # 147,456, not 36 x 8 x 80 x 2 x 2
    "qwen2.5-7b": 28 * 4 * 128 * 2 * 2,      # 57,344
    "mistral-7b": 32 * 8 * 128 * 2 * 2,
    "mixtral-8x7b": 32 * 8 * 128 * 2 * 2,
    "deepseek-v3": 61 * (512 + 64) * 2,      # 70,272
    "gemma-2-9b": 21 * 8 * 256 * 2 * 2,      # the 21 global layers: 172,032
    "gemma-3-12b": 8 * 8 * 256 * 2 * 2,      # the 8 global layers: 65,536
}
HAND_ALL_LAYERS = {"gemma-2-9b": 42 * 8 * 256 * 2 * 2, "gemma-3-12b": 48 * 8 * 256 * 2 * 2}


# ---------------------------------------------------------------------------
# Spec files
# ---------------------------------------------------------------------------


def test_data_files_are_not_empty():
    assert len(MODELS) >= 8 and len(GPUS) >= 5
    assert {"llama-3.1-8b", "deepseek-v3", "qwen3-8b", "mixtral-8x7b"} <= set(MODELS)
    assert {"a100-80gb", "h100-sxm", "h200", "l40s", "b200"} <= set(GPUS)


def test_hand_table_covers_every_model():
    assert set(HAND_BYTES_PER_TOKEN) == set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_stated_params_match_geometry(name):
    """The typed parameter counts agree with the typed shapes (catches a wrong field)."""
    m = specs.get_model(name)
    if m.mla is not None:
        pytest.skip("MLA projections are not modelled by estimated_params")
    if name == "gemma-3-12b":
        pytest.skip("the stated count includes the SigLIP vision tower")
    total, active = m.estimated_params()
    assert abs(total - m.params_total) / m.params_total < 0.005
    if m.params_active is not None:
        assert abs(active - m.params_active) / m.params_active < 0.005


@pytest.mark.parametrize("name", GPUS)
def test_gpu_driver_memory_below_marketed(name):
    g = specs.get_gpu(name)
    assert g.memory_bytes_reported < g.memory_gb_marketed * 1e9 * 1.1
    assert set(g.provenance) >= {"memory_mib_reported", "dense_tflops"}


def test_h200_reports_143771_mib():
    assert specs.get_gpu("h200").memory_mib_reported == 143771


def test_unknown_names_list_the_known_ones():
    with pytest.raises(specs.SpecError, match="known models: llama-3.1-8b"):
        specs.get_model("llama-9")
    with pytest.raises(specs.SpecError, match="known GPUs: a100-80gb"):
        specs.get_gpu("v100")


def test_loaders_are_cached():
    assert specs._load_models() is specs._load_models()
    assert specs.get_model("llama-3.1-8b") is specs.get_model("llama-3.1-8b")


def test_invariant_heads_divisible():
    import dataclasses

    with pytest.raises(specs.SpecError, match="multiple of n_kv_heads"):
        dataclasses.replace(specs.get_model("llama-3.1-8b"), n_kv_heads=5)


def test_qwen3_4b_head_dim_is_explicit():
    m = specs.get_model("qwen3-4b")
    assert m.head_dim == 128 and m.hidden_size // m.n_heads == 80


# ---------------------------------------------------------------------------
# Hugging Face config.json
# ---------------------------------------------------------------------------

LLAMA_CONFIG = {
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "intermediate_size": 14336, "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072, "model_type": "llama",
}


def _write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg) if isinstance(cfg, dict) else cfg)
    return p


def test_hf_config_matches_data_file(tmp_path):
    m = specs.model_from_hf_config(_write(tmp_path, LLAMA_CONFIG), name="llama")
    assert formula.kv_bytes_per_token(m) == 131072
    assert m.estimated_params()[0] == specs.get_model("llama-3.1-8b").params_total


def test_hf_config_gemma2_layer_pattern(tmp_path):
    cfg = {**LLAMA_CONFIG, "model_type": "gemma2", "num_hidden_layers": 42, "head_dim": 256,
           "num_attention_heads": 16, "hidden_size": 3584, "sliding_window": 4096}
    m = specs.model_from_hf_config(_write(tmp_path, cfg))
    assert m.n_sliding_layers == 21 and m.layer_kinds[:2] == ("sliding", "full")


def test_hf_config_text_config_and_mla(tmp_path):
    mm = {"model_type": "gemma3", "text_config": {**LLAMA_CONFIG, "sliding_window": 1024,
                                                  "sliding_window_pattern": 6, "num_hidden_layers": 12}}
    assert specs.model_from_hf_config(_write(tmp_path, mm)).n_full_layers == 2
    ds = {**LLAMA_CONFIG, "num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
          "qk_nope_head_dim": 128, "v_head_dim": 128, "num_attention_heads": 128, "num_key_value_heads": 128}
    m = specs.model_from_hf_config(_write(tmp_path, ds, "ds.json"))
    assert formula.kv_bytes_per_token(m) == HAND_BYTES_PER_TOKEN["deepseek-v3"]


def test_hf_config_missing_key_is_named(tmp_path):
    cfg = dict(LLAMA_CONFIG)
    del cfg["num_attention_heads"]
    with pytest.raises(specs.SpecError, match="missing field 'num_attention_heads'"):
        specs.model_from_hf_config(_write(tmp_path, cfg))


def test_hf_config_bad_json(tmp_path):
    with pytest.raises(specs.SpecError, match="not valid JSON"):
        specs.model_from_hf_config(_write(tmp_path, "{oops"))


# ---------------------------------------------------------------------------
# Formula
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_bytes_per_token_matches_hand_derivation(name):
    m = specs.get_model(name)
    assert formula.kv_bytes_per_token(m) == HAND_BYTES_PER_TOKEN[name]
    all_layers = HAND_ALL_LAYERS.get(name, HAND_BYTES_PER_TOKEN[name])
    assert formula.kv_bytes_per_token_all_layers(m) == all_layers


@pytest.mark.parametrize("name", MODELS)
def test_fp8_halves_bf16(name):
    m = specs.get_model(name)
    assert formula.kv_bytes_per_token(m, "fp8") * 2 == formula.kv_bytes_per_token(m, "bf16")


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_bytes_per_block_is_group_pages(name, block_size):
    m = specs.get_model(name)
    groups = formula.kv_cache_groups(m)
    slots = max(g.slots for g in groups)
    assert formula.bytes_per_block(m, block_size) == block_size * formula.layer_bytes_per_token(m) * slots
    if len(groups) == 1:  # the style guide's formula: 2 * layers * block_size * kv_heads * head_dim * itemsize
        per = (m.mla.latent_dim if m.mla else 2 * m.n_kv_heads * m.head_dim) * 2
        assert formula.bytes_per_block(m, block_size) == m.n_layers * block_size * per


def test_hybrid_groups_follow_vllm_rule():
    g2 = formula.kv_cache_groups(specs.get_model("gemma-2-9b"))
    assert [(g.kind, g.slots) for g in g2] == [("sliding", 21), ("full", 21)]
    g3 = formula.kv_cache_groups(specs.get_model("gemma-3-12b"))
    assert [g.kind for g in g3].count("sliding") == 5 and [g.kind for g in g3].count("full") == 1
    assert {g.slots for g in g3} == {8}


def test_sliding_blocks_per_request():
    m = specs.get_model("gemma-3-12b")
    # full: cdiv(32768, 16) = 2048; each of 5 sliding groups: cdiv(1023 + 16384, 16) + 1 = 1089
    assert formula.blocks_per_request(m, 32768, 16, 16384) == 2048 + 5 * 1089
    # a short context: sliding layers hold all of it (+1 block for the window's offset)
    assert formula.blocks_per_request(m, 512, 16, 16384) == 32 + 5 * 33


def test_tensor_parallel_splits_and_replicates_kv_heads():
    m = specs.get_model("llama-3.1-70b")
    assert formula.kv_bytes_per_token(m, tp=4) * 4 == formula.kv_bytes_per_token(m)
    assert formula.kv_heads_per_rank(m, 16) == 1 and formula.kv_head_replicas(m, 16) == 2
    ds = specs.get_model("deepseek-v3")
    assert formula.kv_bytes_per_token(ds, tp=8) == formula.kv_bytes_per_token(ds)
    with pytest.raises(specs.SpecError, match="not divisible"):
        formula.kv_heads_per_rank(specs.get_model("qwen2.5-7b"), 3)


def test_unknown_kv_dtype():
    with pytest.raises(specs.SpecError, match="unsupported kv cache dtype"):
        formula.kv_itemsize(specs.get_model("llama-3.1-8b"), "int3")


# ---------------------------------------------------------------------------
# Budget
# ---------------------------------------------------------------------------


def test_budget_llama_8b_h200_by_hand():
    m, g = specs.get_model("llama-3.1-8b"), specs.get_gpu("h200")
    b = budget(m, g, 8192, activation_peak=2 * 2**30, non_torch=2**30, cudagraph=2**30)
    total = 143155 * 2**20  # cudaMemGetInfo's total on the H200, not nvidia-smi's 143771 MiB
    requested = math.ceil(total * 0.92)
    pool = requested - 8030261248 * 2 - 4 * 2**30
    assert (b.requested_memory, b.kv_pool) == (requested, pool)
    assert b.num_blocks == pool // (2 * 32 * 16 * 8 * 128 * 2)
    assert b.blocks_per_request == 8192 // 16
    assert b.max_concurrency == pytest.approx(b.num_blocks / 512)
    assert b.kv_cache_tokens == int(b.num_blocks / 512 * 8192)
    assert b.fits_one_request and b.error is None
    assert b.estimates == {}


def test_budget_defaults_are_labelled_estimates():
    b = budget(specs.get_model("qwen3-8b"), specs.get_gpu("h100-sxm"), 8192)
    assert set(b.estimates) == {"activation_peak", "non_torch", "cudagraph"}
    assert all(v.startswith("estimate") for v in b.estimates.values())
    assert b.gpu_memory_utilization == 0.92


def test_budget_refuses_like_vllm_when_one_request_does_not_fit():
    b = budget(specs.get_model("llama-3.1-8b"), specs.get_gpu("l40s"), 131072, gpu_memory_utilization=0.5)
    assert not b.fits_one_request
    assert "To serve at least one request with the model's max seq len (131072)" in b.error
    assert "estimated maximum model length is" in b.error
    assert 0 < b.estimated_max_model_len < 131072
    needed = formula.kv_bytes_per_sequence(specs.get_model("llama-3.1-8b"), b.estimated_max_model_len, 16)
    assert needed <= b.kv_pool - b.bytes_per_block


def test_batch_defaults_follow_vllm():
    from labs.kv_sizing.memory_budget import vllm_batch_defaults

    assert vllm_batch_defaults(specs.get_gpu("h200")) == (8192, 1024)
    assert vllm_batch_defaults(specs.get_gpu("b200")) == (16384, 1024)
    assert vllm_batch_defaults(specs.get_gpu("a100-80gb")) == (2048, 256)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def test_cli_table(capsys):
    assert cli_main(["--model", "llama-3.1-8b", "--gpu", "h200", "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert "KV bytes per token" in out and "131,072" in out and "maximum concurrency" in out
    assert "kv_pool = requested - weights" in out and "estimate" in out


def test_cli_table_names_which_total_it_used(capsys):
    """The H200's total is the driver's (recorded); the H100's is nvidia-smi's, an upper bound, and says so."""
    assert cli_main(["--model", "llama-3.1-8b", "--gpu", "h200", "--max-model-len", "8192"]) == 0
    assert "total memory (cudaMemGetInfo)" in capsys.readouterr().out
    assert cli_main(["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert "cudaMemGetInfo" not in out
    assert re.search(r"total memory \(nvidia-smi\)\s+79\.65 GiB\s+upper bound", out)


def test_cli_json(capsys):
    assert cli_main(["--model", "deepseek-v3", "--gpu", "h200", "--tensor-parallel-size", "8",
                     "--max-model-len", "32768", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # bf16 MLA on Hopper: FLASH_ATTN_MLA comes first and keeps 16-token blocks
    assert data["kv_bytes_per_token"] == 70272 and data["block_size"] == 16
    assert data["num_blocks"] > 0 and data["max_concurrency"] > 1


def test_mla_fp8_cache_takes_flashmla_64_token_blocks(capsys):
    assert cli_main(["--model", "deepseek-v3", "--gpu", "h200", "--tensor-parallel-size", "8",
                     "--max-model-len", "32768", "--kv-cache-dtype", "fp8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["block_size"] == 64
    assert data["num_blocks"] > 0 and data["max_concurrency"] > 1


def test_cli_config_path(tmp_path, capsys):
    path = _write(tmp_path, LLAMA_CONFIG)
    assert cli_main(["--config", str(path), "--gpu", "h100-sxm", "--max-model-len", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 131072


def _exit_code(argv) -> int:
    try:
        return cli_main(argv)
    except SystemExit as exc:  # argparse refused the value
        return exc.code


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama-9"], "unknown model 'llama-9'"),
    (["--max-model-len", "-1"], "argument --max-model-len: expected a whole number from 1 to 16,777,216"),
    (["--max-model-len", "131073"], "llama-3.1-8b allows at most 131,072 tokens"),
    (["--gpu", "v100"], "unknown GPU 'v100'"),
    (["--tensor-parallel-size", "3", "--model", "llama-3.1-8b"], "not divisible"),
])
def test_cli_errors_exit_2(argv, message, capsys):
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_malformed_config(tmp_path, capsys):
    cfg = dict(LLAMA_CONFIG)
    del cfg["hidden_size"]
    assert _exit_code(["--config", str(_write(tmp_path, cfg))]) == 2
    assert "missing field 'hidden_size'" in capsys.readouterr().err


def test_cli_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--config", "--gpu", "--max-model-len", "--kv-cache-dtype", "--gpu-memory-utilization",
                 "--block-size", "--tensor-parallel-size", "--json"):
        assert flag in out


def test_cli_exit_1_when_vllm_would_refuse(capsys):
    assert cli_main(["--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--max-model-len", "8192"]) == 1
    assert "vLLM would refuse to start" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# vLLM 0.33's own KV-cache spec classes
# ---------------------------------------------------------------------------


def _vllm():
    require_or_skip(importlib.util.find_spec("vllm") is not None, "vllm",
                    "compares the calculator with vLLM 0.33's KV-cache spec classes")
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    return torch, kvi


def _vllm_layer_spec(torch, kvi, m, kind, block_size, kv_dtype, tp=1):
    itemsize = formula.kv_itemsize(m, kv_dtype)
    dtype = torch.uint8 if itemsize == 1 else torch.bfloat16
    if m.mla is not None:
        return kvi.MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=m.mla.latent_dim,
                                    dtype=dtype, cache_dtype_str=kv_dtype)
    common = dict(block_size=block_size, num_kv_heads=formula.kv_heads_per_rank(m, tp),
                  head_size=m.head_dim, dtype=dtype)
    if kind == "sliding":
        return kvi.SlidingWindowSpec(**common, sliding_window=m.sliding_window.window)
    return kvi.FullAttentionSpec(**common)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_page_size_matches_vllm_spec(name, kv_dtype):
    torch, kvi = _vllm()
    m = specs.get_model(name)
    for kind in set(m.layer_kinds):
        spec = _vllm_layer_spec(torch, kvi, m, kind, 16, kv_dtype)
        assert spec.page_size_bytes == formula.page_bytes(m, 16, kv_dtype)


@pytest.mark.parametrize("name", MODELS)
def test_groups_and_bytes_per_block_match_vllm_planner(name):
    torch, kvi = _vllm()
    from vllm.v1.core import kv_cache_planning as plan

    m = specs.get_model(name)
    layer_specs = {f"model.layers.{i}.attn": _vllm_layer_spec(torch, kvi, m, kind, 16, "auto")
                   for i, kind in enumerate(m.layer_kinds)}
    if len(set(m.layer_kinds)) == 1:
        groups = plan._get_kv_cache_groups_uniform_spec(layer_specs)
    else:
        groups = plan._get_kv_cache_groups_uniform_page_size(layer_specs)
    ours = formula.kv_cache_groups(m)
    assert len(groups) == len(ours)
    bytes_per_block = plan._get_kv_cache_bytes_per_block(groups, kvi.KVCacheLayout.LBNHC)
    assert bytes_per_block == formula.bytes_per_block(m, 16)


@pytest.mark.parametrize("name", ["gemma-2-9b", "gemma-3-12b"])
@pytest.mark.parametrize("max_len", [512, 8192, 32768])
def test_sliding_admission_matches_vllm(name, max_len):
    torch, kvi = _vllm()
    m = specs.get_model(name)
    spec = _vllm_layer_spec(torch, kvi, m, "sliding", 16, "auto")
    max_len = min(max_len, m.max_position_embeddings)
    vllm_sliding = spec.max_admission_blocks_per_request(16384, max_len)
    n_sliding_groups = sum(g.kind == "sliding" for g in formula.kv_cache_groups(m))
    n_full_groups = sum(g.kind == "full" for g in formula.kv_cache_groups(m))
    expected = n_full_groups * -(-max_len // 16) + n_sliding_groups * vllm_sliding
    assert formula.blocks_per_request(m, max_len, 16, 16384) == expected


def test_gpu_memory_utilization_default_matches_vllm():
    _vllm()
    from vllm.config.cache import CacheConfig
    from labs.kv_sizing.memory_budget import DEFAULT_GPU_MEMORY_UTILIZATION

    cfg = CacheConfig()
    assert cfg.gpu_memory_utilization == DEFAULT_GPU_MEMORY_UTILIZATION
    assert cfg.block_size == CacheConfig.DEFAULT_BLOCK_SIZE == formula.DEFAULT_BLOCK_SIZE


# ---------------------------------------------------------------------------
# GPU: allocate what the calculator predicts
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_predicted_pool_matches_gpu():
    pytest.importorskip("torch")
    from labs.kv_sizing import check

    report = check.run_checks()
    bad = [(c["label"], r) for c in report["configs"] for r in c["rows"] if not r["ok"]]
    assert not bad, bad


def test_cli_refuses_a_context_past_the_model_limit_as_vllm_does(tmp_path, capsys):
    """One line, exit 2, naming the model's limit and vLLM 0.33's override; a config file's own limit counts."""
    assert _exit_code(["--model", "llama-3.1-8b", "--max-model-len", "200000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "--max-model-len: llama-3.1-8b allows at most 131,072 tokens" in err[0]
    assert "got 200,000" in err[0] and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in err[0]
    assert _exit_code(["--model", "llama-3.1-8b", "--max-model-len", "131072"]) == 0
    capsys.readouterr()
    cfg = _write(tmp_path, {**LLAMA_CONFIG, "max_position_embeddings": 4096})
    assert _exit_code(["--config", str(cfg), "--max-model-len", "4097"]) == 2
    assert "allows at most 4,096 tokens" in capsys.readouterr().err


def test_requests_of_counts_whole_blocks_without_the_null_block():
    b = budget(specs.get_model("llama-3.1-8b"), specs.get_gpu("h200"), 8192)
    blocks = -(-1800 // b.block_size)
    assert b.requests_of(1800) * blocks <= b.num_blocks - 1 < (b.requests_of(1800) + 1) * blocks
    assert b.requests_of(8192) <= b.max_requests  # max_requests counts the null block, as vLLM's log does
    with pytest.raises(ValueError, match="full-attention"):
        budget(specs.get_model("gemma-3-12b"), specs.get_gpu("h200"), 8192).requests_of(1024)
