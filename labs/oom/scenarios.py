"""Four out-of-memory failures of LLM serving, reproduced on the GPU this runs on, then fixed.

Sizes come from the GPU's own memory (torch.cuda.mem_get_info), so each
scenario runs in seconds on any CUDA GPU with enough memory for one
model-shaped layer. Each returns a report: what failed, the evidence, the
diagnosis (labs/oom/diagnose.py, torch-free), the fix and the run after it,
and whether memory came back to where it started.

* kv-too-small: vLLM 0.33's startup check that one max_model_len request fits
  the KV pool (vllm/v1/core/kv_cache_planning.py `_check_enough_kv_cache_memory`),
  run against memory measured the way `Worker.determine_available_memory` does.
* prefill-activation: a real forward pass of a Llama-3.1-8B-shaped layer
  (random weights) beside a pool that fills the GPU; too many batched tokens
  run out of memory, chunking the prefill fixes it.
* two-instances: a second process holds one instance's share of the GPU;
  vLLM's `request_memory` check (vllm/v1/worker/utils.py) refuses the second
  instance, and so does a plain cudaMalloc.
* fragmentation: enough bytes are free, but only in holes between live
  tensors; `expandable_segments:True` fixes it. Both runs are fresh
  subprocesses, since the allocator reads PYTORCH_CUDA_ALLOC_CONF once, when
  CUDA initialises.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from labs import specs
from labs.kv_sizing import formula
from labs.kv_sizing.memory_budget import estimate_max_model_len, kv_check_message
from labs.oom.diagnose import GIB, Evidence, diagnose
from labs.paged_attention.cache import BlockAllocator, BlockTables, PagedKVCache

MIB = 2**20
# After a scenario frees everything, the driver may still show a little more
# in use than at the start: CUDA loads kernels lazily, the first time each runs.
DRIVER_TOLERANCE = 128 * MIB
ROOT = Path(__file__).resolve().parents[2]

SCENARIOS = ("kv-too-small", "prefill-activation", "two-instances", "fragmentation")


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def largest_free_block() -> int:
    """Largest cached block no tensor uses, from torch.cuda.memory_snapshot()."""
    best = 0
    for seg in torch.cuda.memory_snapshot():
        for block in seg.get("blocks", []):
            if block.get("state") == "inactive":
                best = max(best, block["size"])
    return best


def mem_state() -> dict:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"total": total, "free": free, "used": total - free,
            "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
            "largest_free_block": largest_free_block()}


def evidence(requested: int, context: dict | None = None, state: dict | None = None) -> Evidence:
    s = state or mem_state()
    return Evidence(total=s["total"], free=s["free"], reserved=s["reserved"], allocated=s["allocated"],
                    largest_free_block=s["largest_free_block"], requested=int(requested), context=context or {})


def requested_from_message(message: str) -> int | None:
    """Bytes of the failed allocation, from PyTorch's 'Tried to allocate 1.75 GiB' message."""
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)", message)
    if not m:
        return None
    scale = {"GiB": GIB, "MiB": MIB, "KiB": 1024, "B": 1}[m.group(2)]
    return int(float(m.group(1)) * scale)


def baseline_check(base: dict) -> dict:
    torch.cuda.empty_cache()
    end = mem_state()
    ok = (end["allocated"] == base["allocated"] and end["reserved"] == base["reserved"]
          and end["used"] - base["used"] <= DRIVER_TOLERANCE)
    return {"start": {k: base[k] for k in ("used", "reserved", "allocated")},
            "end": {k: end[k] for k in ("used", "reserved", "allocated")},
            "driver_tolerance": DRIVER_TOLERANCE, "back_to_baseline": bool(ok)}


@contextmanager
def recording(snapshot: str | None):
    """Record allocator history for PyTorch's memory viewer (https://pytorch.org/memory_viz)."""
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        yield
    finally:
        if snapshot:
            torch.cuda.memory._dump_snapshot(snapshot)
            torch.cuda.memory._record_memory_history(enabled=None)


# ---------------------------------------------------------------------------
# A model-shaped decoder layer (random weights)
# ---------------------------------------------------------------------------


def pick_model(total: int) -> specs.ModelSpec:
    """The largest of our dense models whose weights take under 40% of this GPU."""
    for name in ("llama-3.1-8b", "qwen3-4b"):
        m = specs.get_model(name)
        if m.weight_bytes < 0.4 * total:
            return m
    raise RuntimeError(f"this GPU ({total / GIB:.1f} GiB) is too small for the scenarios' model-shaped layer")


