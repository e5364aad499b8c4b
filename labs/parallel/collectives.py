"""Collectives benchmark: all-reduce, all-gather, reduce-scatter and all-to-all over message sizes.

    python -m labs.parallel.collectives --world-size 2 --out out/            # NCCL, one GPU per rank
    python -m labs.parallel.collectives --world-size 2 --backend gloo --max-size 1MiB   # CPU smoke run

For each collective and size it times the operation on every rank and keeps
the slowest rank (a collective ends when its last rank does), then reports
algbw = S / t and busbw = algbw x f(n), nccl-tests' definitions (S is the
buffer each rank holds for all-reduce, the gathered output for all-gather,
the input for reduce-scatter, the send buffer for all-to-all). Messages up to
--graph-max are timed twice: eagerly, one launch per call, and replayed from
a CUDA graph of --graph-calls calls, which removes the host launch cost that
dominates a small message. Last, it fits t = alpha + f S / beta to the eager
points of each collective (labs.parallel.alphabeta.fit).

Exit codes: 0 done, 1 a rank failed or timed out, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from labs import cli
from labs.parallel import alphabeta

KIB, MIB, GIB = 1024, 1024**2, 1024**3
OPS = alphabeta.COLLECTIVES


def parse_size(text: str) -> int:
    """'8KiB', '1MiB', '1GiB' or a plain byte count -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size such as 8KiB, 64MiB or 1GiB, got {text!r}")
    value = int(m.group(1)) * {"B": 1, None: 1, "KiB": KIB, "MiB": MIB, "GiB": GIB}[m.group(2)]
    if not 1 <= value <= 4 * GIB:
        raise argparse.ArgumentTypeError(f"expected a size from 1 B to 4GiB, got {text!r}")
    return value


parse_size.kind = "size"  # type: ignore[attr-defined]


