"""Tensor parallelism for real: the split decoder layer across processes equals the whole one.

    python -m labs.parallel.tp --world-size 2                  # gloo on CPU, small shapes
    python -m labs.parallel.tp --world-size 4 --backend gloo
    python -m labs.parallel.tp --world-size 2 --backend nccl   # one GPU per rank, bf16

Every rank builds the same full weights from one seed, keeps its shard, runs
the split layer, and all-reduces through torch.distributed; rank 0 compares
with the whole layer. The check counts the all-reduces: one per block, two
per decoder layer.

Tolerance. float32 (gloo): the split only reorders sums, so the outputs agree
to max|TP - whole| <= 1e-5 x max(1, max|whole|). bf16 (NCCL): both are
compared with a float64 run of the whole layer, and TP passes when its error
is at most twice the whole layer's own error plus one bf16 step (2^-8) of
the output's scale: TP may round differently, never worse in kind.

Exit codes: 0 all cases pass, 1 a case fails, 2 bad arguments.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from labs import cli
from labs.parallel.tp_layers import LayerShape

FP32_RTOL = 1e-5
BF16_STEP = 2.0 ** -8

# Small Llama-shaped layers: GQA with H_kv < TP (replicated KV heads) at 4 ranks, MHA, odd token counts.
CPU_CASES = (
    (LayerShape(hidden=128, intermediate=256, n_heads=8, n_kv_heads=2, head_dim=16), 7),
    (LayerShape(hidden=96, intermediate=192, n_heads=4, n_kv_heads=4, head_dim=24), 1),
    (LayerShape(hidden=256, intermediate=512, n_heads=16, n_kv_heads=4, head_dim=16), 33),
)
# One Llama-3.1-8B layer (4096 hidden, 14336 intermediate, 32 / 8 heads) on GPUs.
GPU_CASES = (
    (LayerShape(hidden=4096, intermediate=14336, n_heads=32, n_kv_heads=8, head_dim=128), 1),
    (LayerShape(hidden=4096, intermediate=14336, n_heads=32, n_kv_heads=8, head_dim=128), 512),
)


def _worker(rank: int, world: int, backend: str, init_method: str, args: dict) -> dict:
    import torch

    from labs.parallel import launch, tp_layers

    dist = launch.init_group(backend, init_method, rank, world, args.get("timeout_s", 60))
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    calls = {"n": 0}

    def all_reduce(t):
        calls["n"] += 1
        dist.all_reduce(t)

    rows = []
    for i, (shape_d, tokens) in enumerate(args["cases"]):
        shape = LayerShape(**shape_d)
        w = tp_layers.random_weights(shape, seed=i, dtype=dtype, device=device)
        g = torch.Generator(device="cpu").manual_seed(1000 + i)
        x = torch.randn(tokens, shape.hidden, generator=g).to(dtype=dtype, device=device)
        pos = torch.arange(tokens, device=device)
        ws = tp_layers.shard(w, shape, world, rank)
        row = {"case": i, "shape": shape_d, "tokens": tokens, "dtype": str(dtype).removeprefix("torch.")}
        for block in ("attention", "mlp", "layer"):
            before = calls["n"]
            if block == "attention":
                out = tp_layers.tp_attention_block(x, ws, shape, pos, all_reduce)
                ref = tp_layers.attention_block(x, w, shape, pos)
                ref64 = tp_layers.attention_block(x.double(), _to64(w), shape, pos)
            elif block == "mlp":
                out = tp_layers.tp_mlp_block(x, ws, shape, all_reduce)
                ref = tp_layers.mlp_block(x, w, shape)
                ref64 = tp_layers.mlp_block(x.double(), _to64(w), shape)
            else:
                out = tp_layers.tp_decoder_layer(x, ws, shape, pos, all_reduce)
                ref = tp_layers.decoder_layer(x, w, shape, pos)
                ref64 = tp_layers.decoder_layer(x.double(), _to64(w), shape, pos)
            scale = max(1.0, ref64.abs().max().item())
            err_tp = (out.double() - ref64).abs().max().item()
            err_whole = (ref.double() - ref64).abs().max().item()
            diff = (out.double() - ref.double()).abs().max().item()
            if dtype == torch.float32:
                bound = FP32_RTOL * scale
                ok = diff <= bound
            else:
                bound = 2 * err_whole + BF16_STEP * scale
                ok = err_tp <= bound
            row[block] = {"max_abs_diff": diff, "err_tp_vs_fp64": err_tp, "err_whole_vs_fp64": err_whole,
                          "bound": bound, "all_reduces": calls["n"] - before, "ok": bool(ok)}
        rows.append(row)
    return {"rank": rank, "rows": rows}


def _to64(w):
    return {k: v.double() for k, v in w.items()}


def check(world: int, backend: str = "gloo", cases=None, timeout_s: float = 120.0) -> list[dict]:
    """Run the cases on `world` ranks; rank 0's rows, each block with its error, bound and all-reduce count."""
    from labs.parallel import launch

    cases = cases if cases is not None else (GPU_CASES if backend == "nccl" else CPU_CASES)
    for shape, _ in cases:
        shape.check_tp(world)
    payload = {"cases": [(asdict(s), t) for s, t in cases], "timeout_s": min(60.0, timeout_s)}
    return launch.run(_worker, world, backend, payload, timeout_s)[0]["rows"]