class Layer:
    """One Llama-style decoder layer: RMSNorm, QKV, causal GQA attention, O, RMSNorm, gated MLP."""

    def __init__(self, model: specs.ModelSpec, dtype=torch.bfloat16):
        h, d = model.hidden_size, model.head_dim
        self.hq, self.hkv, self.d = model.n_heads, model.n_kv_heads, d

        def rand(rows, cols):
            return torch.empty(rows, cols, dtype=dtype, device="cuda").normal_(std=cols**-0.5)

        self.norm1 = torch.ones(h, dtype=dtype, device="cuda")
        self.norm2 = torch.ones(h, dtype=dtype, device="cuda")
        self.qkv = rand((self.hq + 2 * self.hkv) * d, h)
        self.o = rand(h, self.hq * d)
        self.gate_up = rand(2 * model.intermediate_size, h)
        self.down = rand(h, model.intermediate_size)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.norm1, self.norm2, self.qkv, self.o,
                                                          self.gate_up, self.down))

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None = None, past: int = 0):
        """x: (t, H) hidden states of positions past..past+t-1; returns (t, H).

        With `kv`, the K/V buffers (T, H_kv, d) of the whole prompt: this chunk's
        keys are stored at rows past..past+t-1 and it attends to rows 0..past+t-1.
        """
        t = x.shape[0]
        y = F.rms_norm(x, (x.shape[-1],), self.norm1)
        q, k, v = F.linear(y, self.qkv).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], -1)
        del y
        k, v = k.reshape(t, self.hkv, self.d), v.reshape(t, self.hkv, self.d)
        if kv is not None:
            kv[0][past:past + t] = k
            kv[1][past:past + t] = v
            k, v = kv[0][:past + t], kv[1][:past + t]
        qh = q.reshape(1, t, self.hq, self.d).transpose(1, 2)
        kh, vh = k.unsqueeze(0).transpose(1, 2), v.unsqueeze(0).transpose(1, 2)
        if past == 0:  # square causal mask: FlashAttention with grouped KV heads
            a = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        else:
            # Later chunks need the causal mask aligned to the bottom right (query i of
            # the chunk sees keys up to past + i); the kernel that takes that mask wants
            # one K/V head per query head, so the KV heads are repeated for this call.
            rep = self.hq // self.hkv
            a = F.scaled_dot_product_attention(qh, kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1),
                                               attn_mask=causal_lower_right(t, past + t))
        del qh, kh, vh, q
        x = x + F.linear(a.transpose(1, 2).reshape(t, self.hq * self.d), self.o)
        del a
        gate, up = F.linear(F.rms_norm(x, (x.shape[-1],), self.norm2), self.gate_up).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, self.down)


