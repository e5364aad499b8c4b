"""What the compiler makes of the decode kernel, read on any machine, GPU or not.

Run:

    python -m labs.paged_attention.compiled                 # fp8, the default configuration, sm_90
    python -m labs.paged_attention.compiled --dtype bf16 --split --arch 90

Why: the fp8 kernel's speed turned on one compiler decision (whether Triton converts the
e4m3 V tile where it was loaded or in the matrix unit's operand layout, where it reads the
tile a byte at a time; NOTES.md, v5). That decision is visible in the PTX, and Triton can
produce PTX for a GPU that is not there: its CUDA backend and `ptxas` ship with the wheel.
So a laptop can check it, and a test can keep it true.

The kernel is compiled as the launcher would specialise it for a (64, 4,096) batch of
Llama-3-8B heads (32 query, 8 KV, head_dim 128, block size 16): every pointer and every
stride that is a multiple of 16 is marked divisible by 16, and stride 1 becomes a constant.
Counts are of PTX instruction names in the whole kernel.

TRITON_INTERPRET must be unset in the process that compiles: under the interpreter the
kernel is not a compilable function.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from labs import cli

# PTX instructions worth counting, and what each says about the kernel.
INSTRUCTIONS = {
    "ld.shared.b8": "a shared-memory load of one byte (the 8-bit tile read a byte at a time)",
    "cvt.rn.f16x2.e4m3x2": "two e4m3 values converted to fp16",
    "ldmatrix": "a shared-memory matrix load for the matrix unit",
    "mma.sync": "a matrix-unit product",
    "cp.async.cg.shared": "a 16-byte asynchronous global-to-shared copy (the software pipeline)",
    "cp.async.ca.shared": "a 4- or 8-byte asynchronous global-to-shared copy",
}

# The launcher's values for the (64, 4,096) Llama-3-8B batch: used for the divisibility
# marks only, so any shape with the same multiples of 16 compiles the same code.
_RUNTIME_INTS = dict(batch=64, group_size=4, target_uniform=64, target_ragged=264, split_cap=128,
                     stride_qb=4096, stride_qh=128, stride_cb=16384, stride_ct=1024, stride_ch=128,
                     stride_vb=16384, stride_vt=1024, stride_vh=128, stride_vd=1, stride_tb=256,
                     stride_ob=4096, stride_oh=128)
_POINTER_TYPES = {"q_ptr": "*bf16", "out_ptr": "*bf16", "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32",
                  "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}


def decode_kernel_ptx(*, fp8: bool = True, split: bool = False, arch: int = 90, tile_n: int | None = None,
                      num_warps: int | None = None, num_stages: int | None = None) -> str:
    """PTX of `paged_decode_kernel` for compute capability `arch`, as the launcher configures it."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: the interpreter's kernels cannot be compiled")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from labs.paged_attention import kernel

    fn = kernel.paged_decode_kernel
    config = kernel.default_config(fp8)
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in ("k_cache_ptr", "v_cache_ptr"):
            signature[name] = "*fp8e4nv" if fp8 else "*bf16"
        elif name.endswith("_ptr"):
            signature[name] = _POINTER_TYPES[name]
        elif name == "qk_scale":
            signature[name] = "fp32"
        elif name.isupper():
            signature[name] = "constexpr"
        elif _RUNTIME_INTS.get(name) == 1:
            signature[name], constants[name] = "constexpr", 1
        else:
            signature[name] = "i32"
        if signature[name].startswith("*") or (_RUNTIME_INTS.get(name, 1) % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    constants.update(
        BLOCK_SIZE=16, HEAD_DIM=128, D_PAD=128, G_PAD=16, B_PAD=64,
        TILE_N=tile_n or config.tile_n,
        SPLIT=split, FP8=fp8, FP8_PTX=fp8, V_BY_DIM=False, USE_GDC=False, DOT_PRECISION="tf32",
    )
    options = {
        "num_warps": num_warps or config.num_warps,
        "num_stages": num_stages or config.num_stages,
        "maxnreg": kernel.MAX_REGISTERS,
    }
    compiled = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    return compiled.asm["ptx"]


def reduction_ptx(*, flat: bool, fold: int = 0, arch: int = 90) -> str:
    """PTX of `split_reduce_kernel` as the launcher configures it behind the CUDA fp8 kernel at
    batch 64 (one warp, the batched chunks, programmatic dependent launch): the flat plan,
    with `fold` (0: none), or the chunked plan a forced split count takes. The interpreter
    runs the reduction as Python, so only a real compile checks that its code compiles."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: the interpreter's kernels cannot be compiled")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from labs.paged_attention import fp8_decode, kernel

    fn = kernel.split_reduce_kernel
    config = kernel.default_config(True, "cuda")
    pointers = {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "seq_lens_ptr": "*i32"}
    signature = {name: pointers.get(name, "constexpr" if name.isupper() else "i32") for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in pointers}
    constants = dict(HEAD_DIM=128, D_PAD=128, B_PAD=64, TILE_N=config.tile_n, S_CHUNK=config.reduce_chunk,
                     S_SMALL=config.reduce_small, CHUNKED=config.chunked, RANK_MAX=fp8_decode.RANK_MAX_BATCH,
                     FLAT=flat, FOLD=fold, USE_GDC=kernel.gdc_wait is not None)
    options = {"num_warps": kernel.REDUCE_NUM_WARPS_BATCHED, "num_stages": 2}
    compiled = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    return compiled.asm["ptx"]


def count_instructions(ptx: str) -> dict[str, int]:
    """How often each of INSTRUCTIONS' names occurs in the PTX text."""
    return {name: ptx.count(name) for name in INSTRUCTIONS}


def main(argv: Sequence[str] | None = None) -> int:
    p = cli.Parser(prog="python -m labs.paged_attention.compiled", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=("fp8", "bf16"), default="fp8", help="the cache's dtype (default fp8)")
    p.add_argument("--split", action="store_true", help="the split-K variant (partials and a reduction)")
    p.add_argument("--arch", type=int, choices=(80, 89, 90), default=90,
                   help="compute capability to compile for, as 80, 89 or 90 (default 90: H100/H200)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    counts = count_instructions(decode_kernel_ptx(fp8=args.dtype == "fp8", split=args.split, arch=args.arch))
    if args.json:
        print(json.dumps(counts))
    else:
        for name, n in counts.items():
            print(f"{n:6d}  {name:<22} {INSTRUCTIONS[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
