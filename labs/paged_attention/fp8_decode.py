"""The fp8 decode kernel in CUDA C++ (fp8_decode.cu): what it takes, how it is built and launched.

Why a second kernel. The Triton kernel reads an fp8 cache 1.26-1.44x as fast as a bf16 one,
not 2x (NOTES.md, v5). Its per-tile chain (asynchronous copies into shared memory, barriers
between warps, and the V tile's trip through shared memory in fp16 to be transposed) is what
Triton 3.6 generates for any tile, and the fix, transposing the 8-bit V tile in registers,
cannot be asked for in its language. In CUDA it can: each thread loads its own bytes of K
and V into registers, pairs the bytes of two tokens with one byte permute, and feeds the
matrix unit from there (fp8_decode.cu explains the fragment layout). Two warps of a program
serve each KV head of the same tokens, so a program reads whole KV blocks. On the H200 it
reads an fp8 cache about 1.5-1.9x as fast as the Triton kernel reads bf16 on batches of 16
or more (NOTES.md, v11; the recorded rows are in labs/results/paged_attention.json).

Scope. head_dim 128 and up to 8 query heads per KV head (the Llama, Qwen and Mistral models
in labs/data; not Gemma's head_dim 256 or DeepSeek-V3's 192), V stored like K (vLLM's
order), fp16 or bf16 queries, any supported block size, sm_89 or later. Other calls, the
CPU interpreter, and machines without NVRTC use the Triton kernel (`kernel.resolve_backend`
chooses). The partials' layout and the reduction kernel are the Triton kernel's; equal
lengths split as the Triton kernel splits them, and unequal ones follow `kernel.flat_plan`
(one wave of programs over the batch's tiles laid end to end), which the reduction reads with
FLAT set, or `kernel.chunked_plan` (CHUNKED) when the caller forces a split count.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from labs.paged_attention import nvrtc

SOURCE = Path(__file__).with_name("fp8_decode.cu")
HEAD_DIM = 128
GROUP_MAX = 8
# Warps resident per SM, the budget `__launch_bounds__` cuts registers for: 16 x 32 threads x
# 128 registers = the SM's 65,536.
WARPS_PER_SM = 16
# A program serves up to this many KV heads of the same tokens: all 8 of a Llama-3-8B pool,
# so each program reads whole 16-KB blocks (NOTES.md, v9: one head per program read 128-byte
# pieces of every 1-KB token row and left the DRAM 10-15% below the rate whole blocks get).
HEADS_MAX = 8
# Batches up to this size order the ragged plan's remainder items longest first (each
# program ranks them in shared memory: RANK_MAX_BATCH ints, and up to as many comparisons per
# thread); larger ones take them in sequence order. kernel.chunked_plan is the same plan.
RANK_MAX_BATCH = 256
# Warps per KV head: 2 take alternate chunks of a split and merge at the end. Against 1 (same
# run, µs): (128, 2,048) 141.8 against 144.1, (16, 32,768) 261.9 / 268.4, the lognormal batch
# 248.0 / 252.4; (64, 4,096) 142.6 / 142.2 and the uniform batch 306.1 / 303.4 went the
# other way (NOTES.md, v10).
WARPS_PER_HEAD = 2
# Tokens a warp takes per step. 16 fits the register budget below with no spills (the CPU
# tests check every specialisation); 32 spills under a 4-program budget and was slower
# (NOTES.md, v6).
CHUNK = 16
# The split plan's unit (TILE in the source): every split starts on a multiple of it, and
# kernel.CUDA_FP8_CONFIG hands it to the plan's host side and to the reduction. With one warp
# per head, at 64 a batch of one 4K sequence got 32 splits (2 tiles each, MIN_SPLIT_TILES)
# for 264 program slots: 21.4 us, against 17.1 at 32 (NOTES.md, v9).
TILE_N = 32


def has_e4m3_cvt(device: torch.device) -> bool:
    """Whether the GPU has `cvt.rn.f16x2.e4m3x2` (sm_89 on: Ada, Hopper, Blackwell), which
    this kernel and the Triton kernel's inline V conversion both use."""
    return torch.cuda.get_device_capability(device) >= (8, 9)


def unsupported_reason(q: torch.Tensor, k_cache: torch.Tensor, group_size: int, v_layout: str) -> str | None:
    """Why this kernel cannot take the call, or None when it can."""
    if q.device.type != "cuda":
        return "not a CUDA tensor"
    if not has_e4m3_cvt(q.device):
        return "a GPU before sm_89 (no e4m3 conversion instruction)"
    if q.shape[-1] != HEAD_DIM:
        return f"head_dim {q.shape[-1]} (the CUDA kernel is written for {HEAD_DIM})"
    if group_size > GROUP_MAX:
        return f"{group_size} query heads per KV head (at most {GROUP_MAX})"
    if v_layout != "token":
        return f"v_layout={v_layout!r} (the CUDA kernel reads V in K's order)"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"{q.dtype} queries"
    if q.stride(1) % 8 or q.stride(0) % 8 or q.data_ptr() % 16:
        return "queries not aligned to 16 bytes per head"
    if any(s % 16 for s in k_cache.stride()[:3]) or k_cache.data_ptr() % 16:
        return "a cache not aligned to 16 bytes per row"
    if k_cache.stride(1) * 32 >= 2**31:  # in-block offsets are 32-bit in the kernel
        return f"a token stride of {k_cache.stride(1)} bytes"
    try:
        nvrtc._nvrtc()
    except nvrtc.NvrtcError as exc:
        return str(exc)
    return None


