"""Calculator: itemise one GPU's memory and size its KV pool as vLLM 0.33 does.

    python -m labs.kv_sizing --model llama-3.1-8b --gpu h200 --max-model-len 8192
    python -m labs.kv_sizing --model qwen3-8b --gpu h100-sxm --kv-cache-dtype fp8 --json
    python -m labs.kv_sizing --config path/to/config.json --gpu l40s --max-model-len 4096
    python -m labs.kv_sizing --model llama-3.1-70b --gpu h200 --tensor-parallel-size 4

Exit codes: 0 when one max-length request fits, 1 when it does not (vLLM would
refuse to start; the message is the one vLLM prints), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from labs import cli, specs
from labs.kv_sizing import formula
from labs.kv_sizing.memory_budget import DEFAULT_GPU_MEMORY_UTILIZATION, GIB, budget


# Far above any real value, low enough that no product of them overflows a table.
MAX_TOKENS = 1 << 24
MAX_SEQS = 1 << 16
# A memory amount in GiB: finite and not negative (NaN or inf cannot be itemised).
GIB_AMOUNT = cli.finite_float(0.0, 1e6, unit="GiB")


def _parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m labs.kv_sizing",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Models: " + ", ".join(specs.all_models()) + "\nGPUs: " + ", ".join(specs.all_gpus()),
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default="llama-3.1-8b", type=cli.choice(specs.all_models(), "model"),
                     help="model name from labs/data/models.yaml (default: %(default)s)")
    src.add_argument("--config", metavar="PATH", type=cli.existing_file,
                     help="a local Hugging Face config.json instead of --model")
    p.add_argument("--gpu", default="h200", type=cli.choice(specs.all_gpus(), "GPU"),
                   help="GPU name from labs/data/gpus.yaml (default: %(default)s)")
    p.add_argument("--max-model-len", type=cli.bounded_int(1, MAX_TOKENS), default=None,
                   help="context length one request may reach, in tokens, up to the model's "
                        "max_position_embeddings (default: that maximum)")
    p.add_argument("--gpu-memory-utilization", type=cli.fraction, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help="fraction of the GPU's total memory this instance may use, in (0, 1] "
                        "(vLLM 0.33 default: %(default)s)")
    # vLLM 0.33's CUDA attention backends take kernel blocks that are multiples of 16
    # (FlashAttention, Triton and FlashAttention-MLA: MultipleOf(16)); a block size
    # no such kernel block divides fails at start-up.
    p.add_argument("--block-size", type=cli.bounded_int(16, 4096, multiple_of=16), default=None,
                   help="tokens per KV block, a multiple of 16 up to 4096 "
                        "(default: 16, or 64 for MLA models, as vLLM picks on Hopper)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=formula.KV_DTYPES,
                   help="KV-cache element type; 'auto' uses the model dtype (default: %(default)s)")
    p.add_argument("--tensor-parallel-size", type=cli.bounded_int(1, 1024), default=1,
                   help="GPUs the model is split over; the budget is per GPU (default: %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=cli.bounded_int(1, MAX_TOKENS), default=None,
                   help="tokens per scheduler step, which sizes the profiling pass (default: vLLM's per-GPU default)")
    p.add_argument("--max-num-seqs", type=cli.bounded_int(1, MAX_SEQS), default=None,
                   help="requests per step, which sizes the sampler's logits (default: vLLM's per-GPU default)")
    p.add_argument("--activation-gib", type=GIB_AMOUNT, default=None,
                   help="activation peak of the profiling pass in GiB (default: an estimate, labelled as such)")
    p.add_argument("--non-torch-gib", type=GIB_AMOUNT, default=None,
                   help="non-torch memory and persistent buffers in GiB (default: an estimate)")
    p.add_argument("--cudagraph-gib", type=GIB_AMOUNT, default=None,
                   help="CUDA-graph memory in GiB (default: an estimate; 0 with --enforce-eager)")
    p.add_argument("--json", action="store_true", help="print the budget as JSON instead of a table")
    return p


def _gib(x: int | float | None) -> int | None:
    return None if x is None else int(x * GIB)


def _table(b) -> str:
    rows = [
        # Which total: the driver's cudaMemGetInfo where one is recorded, else nvidia-smi's larger figure.
        ("total memory (cudaMemGetInfo)" if b.total_measured else "total memory (nvidia-smi)", b.total_memory,
         "" if b.total_measured else "upper bound"),
        (f"x gpu_memory_utilization {b.gpu_memory_utilization}", b.requested_memory, "requested"),
        ("- weights", b.weights, "derived"),
        ("- activation peak (profiling pass)", b.activation_peak, "estimate" if "activation_peak" in b.estimates else "input"),
        ("- non-torch memory", b.non_torch, "estimate" if "non_torch" in b.estimates else "input"),
        ("- CUDA graphs", b.cudagraph, "estimate" if "cudagraph" in b.estimates else "input"),
        ("= KV pool", b.kv_pool, ""),
    ]
    out = [f"{b.model} on {b.gpu}, TP={b.tensor_parallel_size}, max_model_len={b.max_model_len}, "
           f"kv dtype {b.kv_cache_dtype}, block size {b.block_size}", ""]
    out += [f"  {name:<38} {v / GIB:>10.2f} GiB  {tag}" for name, v, tag in rows]
    out += [
        "",
        f"  KV bytes per token          {b.kv_bytes_per_token:>14,}",
        f"  bytes per block             {b.bytes_per_block:>14,}",
        f"  blocks                      {b.num_blocks:>14,}",
        f"  token slots (blocks x size) {b.token_slots:>14,}",
        f"  blocks per request          {b.blocks_per_request:>14,}",
        f"  GPU KV cache size (tokens)  {b.kv_cache_tokens:>14,}",
        f"  maximum concurrency         {b.max_concurrency:>14.2f}x",
        "",
        "formula:",
        *[f"  {line}" for line in b.formula],
    ]
    if b.kv_head_replicas > 1 and b.kv_head_replicas == b.tensor_parallel_size and "(kv_lora_rank" in b.formula[2]:
        out.append(f"  note: the MLA latent is not split over TP ranks: all {b.tensor_parallel_size} ranks hold a full copy")
    elif b.kv_head_replicas > 1:
        out.append(f"  note: TP {b.tensor_parallel_size} > KV heads: each KV head is replicated on "
                   f"{b.kv_head_replicas} ranks")
    if b.estimates:
        out += ["", "estimates:", *[f"  {k}: {v}" for k, v in b.estimates.items()]]
    if b.error:
        out += ["", f"vLLM would refuse to start: {b.error}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        model = specs.model_from_hf_config(args.config) if args.config else specs.get_model(args.model)
    except specs.SpecError as exc:
        cli.reject(parser, "--config", str(exc))
    if args.max_model_len is not None and args.max_model_len > model.max_position_embeddings:
        # vllm/config/model.py (_get_and_verify_max_len) raises on a max_model_len above the length it
        # derives from config.json unless the env var is set, and then only warns.
        cli.reject(parser, "--max-model-len", f"{model.name} allows at most {model.max_position_embeddings:,} tokens "
                   f"(its max_position_embeddings), got {args.max_model_len:,}; vLLM 0.33 refuses a longer "
                   "max_model_len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    try:
        gpu = specs.get_gpu(args.gpu)
        b = budget(
            model, gpu, args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            block_size=args.block_size,
            kv_cache_dtype=args.kv_cache_dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            activation_peak=_gib(args.activation_gib),
            non_torch=_gib(args.non_torch_gib),
            cudagraph=_gib(args.cudagraph_gib),
        )
    except specs.SpecError as exc:
        return cli.fail(str(exc))
    print(json.dumps(b.to_dict(), indent=2) if args.json else _table(b))
    return 0 if b.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
