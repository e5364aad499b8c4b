"""Check the calculator against a real GPU: allocate what it predicts, fill it, compare.

    python -m labs.kv_sizing.check --out DIR [--record]

For each configuration in CONFIGS, on the GPU this runs on:

1. Size the budget with `labs.kv_sizing.budget`, using the total memory the
   driver reports here (torch.cuda.mem_get_info) and vLLM 0.33's defaults.
2. Build model-shaped random weights for one rank. Where the model does not
   fit, build only some layers and scale the measured bytes by the layer count.
3. Allocate the KV pool of the predicted block count through the paged-attention
   lab's allocator (labs/paged_attention/cache.py: BlockAllocator, BlockTables,
   PagedKVCache; MLA stores one latent per token, so its pool is one tensor per
   layer addressed with the same allocator).
4. Run a real prefill of one sequence through the built layers, writing its K/V
   (or MLA latent) into the pool at the slots the block table gives, and read
   them back.
5. Fill the allocator with max_model_len requests until it refuses one.

What must match exactly: the bytes of the pool's tensors against
num_blocks x bytes_per_block; the weights torch allocates against the layer
shapes; the blocks the prefill takes; the allocator's free count; the requests
the pool admits. What carries a tolerance, and why:

* torch.cuda.memory_allocated for the pool: up to 1 MiB per tensor. The caching
  allocator rounds a large segment up to a 2 MiB multiple and does not split
  off a free tail under 1 MiB, so that tail counts as allocated (seen on the
  H200: +784 KiB per MLA layer tensor, 0 for Llama's).
* mem_get_info (the driver's view): up to 2 MiB per tensor, the page rounding.
* the activation peak, which the calculator only estimates (see
  memory_budget.estimate_activation_peak): the ratio is recorded and must stay
  within 0.5x..2x.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from labs import cli, specs
from labs.kv_sizing import formula
from labs.kv_sizing.memory_budget import GIB, budget, estimate_activation_peak
from labs.paged_attention.cache import BlockAllocator, BlockTables, OutOfBlocksError, PagedKVCache
from labs.recorded import Machine, RecordedError, record_rows

ROOT = Path(__file__).resolve().parents[2]
RESULT_NAME = "kv_alloc_check.json"
PAGE = 2 * 2**20  # the CUDA caching allocator's page for large segments
SPLIT_MIN = 2**20  # a free tail smaller than this stays inside the allocated block (kSmallSize)

# One GQA bf16, one MLA (one rank of TP=8), one fp8 KV.
CONFIGS = [
    {"label": "gqa-bf16", "model": "llama-3.1-8b", "kv_cache_dtype": "auto", "max_model_len": 8192, "tp": 1},
    {"label": "mla-bf16-tp8-rank", "model": "deepseek-v3", "kv_cache_dtype": "auto", "max_model_len": 32768, "tp": 8},
    {"label": "gqa-fp8-kv", "model": "qwen3-8b", "kv_cache_dtype": "fp8", "max_model_len": 32768, "tp": 1},
]
PREFILL_TOKENS = 8192
# Weights of one rank that this check is willing to build, in bytes.
WEIGHT_BUDGET = 24 * GIB

# Where tensors go; a CPU smoke run of this module's logic sets it to "cpu".
DEVICE = "cuda"

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _gpu_spec_for_device() -> specs.GPUSpec:
    """The gpus.yaml entry matching this device's name (batch defaults depend on it)."""
    name = torch.cuda.get_device_name().lower()
    for key, gpu in specs.all_gpus().items():
        token = key.split("-")[0]
        if token in name:
            return gpu
    return specs.get_gpu("h100-sxm")


def _mem():
    if DEVICE == "cpu":
        return {"allocated": 0, "reserved": 0, "used": 0}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "used": total - free}


def _delta(after, before):
    return {k: after[k] - before[k] for k in after}


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w)