def heads_per_program(num_kv_heads: int) -> int:
    """KV heads (and warps) per program: the largest power of two up to HEADS_MAX that divides
    num_kv_heads. A power of two divides WARPS_PER_SM, so every width gets 128 registers."""
    heads = HEADS_MAX
    while num_kv_heads % heads:
        heads //= 2
    return heads


def programs_per_sm(heads: int) -> int:
    """Programs serving `heads` KV heads that the register budget fits on one SM."""
    return WARPS_PER_SM // (heads * WARPS_PER_HEAD)


def defines(block_size: int, stride_ct: int, split: bool, q_bf16: bool, heads: int = HEADS_MAX,
            chunk: int = CHUNK, flat: bool = False, fold: int = 0) -> tuple[str, ...]:
    flat = split and flat
    return (f"-DBLOCK_SIZE={block_size}", f"-DSTRIDE_CT={stride_ct}", f"-DTILE={TILE_N}", f"-DSPLIT={int(split)}",
            f"-DFLAT={int(flat)}", f"-DFOLD={fold if flat else 0}",
            f"-DQ_BF16={int(q_bf16)}", f"-DCHUNK={chunk}", f"-DMIN_BLOCKS={programs_per_sm(heads)}",
            f"-DHEADS={heads}", f"-DWPH={WARPS_PER_HEAD}", f"-DRANK_MAX={RANK_MAX_BATCH}",
            f"-DHEAD_DIM={HEAD_DIM}", f"-DGROUP_MAX={GROUP_MAX}")


def compile_variant(arch: int, block_size: int, stride_ct: int, split: bool, q_bf16: bool, heads: int = HEADS_MAX,
                    chunk: int = CHUNK, verbose: bool = False, flat: bool = False, fold: int = 0) -> tuple[bytes, str]:
    """(cubin, log) of one specialisation; verbose adds ptxas's register and spill report to the log."""
    options = defines(block_size, stride_ct, split, q_bf16, heads, chunk, flat, fold)
    if verbose:
        options += ("--ptxas-options=-v",)
    return nvrtc.compile_cubin(SOURCE.read_text(), SOURCE.name, arch, options)


@functools.lru_cache(maxsize=None)
def _kernel(device_index: int, block_size: int, stride_ct: int, split: bool, q_bf16: bool, heads: int,
            flat: bool = False, fold: int = 0) -> nvrtc.Kernel:
    major, minor = torch.cuda.get_device_capability(device_index)  # has_e4m3_cvt: unsupported_reason checked
    with torch.cuda.device(device_index):
        cubin, _ = compile_variant(major * 10 + minor, block_size, stride_ct, split, q_bf16, heads, flat=flat,
                                   fold=fold)
        return nvrtc.Kernel(cubin, "paged_decode_fp8")


def fold_counts_needed(num_kv_heads: int, flat_programs: int) -> int:
    """int32 counts a launch with the fold reads: one per row of the flat plan (2 per program)
    for each group of KV heads."""
    return num_kv_heads // heads_per_program(num_kv_heads) * 2 * flat_programs


def launch(q, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, out, part_out, part_lse, fold_counts, *,
           items: int, group_size: int, targets: tuple[int, int], split_cap: int, qk_scale: float,
           split: bool, flat: bool = False, flat_programs: int = 0, min_units: int = 1, unit_weight: int = 0,
           fold: int = 0) -> None:
    """One launch over the grid (head groups, items); kernel.paged_decode has checked the inputs.
    With flat, unequal lengths follow kernel.flat_plan over flat_programs of the items; with
    fold > 0 too, a sequence of more than `fold` pieces is combined in groups as its pieces
    finish (kernel.fold_groups), counted in fold_counts: zeros, fold_counts_needed of them,
    and zeros again when the launch ends. Without the fold (fold 0, which paged_decode passes
    whenever the flat plan is off), fold_counts is not read."""
    num_kv_heads = k_cache.shape[2]
    heads = heads_per_program(num_kv_heads)
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    fn = _kernel(device_index, k_cache.shape[1], k_cache.stride(1), split, q.dtype == torch.bfloat16, heads,
                 flat and split, fold)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    i64 = ctypes.c_longlong
    args = [ptr(q), ptr(k_cache), ptr(v_cache), ptr(block_tables), ptr(seq_lens), ptr(k_scale), ptr(v_scale),
            ptr(out), ptr(part_out), ptr(part_lse), ptr(fold_counts if fold else part_lse),
            ctypes.c_int(q.shape[0]), ctypes.c_int(group_size), ctypes.c_int(targets[0]), ctypes.c_int(targets[1]),
            ctypes.c_int(split_cap), ctypes.c_int(flat_programs), ctypes.c_int(min_units), ctypes.c_int(unit_weight), ctypes.c_float(qk_scale),
            i64(q.stride(0)), i64(q.stride(1)),
            i64(k_cache.stride(0)), i64(k_cache.stride(2)),  # bytes: 1-byte elements
            i64(block_tables.stride(0)), i64(out.stride(0)), i64(out.stride(1))]
    fn((num_kv_heads // heads, items, 1), (heads * WARPS_PER_HEAD * 32, 1, 1), args)