def prefill_peak(layer: Layer, tokens: int, hidden: int) -> int:
    """Measured activation peak (bytes above what was allocated before) of one prefill."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    out = layer.forward(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del x, out
    return peak


def chunked_prefill(layer: Layer, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """The same prefill, `chunk` tokens at a time, writing each chunk's output over its input rows.

    Only one chunk's activations are alive at a time; the K/V of the whole prompt
    is kept, as a paged KV cache would keep it.
    """
    total = x.shape[0]
    kv = tuple(torch.empty(total, layer.hkv, layer.d, dtype=x.dtype, device=x.device) for _ in range(2))
    for start in range(0, total, chunk):
        x[start:start + chunk] = layer.forward(x[start:start + chunk], kv, start)
    return x


def warmup(model: specs.ModelSpec) -> None:
    """Create cuBLAS handles/workspaces and load the kernels once, before the baseline is taken."""
    layer = Layer(model)
    x = torch.randn(64, model.hidden_size, dtype=torch.bfloat16, device="cuda")
    chunked_prefill(layer, x.clone(), 32)
    layer.forward(x)
    prefill_peak(layer, 64, model.hidden_size)
    del layer, x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# (a) The KV pool cannot hold one max_model_len request
# ---------------------------------------------------------------------------


def kv_too_small(snapshot: str | None = None) -> dict:
    total = torch.cuda.mem_get_info()[1]
    model = pick_model(total)
    warmup(model)
    base = mem_state()
    block_size, in_flight = 16, 16384
    max_model_len = model.max_position_embeddings
    bpb = formula.bytes_per_block(model, block_size)
    needed = formula.blocks_per_request(model, max_model_len, block_size, in_flight) * bpb
    # Pick a utilization that leaves the pool half of what one request needs.
    util = math.ceil((base["used"] + model.weight_bytes + 2 * GIB + needed / 2) / total * 100) / 100
    report = {"scenario": "kv-too-small", "model": model.name, "max_model_len": max_model_len,
              "gpu_memory_utilization": util, "block_size": block_size}
    with recording(snapshot):
        # Startup as vLLM does it: baseline snapshot, weights, a profiling pass.
        init_free = torch.cuda.mem_get_info()[0]
        requested = math.ceil(total * util)
        layer = Layer(model)
        rest = torch.empty(model.weight_bytes - layer.nbytes, dtype=torch.uint8, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        x = torch.randn(2048, model.hidden_size, dtype=torch.bfloat16, device="cuda")
        out = layer.forward(x)
        del x, out
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        after = mem_state()
        transient = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
        consumed = init_free - after["free"]
        available = requested - consumed - transient
        check_memory = available - bpb  # the BlockPool's null block is never usable
        est = estimate_max_model_len(model, check_memory, block_size, in_flight=in_flight, upper=max_model_len)
        report["profile"] = {"requested": requested, "total_consumed": consumed, "transient_peak": transient,
                             "available_kv": available, "bytes_per_block": bpb, "kv_needed": needed}
        failed = needed > check_memory
        message = kv_check_message(max_model_len, needed, check_memory, est) if failed else None
        report["failure"] = {"failed": failed, "error": f"ValueError: {message}" if message else None}
        ev = evidence(needed, {"kv_needed": needed, "kv_available": check_memory, "max_model_len": max_model_len,
                               "estimated_max_model_len": est}, after)
        report["evidence"] = ev.to_dict()
        report["diagnosis"] = diagnose(ev).to_dict()
        # The fix: vLLM's own estimate as --max-model-len; allocate the pool, admit one full request.
        fixed_len = est
        num_blocks = available // bpb
        cache = PagedKVCache(model.n_layers, num_blocks, block_size, model.n_kv_heads, model.head_dim,
                             torch.bfloat16, "cuda")
        tables = BlockTables(BlockAllocator(num_blocks), block_size)
        tables.append(0, fixed_len)
        report["fix"] = {"knob": f"--max-model-len {fixed_len}", "max_model_len": fixed_len,
                         "num_blocks": num_blocks, "blocks_for_one_request": len(tables.blocks(0)),
                         "pool_bytes": num_blocks * bpb, "passed": fixed_len > 0 and
                         formula.blocks_per_request(model, fixed_len, block_size, in_flight) * bpb <= check_memory}
        del cache, tables, layer, rest
    report["memory"] = baseline_check(base)
    report["as_predicted"] = bool(failed and report["diagnosis"]["kind"] == "kv-too-small"
                                  and report["fix"]["passed"] and report["memory"]["back_to_baseline"])
    return report


# ---------------------------------------------------------------------------
# (b) A prefill with too many batched tokens
# ---------------------------------------------------------------------------


def prefill_activation(snapshot: str | None = None) -> dict:
    total = torch.cuda.mem_get_info()[1]
    model = pick_model(total)
    warmup(model)
    base = mem_state()
    h = model.hidden_size
    report = {"scenario": "prefill-activation", "model": model.name, "layer": "one decoder layer, random bf16"}
    layer = Layer(model)
    # Peak against batched tokens, with memory to spare.
    sweep = [(t, prefill_peak(layer, t, h)) for t in (1024, 2048, 4096, 8192)]
    per_token = (sweep[-1][1] - sweep[0][1]) // (sweep[-1][0] - sweep[0][0])
    report["peak_vs_tokens"] = [{"batched_tokens": t, "peak_bytes": p} for t, p in sweep]
    report["activation_bytes_per_token"] = per_token
    # Chunking must not change the result: compare at a size that fits either way.
    x = torch.randn(2048, h, dtype=torch.bfloat16, device="cuda")
    full = layer.forward(x)
    chunked = chunked_prefill(layer, x.clone(), 512)
    report["chunked_matches_full"] = bool(torch.allclose(full.float(), chunked.float(), atol=5e-2, rtol=5e-2))
    report["chunked_max_abs_diff"] = float((full.float() - chunked.float()).abs().max())
    del x, full, chunked
    torch.cuda.empty_cache()

    # A 32k-token prompt in one step, with room beside the pool for about 60% of its activations.
    fail_tokens = 32768
    headroom = int(per_token * fail_tokens / 1.7)
    with recording(snapshot):
        free = torch.cuda.mem_get_info()[0]
        pool = torch.empty(free - headroom, dtype=torch.uint8, device="cuda")  # the KV pool vLLM preallocates
        before = mem_state()
        report["setup"] = {"pool_bytes": pool.numel(), "headroom": before["free"] + before["reserved"]
                           - before["allocated"], "batched_tokens": fail_tokens}
        x = torch.randn(fail_tokens, h, dtype=torch.bfloat16, device="cuda")
        error, requested, state = None, 0, None
        try:
            layer.forward(x)
        except torch.OutOfMemoryError as exc:
            error = str(exc).splitlines()[0]
            requested = requested_from_message(error) or 0
            state = mem_state()
        report["failure"] = {"failed": error is not None, "error": f"torch.OutOfMemoryError: {error}" if error else None}
        ctx = {"batched_tokens": fail_tokens, "activation_bytes_per_token": per_token,
               "headroom": report["setup"]["headroom"]}
        ev = evidence(requested, ctx, state or mem_state())
        report["evidence"] = ev.to_dict()
        diag = diagnose(ev)
        report["diagnosis"] = diag.to_dict()
        fit = diag.numbers.get("tokens_that_fit") or fail_tokens // 8
        chunk = 1 << int(math.log2(max(fit // 2, 64)))
        torch.cuda.reset_peak_memory_stats()
        before_fix = torch.cuda.memory_allocated()
        out = chunked_prefill(layer, x, chunk)  # overwrites x in place
        torch.cuda.synchronize()
        report["fix"] = {"knob": f"--max-num-batched-tokens {chunk}", "chunk_tokens": chunk,
                         "peak_bytes": torch.cuda.max_memory_allocated() - before_fix,
                         "tokens_prefilled": int(out.shape[0]), "passed": out.shape[0] == fail_tokens}
        del out, x, pool
    del layer
    report["memory"] = baseline_check(base)
    report["as_predicted"] = bool(report["failure"]["failed"] and diag.kind == "prefill-activation"
                                  and report["fix"]["passed"] and report["chunked_matches_full"]
                                  and report["memory"]["back_to_baseline"])
    return report


# ---------------------------------------------------------------------------
# (c) Two instances whose fractions add up to more than the GPU
# ---------------------------------------------------------------------------

HOLDER = """
import sys, torch
t = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
"""


def request_memory_check(total: int, free: int, util: float) -> str | None:
    """vLLM 0.33's startup check (vllm/v1/worker/utils.py request_memory); returns its error or None."""
    requested = math.ceil(total * util)
    if free < requested:
        return (f"Free memory on device cuda:0 ({free / GIB:.2f}/{total / GIB:.2f} GiB) on startup is less "
                f"than desired GPU memory utilization ({util}, {requested / GIB:.2f} GiB). Decrease GPU memory "
                f"utilization or reduce GPU memory used by other processes.")
    return None