def expected_all_reduces(block: str) -> int:
    return 2 if block == "layer" else 1


def all_ok(rows: list[dict]) -> bool:
    return all(r[b]["ok"] and r[b]["all_reduces"] == expected_all_reduces(b)
               for r in rows for b in ("attention", "mlp", "layer"))


def format_rows(rows: list[dict], world: int, backend: str) -> str:
    out = [f"TP = {world} over {backend}: split layer vs whole layer",
           f"{'case':>4} {'tokens':>6} {'H':>5} {'I':>6} {'Hq/Hkv':>7} {'block':>9} {'max|diff|':>10} "
           f"{'bound':>9} {'all-reduces':>11}  ok"]
    for r in rows:
        s = r["shape"]
        for b in ("attention", "mlp", "layer"):
            c = r[b]
            shown = c["max_abs_diff"] if r["dtype"] == "float32" else c["err_tp_vs_fp64"]
            out.append(f"{r['case']:>4} {r['tokens']:>6} {s['hidden']:>5} {s['intermediate']:>6} "
                       f"{s['n_heads']:>3}/{s['n_kv_heads']:<3} {b:>9} {shown:>10.2e} {c['bound']:>9.2e} "
                       f"{c['all_reduces']:>11}  {'yes' if c['ok'] else 'NO'}")
    return "\n".join(out)


def _parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.parallel.tp", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 1)[1], formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=cli.bounded_int(2, 8, "ranks"), default=2,
                   help="tensor-parallel ranks, one process each (default: %(default)s)")
    p.add_argument("--backend", type=cli.choice(("gloo", "nccl"), "backend"), default="gloo",
                   help="gloo (CPU, float32) or nccl (one CUDA GPU per rank, bf16) (default: %(default)s)")
    p.add_argument("--timeout", type=cli.finite_float(5, 600, unit="seconds"), default=120.0,
                   help="kill the ranks and fail after this long (default: %(default)s)")
    p.add_argument("--out", type=cli.output_dir, default=None, help="folder to write tp_check.json to")
    p.add_argument("--record", action="store_true",
                   help="merge the rows into labs/results/parallel_tp_check.json, keyed by machine (GPUs, count, link)")
    p.add_argument("--replace", action="store_true", help="with --record, let failing rows replace passing ones")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from labs.parallel import launch
    from labs.parallel.tp_layers import ShardError

    if args.backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < args.world_size:
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            cli.reject(parser, "--world-size", f"nccl needs one CUDA GPU per rank: asked {args.world_size}, "
                                               f"this machine has {have}")
    try:
        rows = check(args.world_size, args.backend, timeout_s=args.timeout)
    except ShardError as exc:
        cli.reject(parser, "--world-size", str(exc))
    except launch.LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_rows(rows, args.world_size, args.backend))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tp_check.json").write_text(json.dumps(
            {"world_size": args.world_size, "backend": args.backend, "rows": rows}, indent=1))
    ok = all_ok(rows)
    print("all cases pass" if ok else "FAILED: a case exceeds its bound or made the wrong number of all-reduces")
    if args.record:
        from labs.parallel import machine, results

        where = results.gpu_machine(args.world_size) if args.backend == "nccl" else results.CPU
        keyed = [{**r, "ok": all(r[b]["ok"] and r[b]["all_reduces"] == expected_all_reduces(b)
                                 for b in ("attention", "mlp", "layer")),
                  "world_size": args.world_size, "backend": args.backend} for r in rows]
        print(results.record("tp", where, keyed, machine.versions(), replace=args.replace))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