def _dense_layer_weights(model: specs.ModelSpec, tp: int, dtype) -> dict[str, torch.Tensor]:
    """One decoder layer of one rank, random, in the shapes vLLM shards to."""
    h, d = model.hidden_size, model.head_dim
    q = model.n_heads // tp * d
    kv = formula.kv_heads_per_rank(model, tp) * d
    inter = model.intermediate_size // tp
    dev = DEVICE
    # normal_ in place: a `randn(...) * scale` temporary would stay cached by
    # the allocator and blur the driver-side measurement.
    def rand(rows: int, cols: int) -> torch.Tensor:
        return torch.empty(rows, cols, dtype=dtype, device=dev).normal_(std=cols**-0.5)

    w = {
        "in_norm": torch.ones(h, dtype=dtype, device=dev),
        "qkv": rand(q + 2 * kv, h),
        "o": rand(h, q),
        "post_norm": torch.ones(h, dtype=dtype, device=dev),
        "gate_up": rand(2 * inter, h),
        "down": rand(h, inter),
    }
    if model.qkv_bias:
        w["qkv_bias"] = torch.zeros(q + 2 * kv, dtype=dtype, device=dev)
    return w


def _layer_param_count(model: specs.ModelSpec, tp: int) -> int:
    h, d = model.hidden_size, model.head_dim
    q = model.n_heads // tp * d
    kv = formula.kv_heads_per_rank(model, tp) * d
    inter = model.intermediate_size // tp
    n = 2 * h + (q + 2 * kv) * h + h * q + 3 * inter * h
    return n + ((q + 2 * kv) if model.qkv_bias else 0)


def _store(pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Write rows at slots; fp8 pools are written through a uint8 view, as vLLM stores them."""
    flat = pool.view(-1, *pool.shape[2:])
    if pool.dtype == torch.float8_e4m3fn:
        flat.view(torch.uint8)[slots] = x.to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        flat[slots] = x.to(pool.dtype)


def _stored_equals(pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> bool:
    """Read the rows back from their slots and compare bit for bit with `x` cast to the pool's dtype."""
    flat = pool.view(-1, *pool.shape[2:])
    if pool.dtype == torch.float8_e4m3fn:  # compare the bytes: fp8 has no equality kernel everywhere
        return bool(torch.equal(flat.view(torch.uint8)[slots], x.to(torch.float8_e4m3fn).view(torch.uint8)))
    return bool(torch.equal(flat[slots], x.to(pool.dtype)))


def _dense_prefill(model, tp, layers, cache: PagedKVCache, slots: torch.Tensor, t: int, dtype) -> bool:
    """A causal prefill of `t` tokens through the built layers, storing K/V; True if the readback matches."""
    h, d = model.hidden_size, model.head_dim
    hq, hkv = model.n_heads // tp, formula.kv_heads_per_rank(model, tp)
    x = torch.randn(t, h, dtype=dtype, device=DEVICE)
    ok = True
    for i, w in enumerate(layers):
        y = _rms(x, w["in_norm"])
        qkv = F.linear(y, w["qkv"], w.get("qkv_bias"))
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        k = k.reshape(t, hkv, d)
        v = v.reshape(t, hkv, d)
        _store(cache.k[i], slots, k)
        _store(cache.v[i], slots, v)
        ok &= _stored_equals(cache.k[i], slots, k) and _stored_equals(cache.v[i], slots, v)
        # 4-D (batch, heads, tokens, dim) inputs, so SDPA can pick FlashAttention.
        attn = F.scaled_dot_product_attention(
            q.reshape(1, t, hq, d).transpose(1, 2), k.unsqueeze(0).transpose(1, 2), v.unsqueeze(0).transpose(1, 2),
            is_causal=True, enable_gqa=hq != hkv,
        )
        x = x + F.linear(attn.transpose(1, 2).reshape(t, hq * d), w["o"])
        y = _rms(x, w["post_norm"])
        gate, up = F.linear(y, w["gate_up"]).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w["down"])
        del y, qkv, q, k, v, attn, gate, up
    return ok