def two_instances(snapshot: str | None = None) -> dict:
    base = mem_state()
    total = base["total"]
    f1, f2 = 0.6, 0.5
    report = {"scenario": "two-instances", "instance_fractions": [f1, f2]}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(math.ceil(total * f1))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            raise RuntimeError("the first instance's process did not start")
        with recording(snapshot):
            state = mem_state()
            message = request_memory_check(total, state["free"], f2)
            cuda_error = None
            try:  # what a plain allocation of the second instance's share does
                t = torch.empty(math.ceil(total * f2), dtype=torch.uint8, device="cuda")
                del t
            except torch.OutOfMemoryError as exc:
                cuda_error = str(exc).splitlines()[0]
            report["failure"] = {"failed": message is not None and cuda_error is not None,
                                 "error": f"ValueError: {message}", "cuda_error": f"torch.OutOfMemoryError: {cuda_error}"}
            ev = evidence(math.ceil(total * f2), {"instance_fractions": [f1, f2]}, mem_state())
            report["evidence"] = ev.to_dict()
            report["diagnosis"] = diagnose(ev).to_dict()
            # The fix: the second instance asks for what is left, minus 1 GiB for its own context.
            f2_fixed = math.floor((mem_state()["free"] - GIB) / total * 100) / 100
            ok = request_memory_check(total, mem_state()["free"], f2_fixed) is None
            t = torch.empty(math.ceil(total * f2_fixed), dtype=torch.uint8, device="cuda")
            report["fix"] = {"knob": f"--gpu-memory-utilization {f1} and {f2_fixed}",
                             "fractions": [f1, f2_fixed], "sum": round(f1 + f2_fixed, 2),
                             "allocated_bytes": t.numel(), "passed": ok}
            del t
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=60)
    report["memory"] = baseline_check(base)
    report["as_predicted"] = bool(report["failure"]["failed"] and report["diagnosis"]["kind"] == "two-instances"
                                  and report["fix"]["passed"] and report["memory"]["back_to_baseline"])
    return report


