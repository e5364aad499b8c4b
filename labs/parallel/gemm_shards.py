"""One GPU, the per-rank GEMMs of a TP-split layer: measured, then turned into a TP speedup by the alpha-beta model.

    python -m labs.parallel.gemm_shards --out out/ --record
    python -m labs.parallel.gemm_shards --models llama-3.1-8b --tp 1 2 --tokens 1 4096

A rank of a TP = t layer runs four matrix products whose output (q/k/v,
gate/up) or input (o, down) width is 1/t of the whole: the same work on one
GPU at a smaller shape. Timing those shapes on one GPU gives each rank's
compute; adding two all-reduces per layer from the alpha-beta model gives
the predicted layer time at TP = t, and the predicted speedup over TP = 1.
The multi-GPU run then measures the real one.

How it is timed: the four GEMMs of a layer run inside a CUDA graph (as vLLM's
decode does), cycling through enough copies of the weights that they never
sit in L2 (a real forward pass reads each layer's weights once), and the
graph's replay time is divided by the layers it holds. Attention's own
kernel (the KV-cache read) is not a GEMM and is not counted.

Exit codes: 0 done, 1 no CUDA GPU, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from labs import cli, specs
from labs.parallel import alphabeta, comm

MODELS = ("llama-3.1-8b", "llama-3.1-70b")
TP_DEGREES = (1, 2, 4, 8)
TOKENS = (1, 16, 128, 1024, 4096)
ROTATE_BYTES = 512 * 2**20   # bytes of copies of one GEMM's weight cycled per graph: ten times an H200's L2
DEFAULT_LINK = "nvlink-h200"


@dataclass(frozen=True)
class Gemm:
    name: str
    k: int   # input width
    n: int   # output width

    def weight_bytes(self, elem: int = 2) -> int:
        return self.k * self.n * elem


def shard_gemms(model: specs.ModelSpec, tp: int) -> tuple[Gemm, ...]:
    """The four products one TP rank runs per decoder layer (fused q/k/v and gate/up, as vLLM fuses them)."""
    h, d = model.hidden_size, model.head_dim
    if model.n_heads % tp or (model.n_kv_heads % tp and tp % model.n_kv_heads) or model.intermediate_size % tp:
        raise alphabeta.ModelError(f"{model.name}: TP = {tp} does not split its heads or intermediate size")
    q = model.n_heads // tp * d
    kv = max(1, model.n_kv_heads // tp) * d
    i = model.intermediate_size // tp
    return (Gemm("qkv", h, q + 2 * kv), Gemm("o", q, h), Gemm("gate_up", h, 2 * i), Gemm("down", i, h))


MLP_GEMMS = ("gate_up", "down")


def predict(model: specs.ModelSpec, tokens: int, times: dict[int, dict[str, float]], link: alphabeta.Link,
            graph: bool = True) -> list[dict]:
    """Per TP degree: measured GEMM time per layer, predicted all-reduce time, predicted speedup over TP = 1.

    `times[tp][gemm]` is seconds per layer for that rank's GEMM. The layer
    speedup counts two all-reduces; the MLP-only speedup counts one (the
    block the 2 x H200 anchor measured).
    """
    base = times[1]
    base_layer, base_mlp = sum(base.values()), sum(base[g] for g in MLP_GEMMS)
    out = []
    for tp in sorted(times):
        ar_t = alphabeta.collective_time("all_reduce", comm.tp_message_bytes(model, tokens), tp, link, graph)
        layer = sum(times[tp].values())
        mlp = sum(times[tp][g] for g in MLP_GEMMS)
        out.append({"tp": tp, "gemm_us": layer * 1e6, "mlp_gemm_us": mlp * 1e6, "allreduce_us": ar_t * 1e6,
                    "layer_us": (layer + comm.ALL_REDUCES_PER_LAYER * ar_t) * 1e6,
                    "speedup_layer": base_layer / (layer + comm.ALL_REDUCES_PER_LAYER * ar_t),
                    "speedup_mlp": base_mlp / (mlp + ar_t),
                    "gemm_scaling": base_layer / layer})
    return out


def measure(model: specs.ModelSpec, tp: int, tokens: int, reps: int = 10) -> dict[str, float]:
    """Seconds per layer of each shard GEMM on this GPU, bf16, inside a CUDA graph."""
    import torch

    gemms = shard_gemms(model, tp)
    dev = torch.device("cuda")
    out = {}
    for g in gemms:
        copies = max(2, -(-ROTATE_BYTES // g.weight_bytes()))
        ws = [torch.randn(g.n, g.k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(tokens, g.k, device=dev, dtype=torch.bfloat16)
        y = torch.empty(tokens, g.n, device=dev, dtype=torch.bfloat16)
        side = torch.cuda.Stream()  # warm up (cuBLAS handle, workspace, heuristics) on a side stream, as
        side.wait_stream(torch.cuda.current_stream())  # torch.cuda.graph's documentation asks
        with torch.cuda.stream(side):
            for w in ws:
                torch.matmul(x, w.T, out=y)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for w in ws:
                torch.matmul(x, w.T, out=y)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        out[g.name] = start.elapsed_time(end) / 1e3 / (reps * copies)
        del graph, ws, x, y
    torch.cuda.empty_cache()
    return out


def run(models, tps, tokens_list, link: alphabeta.Link) -> list[dict]:
    rows = []
    for name in models:
        model = specs.get_model(name)
        for tokens in tokens_list:
            times = {tp: measure(model, tp, tokens) for tp in sorted(set(tps) | {1})}
            for p in predict(model, tokens, times, link):
                rows.append({"model": name, "tokens": tokens, **p,
                             "gemms_us": {k: v * 1e6 for k, v in times[p["tp"]].items()}, "ok": True})
    return rows


def format_rows(rows: list[dict], link: alphabeta.Link) -> str:
    lines = [f"per-rank GEMMs of one decoder layer (measured, bf16, CUDA graph) + 2 all-reduces "
             f"(alpha-beta, {link.name}: alpha {link.alpha_us} us, beta {link.bus_bandwidth_gbps} GB/s)",
             f"{'model':>14} {'tokens':>6} {'TP':>3} {'GEMM us':>9} {'all-red us':>10} {'layer us':>9} "
             f"{'GEMM x':>7} {'layer x':>8} {'MLP x':>6}"]
    for r in rows:
        lines.append(f"{r['model']:>14} {r['tokens']:>6} {r['tp']:>3} {r['gemm_us']:>9.1f} {r['allreduce_us']:>10.1f} "
                     f"{r['layer_us']:>9.1f} {r['gemm_scaling']:>7.2f} {r['speedup_layer']:>8.2f} "
                     f"{r['speedup_mlp']:>6.2f}")
    return "\n".join(lines)


def _parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.parallel.gemm_shards", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", type=cli.choice(MODELS, "model"), default=list(MODELS),
                   help="dense models whose layers to slice (default: both)")
    p.add_argument("--tp", nargs="+", type=cli.choice([str(t) for t in TP_DEGREES], "TP degree"),
                   default=[str(t) for t in TP_DEGREES], help="TP degrees; 1 is always measured (default: 1 2 4 8)")
    p.add_argument("--tokens", nargs="+", type=cli.bounded_int(1, 16384, "tokens per step"), default=list(TOKENS),
                   help="tokens per forward pass (default: 1 16 128 1024 4096)")
    p.add_argument("--link", type=cli.choice(alphabeta.links(), "link"), default=DEFAULT_LINK,
                   help="interconnect whose alpha-beta constants price the all-reduce (default: %(default)s)")
    p.add_argument("--out", type=cli.output_dir, default=None, help="folder to write gemm_shards.json to")
    p.add_argument("--record", action="store_true",
                   help="merge the rows into labs/results/parallel_gemm_shards.json, keyed by GPU")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: the GEMM benchmark needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    link = alphabeta.get_link(args.link)
    rows = run(args.models, [int(t) for t in args.tp], args.tokens, link)
    print(format_rows(rows, link))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gemm_shards.json").write_text(json.dumps({"link": link.name, "rows": rows}, indent=1))
    if args.record:
        from labs.parallel import machine, results

        print(results.record("gemm", results.gpu_machine(1), [{**r, "link": link.name} for r in rows],
                             machine.versions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