def sizes_between(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def _iters(size: int, cuda: bool = True) -> int:
    """Enough calls that a point takes a few ms, few enough that 1 GiB stays bounded."""
    return max(5, min(200 if cuda else 20, int(64 * MIB / max(size, 1))))


def _worker(rank: int, world: int, backend: str, init_method: str, args: dict) -> dict:
    import time

    import torch

    from labs.parallel import launch

    dist = launch.init_group(backend, init_method, rank, world, 120)
    cuda = backend == "nccl"
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()

    def make(op: str, size: int):
        n = size // esize
        if op == "all_reduce":
            buf = torch.ones(n, dtype=dtype, device=device)
            return lambda: dist.all_reduce(buf)
        if op == "all_gather":
            out = torch.empty(n - n % world, dtype=dtype, device=device)
            inp = torch.ones(out.numel() // world, dtype=dtype, device=device)
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: gather(out, inp)
        if op == "reduce_scatter":
            inp = torch.ones(n - n % world, dtype=dtype, device=device)
            out = torch.empty(inp.numel() // world, dtype=dtype, device=device)
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: scatter(out, inp)
        inp = torch.ones(n - n % world, dtype=dtype, device=device)
        out = torch.empty_like(inp)
        return lambda: dist.all_to_all_single(out, inp)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    rows = []
    for op in args["ops"]:
        for size in args["sizes"]:
            try:
                call = make(op, size)
                for _ in range(3):
                    call()
                sync()
            except (RuntimeError, NotImplementedError) as exc:
                rows.append({"op": op, "size": size, "mode": "eager", "error": str(exc).splitlines()[0][:160]})
                continue
            iters = _iters(size, cuda)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            sync()
            t = slowest((time.perf_counter() - t0) / iters)
            rows.append({"op": op, "size": size, "mode": "eager", "seconds": t, "iters": iters})
            if cuda and size <= args["graph_max"]:
                k = args["graph_calls"]
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    call()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(k):
                        call()
                graph.replay()
                sync()
                dist.barrier()
                reps = max(3, iters // k)
                t0 = time.perf_counter()
                for _ in range(reps):
                    graph.replay()
                sync()
                t = slowest((time.perf_counter() - t0) / (reps * k))
                rows.append({"op": op, "size": size, "mode": "graph", "seconds": t, "iters": reps * k})
                del graph
    return {"rows": rows}


def summarise(rows: list[dict], world: int) -> tuple[list[dict], list[dict]]:
    """Rows with algbw/busbw added, and one alpha-beta fit per collective over its eager points."""
    out = []
    for r in rows:
        r = dict(r)
        if "seconds" in r:
            r["algbw_gbps"] = r["size"] / r["seconds"] / 1e9
            r["busbw_gbps"] = alphabeta.bus_bandwidth(r["op"], world, r["size"], r["seconds"]) / 1e9
        out.append(r)
    fits = []
    for op in OPS:
        pts = [r for r in out if r["op"] == op and r["mode"] == "eager" and "seconds" in r]
        if len(pts) < 2:
            continue
        try:
            f = alphabeta.fit(op, world, [p["size"] for p in pts], [p["seconds"] for p in pts])
        except alphabeta.ModelError as exc:
            fits.append({"op": op, "n": world, "error": str(exc)})
            continue
        fits.append({"op": op, "n": world, "alpha_us": f.alpha * 1e6, "beta_gbps": f.beta / 1e9,
                         "points": f.points, "max_rel_error": f.max_rel_error})
    return out, fits


def format_table(rows: list[dict], fits: list[dict], world: int, backend: str) -> str:
    lines = [f"collectives over {world} ranks ({backend})",
             f"{'op':>14} {'size':>10} {'mode':>6} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['op']:>14} {_size(r['size']):>10} {r['mode']:>6}  not supported: {r['error']}")
            continue
        lines.append(f"{r['op']:>14} {_size(r['size']):>10} {r['mode']:>6} {r['seconds'] * 1e6:>10.1f} "
                     f"{r['algbw_gbps']:>11.2f} {r['busbw_gbps']:>11.2f}")
    lines.append("alpha-beta fit, t = alpha + f(n) S / beta, eager points:")
    for f in fits:
        if "error" in f:
            lines.append(f"{f['op']:>14}  no fit: {f['error']}")
            continue
        lines.append(f"{f['op']:>14}  alpha {f['alpha_us']:8.1f} us  beta {f['beta_gbps']:8.1f} GB/s  "
                     f"max error {f['max_rel_error'] * 100:5.1f}% over {f['points']} sizes")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def _parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.parallel.collectives", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=cli.bounded_int(2, 8, "ranks"), default=2,
                   help="ranks, one process (and on nccl one GPU) each (default: %(default)s)")
    p.add_argument("--backend", type=cli.choice(("nccl", "gloo"), "backend"), default="nccl",
                   help="nccl on GPUs, gloo on the CPU (default: %(default)s)")
    p.add_argument("--ops", nargs="+", type=cli.choice(OPS, "collective"), default=list(OPS),
                   help="collectives to time (default: all four)")
    p.add_argument("--min-size", type=parse_size, default=8 * KIB, help="smallest message (default: 8KiB)")
    p.add_argument("--max-size", type=parse_size, default=1 * GIB, help="largest message (default: 1GiB)")
    p.add_argument("--graph-max", type=parse_size, default=1 * MIB,
                   help="also time messages up to this size inside a CUDA graph (default: 1MiB)")
    p.add_argument("--graph-calls", type=cli.count(100, "calls per graph"), default=20,
                   help="collectives captured per CUDA graph (default: %(default)s)")
    p.add_argument("--timeout", type=cli.finite_float(10, 600, unit="seconds"), default=300.0,
                   help="kill the ranks and fail after this long (default: %(default)s)")
    p.add_argument("--out", type=cli.output_dir, default=None, help="folder to write collectives.json to")
    p.add_argument("--record", action="store_true",
                   help="merge the rows into labs/results/parallel_collectives.json, keyed by GPU, count and link")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.min_size > args.max_size:
        cli.reject(parser, "--min-size", f"must not exceed --max-size ({_size(args.max_size)})")
    if args.backend == "gloo" and args.max_size > 64 * MIB:
        cli.reject(parser, "--max-size", "gloo runs on the CPU: at most 64MiB")
    if args.record and args.backend != "nccl":
        cli.reject(parser, "--record", "records only NCCL runs on GPUs")
    from labs.parallel import launch, machine, results

    if args.backend == "nccl":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < args.world_size:
            cli.reject(parser, "--world-size", f"nccl needs one CUDA GPU per rank: asked {args.world_size}, "
                                               f"this machine has {have}")
    sizes = sizes_between(args.min_size, args.max_size)
    payload = {"ops": args.ops, "sizes": sizes, "graph_max": args.graph_max, "graph_calls": args.graph_calls}
    try:
        raw = launch.run(_worker, args.world_size, args.backend, payload, args.timeout)[0]["rows"]
    except launch.LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows, fits = summarise(raw, args.world_size)
    print(format_table(rows, fits, args.world_size, args.backend))
    doc = {"world_size": args.world_size, "backend": args.backend, "rows": rows, "fits": fits}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "collectives.json").write_text(json.dumps(doc, indent=1))
    if args.record:
        measured = [{**r, "ok": True} for r in rows if "seconds" in r]

        def derive(all_rows):
            return {"fits": summarise(all_rows, args.world_size)[1]}

        print(results.record("collectives", results.gpu_machine(args.world_size), measured, machine.versions(),
                             derive=derive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