# ---------------------------------------------------------------------------
# (d) Fragmentation
# ---------------------------------------------------------------------------

SLAB = 512 * MIB  # a hole is SLAB bytes; the request is 1.5 x SLAB
N_SLABS = 8


def fragment_child(snapshot: str | None = None) -> dict:
    """The allocation pattern, run in a fresh process (see `fragmentation`). Prints JSON."""
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    slabs = []
    while torch.cuda.mem_get_info()[0] > 2 * SLAB + 256 * MIB and len(slabs) < N_SLABS:
        slabs.append(torch.empty(2 * SLAB, dtype=torch.uint8, device="cuda"))
    filler = torch.empty(max(torch.cuda.mem_get_info()[0] - 64 * MIB, 0), dtype=torch.uint8, device="cuda")
    n = len(slabs)
    del slabs  # to the cache: n segments of 2 x SLAB, reserved, unused
    a, pins = [], []
    for _ in range(n):  # each segment splits into a tensor that will go and one that stays
        a.append(torch.empty(SLAB, dtype=torch.uint8, device="cuda"))
        pins.append(torch.empty(SLAB, dtype=torch.uint8, device="cuda"))
    del a  # n holes of SLAB bytes, each pinned in place by its neighbour
    request = SLAB * 3 // 2
    before = mem_state()
    result = {"slabs": n, "request": request, "state": before,
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    try:
        big = torch.empty(request, dtype=torch.uint8, device="cuda")
        result.update(ok=True, error=None)
        del big
    except torch.OutOfMemoryError as exc:
        result.update(ok=False, error=str(exc).splitlines()[0], state_after=mem_state())
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
    del pins, filler
    return result


def _run_child(expandable: bool, snapshot: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, "-m", "labs.oom", "--fragment-child"] + (["--snapshot", snapshot] if snapshot else [])
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"fragmentation child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fragmentation(snapshot: str | None = None) -> dict:
    base = mem_state()
    report = {"scenario": "fragmentation", "slab_bytes": SLAB, "slabs": N_SLABS}
    # This process plays the rest of the GPU (another tenant, or vLLM's KV pool),
    # leaving room for the pattern plus the child's CUDA context.
    free = torch.cuda.mem_get_info()[0]
    other = torch.empty(max(free - (N_SLABS * 2 * SLAB + 3 * GIB // 2), 0), dtype=torch.uint8, device="cuda")
    try:
        failing = _run_child(False, snapshot)
        fixed = _run_child(True, None)
    finally:
        del other
    s = failing["state"]
    ev = Evidence(total=s["total"], free=s["free"], reserved=s["reserved"], allocated=s["allocated"],
                  largest_free_block=s["largest_free_block"], requested=failing["request"])
    report["failure"] = {"failed": not failing["ok"], "error": f"torch.OutOfMemoryError: {failing['error']}"}
    report["evidence"] = ev.to_dict()
    report["diagnosis"] = diagnose(ev).to_dict()
    report["fix"] = {"knob": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "passed": bool(fixed["ok"]),
                     "state_before_request": fixed["state"], "error": fixed["error"]}
    report["memory"] = baseline_check(base)
    report["as_predicted"] = bool(not failing["ok"] and report["diagnosis"]["kind"] == "fragmentation"
                                  and fixed["ok"] and report["memory"]["back_to_baseline"])
    return report


RUNNERS = {"kv-too-small": kv_too_small, "prefill-activation": prefill_activation,
           "two-instances": two_instances, "fragmentation": fragmentation}
