"""python -m labs.long_context: RoPE scaling rules side by side, and the KV wall of a deployment (no GPU needed).

    python -m labs.long_context rope                                  # Llama-3.1-8B's geometry and rope_scaling
    python -m labs.long_context rope --factor 16 --original-len 8192  # another extension
    python -m labs.long_context kv-wall --model llama-3.1-70b --gpu h100-sxm --weight-dtype fp8
    python -m labs.long_context kv-wall --model gemma-3-12b --gpu h200 --context 131072 --json

`rope` prints, per rule, how many rotary pairs it stretches, the longest position at which
no pair leaves its trained angles, how many pairs are outside them at each --positions value,
and the illustrative score q . R(distance) q at each of them. `kv-wall` prints, for bf16 and
fp8 KV, the pool, KV bytes per token, the longest context one request can reach, and how
many --context requests fit at once (labs/roofline.py max_context and kv_pool).
The GPU half of the lab is `python -m labs.long_context.decode_bench`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from labs import cli, roofline, specs
from labs.long_context import rope as R

ROPE_MODELS = tuple(n for n, m in specs.all_models().items() if m.rope_theta is not None)
POSITIONS = (4096, 8192, 16384, 32768, 65536, 131072)
MAX_TOKENS = 1 << 24


def _parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m labs.long_context", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="{rope,kv-wall}")
    r = sub.add_parser("rope", help="RoPE scaling rules side by side")
    r.add_argument("--model", default="llama-3.1-8b", type=cli.choice(ROPE_MODELS, "model"),
                   help="model whose head_dim, rope_theta and rope_scaling to use (default: %(default)s)")
    r.add_argument("--factor", type=cli.finite_float(1.0, 1024.0), default=None,
                   help="extension factor s, 1 to 1024 (default: the model's rope_scaling factor)")
    r.add_argument("--original-len", type=cli.bounded_int(1, MAX_TOKENS), default=None,
                   help="trained context L in tokens (default: the model's original_max_position_embeddings)")
    r.add_argument("--positions", type=cli.number_list(cli.bounded_int(0, MAX_TOKENS), 16), default=POSITIONS,
                   help="comma-separated positions (distances) to report, up to 16 (default: 4K to 128K)")
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    w = sub.add_parser("kv-wall", help="the longest context a deployment's KV pool holds")
    w.add_argument("--model", default="llama-3.1-8b", type=cli.choice(specs.all_models(), "model"),
                   help="model from labs/data/models.yaml (default: %(default)s)")
    w.add_argument("--gpu", default="h200", type=cli.choice(specs.all_gpus(), "GPU"),
                   help="GPU from labs/data/gpus.yaml (default: %(default)s)")
    w.add_argument("--tensor-parallel-size", type=cli.bounded_int(1, 64), default=1,
                   help="GPUs the model is split over; the pool is per GPU (default: %(default)s)")
    w.add_argument("--weight-dtype", default=None, type=cli.choice(roofline.WEIGHT_DTYPES, "weight dtype"),
                   help="weights' format (default: the dtype vLLM loads for the model)")
    w.add_argument("--context", type=cli.bounded_int(1, MAX_TOKENS), default=131072,
                   help="context of the requests to count (default: %(default)s)")
    w.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def rope_rows(model: str, factor: float | None, original_len: int | None, positions) -> list[dict]:
    m = specs.get_model(model)
    rows = []
    for method in R.METHODS:
        rp = R.for_model(method, m, factor, original_len)
        st = R.stretch(rp)
        rows.append({"method": method, "name": rp.name, "factor": rp.factor, "original_len": rp.original_len,
                     "pairs": rp.pairs, "untouched": sum(1 for x in st if abs(x - 1) < 1e-9),
                     "full": sum(1 for x in st if abs(x - rp.factor) < 1e-9 * rp.factor),
                     "reach": R.reach(rp), "logit_scale": R.logit_scale(rp),
                     "unseen": {p: R.unseen_pairs(rp, p) for p in positions},
                     "score": {p: R.score(rp, p) for p in positions}})
    return rows


def kv_wall_rows(model: str, gpu: str, tp: int, weight_dtype: str | None, context: int) -> list[dict]:
    rows = []
    for kv in ("auto", "fp8"):
        dep = roofline.deployment(model, gpu, tp=tp, kv_dtype=kv, weight_dtype=weight_dtype)
        wall = dep.max_context()
        pool = dep.kv_pool(context)
        rows.append({"kv_dtype": pool.kv_cache_dtype, "kv_pool_gib": pool.kv_pool / 2**30,
                     "kv_bytes_per_token": wall.kv_bytes_per_token, "max_context": wall.tokens,
                     "positions": wall.positions, "max_model_len": wall.max_model_len, "bound": wall.bound,
                     "context": context, "requests_at_context": pool.max_requests})
    return rows


def _reach(x: float) -> str:
    return "every pair turned in training" if math.isinf(x) else f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    try:
        if args.command == "rope":
            rows = rope_rows(args.model, args.factor, args.original_len, args.positions)
        else:
            rows = kv_wall_rows(args.model, args.gpu, args.tensor_parallel_size, args.weight_dtype, args.context)
    except (R.RopeError, specs.SpecError) as e:
        option = "--factor/--original-len" if args.command == "rope" else (
            "--tensor-parallel-size" if "tensor parallel" in str(e) else "--model")
        cli.reject(p, option, str(e))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if args.command == "rope":
        r0 = rows[0]
        print(f"{args.model}: d = {r0['pairs'] * 2}, L = {r0['original_len']:,}, s = {r0['factor']:g}; "
              f"{R.partial_pairs(R.for_model('rope', specs.get_model(args.model), args.factor, args.original_len))}"
              f" of {r0['pairs']} pairs never turned fully in training")
        pos = list(rows[0]["unseen"])
        print(f"{'rule':<28} {'kept':>4} {'÷s':>4} {'reach':>10} " + " ".join(f"{'@' + format(q, ','):>9}" for q in pos))
        for r in rows:
            print(f"{r['name']:<28} {r['untouched']:>4} {r['full']:>4} {_reach(r['reach']):>10} "
                  + " ".join(f"{r['unseen'][q]:>9}" for q in pos))
        print("columns @N: pairs outside their trained angles at position N")
        print(f"{'rule':<28} " + " ".join(f"{'@' + format(q, ','):>9}" for q in pos))
        for r in rows:
            print(f"{r['name']:<28} " + " ".join(f"{r['score'][q]:>9.3f}" for q in pos))
        print("columns @N: score q . R(N) q / |q|^2 for equal weight on every pair (1 at distance 0)")
        return 0
    print(f"{args.model} on {args.gpu}, TP = {args.tensor_parallel_size} (per GPU; cost model, derived)")
    print(f"{'KV':<9} {'pool GiB':>9} {'KV/token':>9} {'max context':>12} {'positions':>10} {'bound':>9} "
          f"{'requests @ ' + format(args.context, ','):>18}")
    for r in rows:
        print(f"{r['kv_dtype']:<9} {r['kv_pool_gib']:>9.1f} {r['kv_bytes_per_token']:>9,} {r['max_context']:>12,} "
              f"{r['positions']:>10,} {r['bound']:>9} {r['requests_at_context']:>18,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