def _mla_prefill(model, layers, pools, slots, t, dtype) -> bool:
    """Project `t` tokens to MLA latents (kv_a_proj_with_mqa) per layer and store them."""
    x = torch.randn(t, model.hidden_size, dtype=dtype, device=DEVICE)
    ok = True
    for w, pool in zip(layers, pools):
        latent = F.linear(_rms(x, w["in_norm"]), w["kv_a"])  # (t, kv_lora_rank + qk_rope_head_dim)
        _store(pool, slots, latent)
        ok &= _stored_equals(pool, slots, latent)
    return ok


def _row(name, predicted, measured, exact, tolerance=0, note=""):
    ok = measured == predicted if exact else abs(measured - predicted) <= tolerance
    return {"item": name, "predicted": predicted, "measured": measured, "exact": exact,
            "tolerance": tolerance, "ok": bool(ok), "note": note}


def check_config(cfg: dict) -> dict:
    """Run one configuration; every tensor it makes is freed before it returns."""
    model = specs.get_model(cfg["model"])
    tp = cfg["tp"]
    gpu = _gpu_spec_for_device()
    total = cfg.get("total_memory") or torch.cuda.mem_get_info()[1]
    b = budget(model, gpu, cfg["max_model_len"], kv_cache_dtype=cfg["kv_cache_dtype"],
               tensor_parallel_size=tp, total_memory=total,
               **{k: cfg[k] for k in ("activation_peak", "non_torch", "cudagraph") if k in cfg})
    dtype = TORCH_DTYPES[model.serving_dtype]
    kv_dtype = torch.float8_e4m3fn if formula.kv_itemsize(model, cfg["kv_cache_dtype"]) == 1 else dtype
    rows = []
    base = _mem()

    # Weights: as many layers as fit WEIGHT_BUDGET, extrapolated to n_layers.
    if model.mla is None:
        per_layer_bytes = _layer_param_count(model, tp) * dtype.itemsize
        n_built = min(model.n_layers, max(1, WEIGHT_BUDGET // per_layer_bytes))
        layers = [_dense_layer_weights(model, tp, dtype) for _ in range(n_built)]
        w_delta = _delta(_mem(), base)
        rows.append(_row(f"weights of {n_built}/{model.n_layers} layers (torch allocated)",
                         per_layer_bytes * n_built, w_delta["allocated"], exact=True))
        n_tensors = sum(len(w) for w in layers)
        rows.append(_row("weights (driver: mem_get_info delta)", per_layer_bytes * n_built, w_delta["used"],
                         exact=False, tolerance=n_tensors * PAGE,
                         note="each tensor can round up to the allocator's 2 MiB page"))
        embed = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2) // tp
        norm = model.hidden_size
        rows.append(_row("weights, whole model, one rank (layers x n_layers + embeddings)",
                         b.weights, per_layer_bytes * model.n_layers + (embed + norm) * dtype.itemsize,
                         exact=False, tolerance=b.weights // 1000,
                         note="the calculator's weight term (stated parameter count) against the built "
                              "shapes; 0.1% covers weights not built (Qwen3's per-head q/k norms)"))
    else:
        n_built = model.n_layers
        layers = [{"in_norm": torch.ones(model.hidden_size, dtype=dtype, device=DEVICE),
                   "kv_a": torch.empty(model.mla.latent_dim, model.hidden_size, dtype=dtype, device=DEVICE)
                   .normal_(std=model.hidden_size**-0.5)} for _ in range(n_built)]
        rows.append(_row("MLA latent projections (kv_a_proj_with_mqa) only", 0, 0, exact=True,
                         note=f"the rank's {b.weights / GIB:.1f} GiB of fp8 weights are not built; "
                              "this configuration checks the KV pool"))

    # KV pool: the calculator's block count, every layer of one rank.
    before_pool = _mem()
    if model.mla is None:
        cache = PagedKVCache(model.n_layers, b.num_blocks, b.block_size, b.kv_heads_per_rank,
                             model.head_dim, kv_dtype, DEVICE)
        pools = cache.k + cache.v
    else:
        cache = None
        pools = [torch.empty((b.num_blocks, b.block_size, model.mla.latent_dim), dtype=kv_dtype, device=DEVICE)
                 for _ in range(model.n_layers)]
    pool_delta = _delta(_mem(), before_pool)
    predicted_pool = b.num_blocks * b.bytes_per_block
    pool_bytes = sum(t.numel() * t.element_size() for t in pools)
    rows.append(_row("KV pool = num_blocks x bytes_per_block (bytes of the pool's tensors)", predicted_pool,
                     pool_bytes, exact=True))
    rows.append(_row("KV pool (torch allocated delta)", predicted_pool, pool_delta["allocated"], exact=False,
                     tolerance=len(pools) * SPLIT_MIN,
                     note="the caching allocator rounds a large segment up to 2 MiB and keeps a tail under "
                          "1 MiB inside the block instead of splitting it off"))
    rows.append(_row("KV pool (driver: mem_get_info delta)", predicted_pool, pool_delta["used"], exact=False,
                     tolerance=len(pools) * PAGE, note="each pool tensor can round up to a 2 MiB page"))
    rows.append(_row("KV pool <= calculator's pool bytes", 1, int(predicted_pool <= b.kv_pool), exact=True))

    # A real prefill into the pool through the block tables.
    allocator = BlockAllocator(b.num_blocks)
    t = min(cfg.get("prefill_tokens", PREFILL_TOKENS), cfg["max_model_len"])
    if model.mla is None:
        tables = BlockTables(allocator, b.block_size)
        slots = torch.tensor(tables.append(0, t), device=DEVICE)
        used_blocks = len(tables.blocks(0))
    else:  # BlockTables is built for block sizes up to 32; MLA uses 64, so map slots directly.
        ids = allocator.allocate(-(-t // b.block_size))
        slots = torch.tensor([ids[i // b.block_size] * b.block_size + i % b.block_size for i in range(t)],
                             device=DEVICE)
        used_blocks = len(ids)
    cuda = DEVICE != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before_prefill = torch.cuda.memory_allocated() if cuda else 0
    if model.mla is None:
        readback = _dense_prefill(model, tp, layers, cache, slots, t, dtype)
    else:
        readback = _mla_prefill(model, layers, pools, slots, t, dtype)
    peak = (torch.cuda.max_memory_allocated() - before_prefill) if cuda else 0
    rows.append(_row(f"blocks taken by a {t}-token prefill", -(-t // b.block_size), used_blocks, exact=True))
    rows.append(_row("prefill K/V read back from their slots equal what was written", 1, int(readback), exact=True))
    rows.append(_row("allocator free blocks after the prefill", b.num_blocks - 1 - used_blocks,
                     allocator.num_free, exact=True, note="block 0 is the null block"))
    if model.mla is None:
        est = estimate_activation_peak(model, t, 0, tp)
        ratio = peak / est
        rows.append({"item": f"activation peak of the {t}-token prefill (estimate vs torch peak)",
                     "predicted": est, "measured": peak, "exact": False, "tolerance": "0.5x..2x",
                     "ok": bool(0.5 <= ratio <= 2.0), "ratio": round(ratio, 3),
                     "note": "eager forward: SiLU and the product are separate tensors, unlike vLLM's fused SiluAndMul"})

    # Admission: how many max_model_len requests the pool takes.
    admitted = 0
    per_req = b.blocks_per_request
    try:
        while True:
            allocator.allocate(per_req)
            admitted += 1
    except OutOfBlocksError:
        pass
    # The prefill's sequence keeps its blocks, so the rest of the pool is what admits requests.
    expected = (b.num_blocks - 1 - used_blocks) // per_req
    rows.append(_row(f"max_model_len={cfg['max_model_len']} requests admitted after the prefill",
                     expected, admitted, exact=True,
                     note=f"vLLM logs maximum concurrency num_blocks / blocks_per_request = {b.max_concurrency:.2f}x "
                          "(it counts the null block)"))

    del layers, pools, cache, slots
    if cuda:
        torch.cuda.empty_cache()
    end = _mem()
    rows.append(_row("torch allocated back at its baseline", base["allocated"], end["allocated"], exact=True))
    return {
        "label": cfg["label"], "model": model.name, "tensor_parallel_size": tp,
        "kv_cache_dtype": b.kv_cache_dtype, "max_model_len": cfg["max_model_len"],
        "layers_built": n_built, "budget": {k: getattr(b, k) for k in (
            "total_memory", "requested_memory", "weights", "activation_peak", "non_torch", "cudagraph",
            "kv_pool", "kv_bytes_per_token", "bytes_per_block", "num_blocks", "blocks_per_request",
            "max_concurrency", "kv_cache_tokens", "block_size")},
        "rows": rows, "ok": all(r["ok"] for r in rows),
    }


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _warmup() -> None:
    """Create the cuBLAS workspace and load the attention kernels before any baseline is taken.

    cuBLAS keeps its workspace in the caching allocator for the life of the
    process; without this, the first configuration would end 32 MiB above its start.
    """
    a = torch.randn(256, 256, dtype=torch.bfloat16, device=DEVICE)
    q = torch.randn(1, 4, 64, 64, dtype=torch.bfloat16, device=DEVICE)
    F.scaled_dot_product_attention(q, q[:, :2], q[:, :2], is_causal=True, enable_gqa=True)
    a @ a
    del a, q
    if DEVICE != "cpu":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_checks(configs=CONFIGS) -> dict:
    torch.manual_seed(0)
    _warmup()
    free, total = torch.cuda.mem_get_info()
    results = [check_config(cfg) for cfg in configs]
    return {
        "lab": "kv_sizing.check",
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "driver_and_memory": _driver(),
        "total_memory_bytes": total,
        "total_memory_mib": total // 2**20,
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "vllm_version_modelled": "0.33.0",
        "configs": results,
        "ok": all(r["ok"] for r in results),
    }


def _print(report: dict) -> None:
    print(f"{report['gpu']}  total {report['total_memory_mib']} MiB  driver/memory: {report['driver_and_memory']}")
    for cfg in report["configs"]:
        bud = cfg["budget"]
        print(f"\n[{cfg['label']}] {cfg['model']} TP={cfg['tensor_parallel_size']} kv={cfg['kv_cache_dtype']} "
              f"L={cfg['max_model_len']}: {bud['num_blocks']} blocks x {bud['bytes_per_block']} B, "
              f"concurrency {bud['max_concurrency']:.2f}x")
        for r in cfg["rows"]:
            mark = "ok " if r["ok"] else "BAD"
            ratio = f"  ratio {r['ratio']}" if "ratio" in r else ""
            print(f"  {mark} {r['item']:<72} predicted {r['predicted']:>15,}  measured {r['measured']:>15,}{ratio}")
    print("\nall checks match" if report["ok"] else "\nSOME CHECKS FAILED")


def record(report: dict, path: Path | None = None, replace: bool = False):
    """Merge one run's report (as --out writes it) into the recorded file, one row per configuration."""
    run = {k: report[k] for k in ("date", "driver_and_memory", "total_memory_bytes", "total_memory_mib",
                                  "versions", "vllm_version_modelled")}
    return record_rows(path or ROOT / "labs" / "results" / RESULT_NAME, "kv_sizing.check", Machine(report["gpu"]),
                       report["configs"], ["label"], run, replace=replace)


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog="python -m labs.kv_sizing.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=cli.output_dir, metavar="DIR",
                   help="folder to write kv_alloc_check.json into (created if missing)")
    p.add_argument("--record", action="store_true",
                   help="also merge the configurations into labs/results/kv_alloc_check.json, which the site "
                        "renders; other configurations and GPUs stay, and a failing configuration does not "
                        "replace a passing one")
    p.add_argument("--replace", action="store_true",
                   help="with --record: record a failing configuration even over a passing one")
    args = p.parse_args(argv)
    if args.replace and not args.record:
        p.error("--replace only applies with --record")
    if not torch.cuda.is_available():
        print("error: this check needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    report = run_checks()
    _print(report)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2) + "\n"
    (out / RESULT_NAME).write_text(text)
    if args.record:
        try:
            print(record(report, replace=args.replace))
        except RecordedError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
