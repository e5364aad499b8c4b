"""Planner: which TP / PP / DP / EP layouts fit a model on a cluster, and what each costs to communicate.

    python -m labs.parallel.plan --model llama-3.1-70b --gpu h200 --gpus-per-node 8
    python -m labs.parallel.plan --model deepseek-v3 --gpu h200 --nodes 2 --inter-node-gbps 40
    python -m labs.parallel.plan --model mixtral-8x7b --gpu-memory-gib 44 --intra-link pcie5-x16

For every split of the cluster's GPUs into TP x PP x DP (and, for MoE
models, with and without expert parallelism) it checks what vLLM 0.33
checks (TP divides the query heads; TP divides the KV heads or is a multiple
of them), places the weights as vLLM does, and sizes the KV room left. A
layout fits when one request of --max-model-len tokens fits its KV cache.
For the layouts that fit it prices one decode step of --batch sequences per
replica with the alpha-beta model (labs/data/interconnects.yaml):

  TP   two all-reduces of batch x hidden x 2 bytes per layer, over NVLink while TP stays in one
       node, over the inter-node link once it crosses;
  PP   one hand-off of hidden_states and residual per stage boundary;
  MoE  with DP > 1, vLLM's default all-gather of every DP rank's tokens and a reduce-scatter back
       per MoE layer (--moe-dispatch allgather), or with EP a dispatch and a combine all-to-all of k
       copies per token (--moe-dispatch all-to-all, what DeepEP does); with DP = 1, the all-reduce TP
       does, EP or not (tokens are replicated over the TP ranks).

Weights (vLLM's placement): attention, embeddings and dense MLPs split over TP x PP and are
copied per DP replica; an MoE model's experts split over TP x DP x PP with or without EP
(without EP each expert is sliced over TP x DP, with EP each rank holds whole experts).
All figures are derived, not measured.

Exit codes: 0 at least one layout fits, 1 none does, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

from labs import cli, roofline, specs, vllm_facts
from labs.kv_sizing import formula
from labs.kv_sizing.memory_budget import (CUDAGRAPH_ESTIMATE, GIB, NON_TORCH_ESTIMATE, NON_TORCH_TP_EXTRA,
                                          estimate_activation_peak, vllm_batch_defaults)
from labs.parallel import alphabeta, comm


@dataclass(frozen=True)
class Cluster:
    gpu_memory_bytes: int
    gpus_per_node: int
    nodes: int
    intra: alphabeta.Link
    inter: alphabeta.Link
    gpu: specs.GPUSpec

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    ep: bool
    weights_gib: float
    kv_room_gib: float
    kv_tokens: int
    requests: int                 # of max_model_len, per replica, rounded down
    fits: bool
    comm_bytes_per_token: float   # on the wire, all GPUs together, per generated token (decode)
    comm_us_per_step: float       # alpha-beta, one decode step of `batch` per replica
    tp_link: str
    crosses_nodes: str            # what leaves the node: "TP", "PP", "EP", "DP only" or "-"
    note: str = ""

    @property
    def requests_total(self) -> int:
        """Max-length requests all DP replicas hold together."""
        return self.requests * self.dp

    @property
    def name(self) -> str:
        return f"TP={self.tp} PP={self.pp} DP={self.dp}" + (" EP" if self.ep else "")


def split_weights(model: specs.ModelSpec) -> tuple[int, int]:
    """(routed-expert bytes, everything-else bytes) at the dtype vLLM loads, from the cost model's split."""
    dep = roofline.deployment(model, "h200")
    expert_bytes = dep.params.routed_experts * dep.bytes_per_weight
    return expert_bytes, roofline.weight_bytes(dep) - expert_bytes


def head_check(model: specs.ModelSpec, tp: int) -> str:
    """Why vLLM would refuse this TP degree, or '' when it accepts it."""
    if model.n_heads % tp:
        return f"TP={tp} does not divide the {model.n_heads} query heads"
    if model.mla is None and model.n_kv_heads % tp and tp % model.n_kv_heads:
        return f"TP={tp} neither divides nor is a multiple of the {model.n_kv_heads} KV heads"
    return ""


def _powers_of_two(n: int):
    p = 1
    while p <= n:
        if n % p == 0:
            yield p
        p *= 2


def layouts(model: specs.ModelSpec, cluster: Cluster, max_model_len: int, batch: int,
            utilization: float, backend: str = "allgather") -> tuple[list[Layout], list[str]]:
    """Every layout that passes vLLM's checks (fitting or not), and the rejected ones with reasons."""
    out, rejected = [], []
    g = cluster.gpus
    expert_bytes, dense_bytes = split_weights(model)
    usable = cluster.gpu_memory_bytes * utilization
    for tp in _powers_of_two(g):
        why = head_check(model, tp)
        if why:
            rejected.append(why)
            continue
        for pp in [p for p in range(1, g // tp + 1) if (g // tp) % p == 0]:
            if pp > model.n_layers:
                continue
            dp = g // (tp * pp)
            for ep in ((False, True) if model.moe is not None and tp * dp > 1 else (False,)):
                out.append(_price(model, cluster, tp, pp, dp, ep, expert_bytes, dense_bytes, usable,
                                  max_model_len, batch, backend))
    return out, rejected


def _price(model, cluster: Cluster, tp, pp, dp, ep, expert_bytes, dense_bytes, usable, max_model_len, batch,
           backend) -> Layout:
    weights = dense_bytes / (tp * pp) + expert_bytes / (tp * dp * pp)
    tokens_per_step, seqs = vllm_batch_defaults(cluster.gpu)
    overhead = (estimate_activation_peak(model, tokens_per_step, seqs, tp) + NON_TORCH_ESTIMATE
                + (NON_TORCH_TP_EXTRA if tp * pp > 1 else 0) + CUDAGRAPH_ESTIMATE)
    room = usable - weights - overhead
    stage_layers = math.ceil(model.n_layers / pp)
    kv_per_token = formula.kv_bytes_per_token(model, tp=tp) * stage_layers / model.n_layers
    kv_tokens = max(0, int(room // kv_per_token)) if room > 0 else 0
    requests = kv_tokens // max_model_len
    fits = requests >= 1

    c = decode_comm(model, cluster, tp, pp, dp, ep, backend, batch)
    return Layout(tp, pp, dp, ep, weights / GIB, room / GIB, kv_tokens, requests, fits, c.bytes_per_token,
                  c.seconds * 1e6, c.tp_link, ", ".join(c.crosses) or "-", c.note)


@dataclass(frozen=True)
class DecodeComm:
    bytes_per_token: float   # on the wire, all GPUs together, per generated token
    seconds: float           # one decode step, collectives in sequence (alpha-beta)
    tp_link: str
    crosses: tuple[str, ...]
    note: str


def decode_comm(model: specs.ModelSpec, cluster: Cluster, tp: int, pp: int, dp: int, ep: bool,
                backend: str, batch: int) -> DecodeComm:
    """The collectives of one decode step of `batch` sequences per replica, as vLLM 0.33 runs them.

    Ranks are laid out TP fastest, then PP, then DP (vLLM's order). MoE layers
    with DP > 1 gather every DP rank's tokens: with the default
    `allgather_reducescatter` backend an all-gather over the DP group and a
    reduce-scatter back (plus the TP all-reduce when TP > 1), whether or not
    EP is on; with a dispatch-to-owner backend (DeepEP) and EP, one all-to-all
    each way carrying k copies of each token.
    """
    gpn, g = cluster.gpus_per_node, tp * pp * dp
    h, b = model.hidden_size, comm.ACT_BYTES
    msg = batch * h * b
    tp_link = cluster.intra if tp <= gpn else cluster.inter
    dp_link = cluster.intra if g <= gpn else cluster.inter
    moe_n = comm.moe_layers(model)
    crosses, note = [], ""
    if tp > gpn:
        crosses.append("TP")

    # Attention and dense MLPs: one TP all-reduce per block.
    ar_blocks = model.n_layers + (model.n_layers - moe_n)
    total = ar_blocks * 2 * (tp - 1) * msg * dp
    t = ar_blocks * alphabeta.collective_time("all_reduce", msg, tp, tp_link)
    if moe_n:
        if dp == 1:
            total += moe_n * 2 * (tp - 1) * msg
            t += moe_n * alphabeta.collective_time("all_reduce", msg, tp, tp_link)
            note = (f"EP over {tp} GPUs: whole experts per GPU, same all-reduce as TP" if ep
                    else f"experts sliced over TP = {tp}")
        elif ep and backend == "all-to-all":
            n = tp * dp
            k = model.moe.experts_per_token
            send = max(1, batch // tp) * k * h * b
            total += moe_n * 2 * n * (n - 1) / n * send
            t += moe_n * 2 * alphabeta.collective_time("all_to_all", send, n, dp_link)
            note = f"EP over {n} GPUs, DP attention, all-to-all dispatch (k = {k} copies per token)"
            if dp_link is cluster.inter:
                crosses.append("EP")
        else:
            gathered = dp * msg
            total += moe_n * 2 * tp * dp * (dp - 1) / dp * gathered
            t += moe_n * (alphabeta.collective_time("all_gather", gathered, dp, dp_link)
                          + alphabeta.collective_time("reduce_scatter", gathered, dp, dp_link))
            if tp > 1:
                total += moe_n * 2 * (tp - 1) * msg * dp
                t += moe_n * alphabeta.collective_time("all_reduce", msg, tp, tp_link)
            note = (f"{'EP' if ep else 'experts sliced'} over TP x DP = {tp * dp}; "
                    f"all-gather + reduce-scatter over DP = {dp}")
            if dp_link is cluster.inter:
                crosses.append("EP" if ep else "MoE")

    # Pipeline hand-offs: a boundary crosses nodes when the next stage starts on a new node.
    for s in range(1, pp):
        link = cluster.inter if tp > gpn or (s * tp) % gpn == 0 else cluster.intra
        if link is cluster.inter and "PP" not in crosses:
            crosses.append("PP")
        total += batch * comm.pp_bytes_per_token(model) * dp
        t += alphabeta.send_time(batch * comm.pp_bytes_per_token(model), link)
    if not crosses and g > gpn:
        crosses.append("DP only")
    return DecodeComm(total / (dp * batch), t, tp_link.name, tuple(crosses), note)


def format_plan(model: specs.ModelSpec, cluster: Cluster, rows: list[Layout], rejected: list[str],
                max_model_len: int, batch: int, top: int) -> str:
    fitting = sorted((r for r in rows if r.fits), key=lambda r: (r.tp * r.pp, r.comm_us_per_step))
    lines = [f"{model.display_name} on {cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs "
             f"({cluster.gpu_memory_bytes / GIB:.1f} GiB each), intra {cluster.intra.name}, inter {cluster.inter.name}; "
             f"decode batch {batch} per replica, max_model_len {max_model_len:,} (derived)",
             f"{'layout':>20} {'weights GiB':>11} {'KV GiB':>7} {'requests':>8} {'wire B/token':>13} "
             f"{'comm us/step':>12} {'leaves node':>11}  note"]
    for r in fitting[:top]:
        lines.append(f"{r.name:>20} {r.weights_gib:>11.1f} {r.kv_room_gib:>7.1f} {r.requests_total:>8,} "
                     f"{r.comm_bytes_per_token:>13,.0f} {r.comm_us_per_step:>12.1f} {r.crosses_nodes:>11}  {r.note}")
    if len(fitting) > top:
        lines.append(f"... {len(fitting) - top} more layouts fit (--top shows more)")
    unfit = [r for r in rows if not r.fits]
    if unfit:
        lines.append(f"{len(unfit)} layouts do not fit one {max_model_len:,}-token request: "
                     + ", ".join(r.name for r in unfit[:6]) + (" ..." if len(unfit) > 6 else ""))
    for why in dict.fromkeys(rejected):
        lines.append(f"refused by vLLM's checks: {why}")
    if not fitting:
        lines.append("no layout fits: add GPUs, shorten --max-model-len, or quantize the weights")
    return "\n".join(lines)


def _parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.parallel.plan", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=cli.choice(specs.all_models(), "model"), default="llama-3.1-70b",
                   help="model from labs/data/models.yaml (default: %(default)s)")
    p.add_argument("--gpu", type=cli.choice(specs.all_gpus(), "GPU"), default="h200",
                   help="GPU from labs/data/gpus.yaml, for its memory and vLLM's batch defaults (default: %(default)s)")
    p.add_argument("--gpu-memory-gib", type=cli.finite_float(1, 1024, lo_open=False, unit="GiB"), default=None,
                   help="memory per GPU instead of --gpu's driver-reported total")
    p.add_argument("--gpus-per-node", type=cli.bounded_int(1, 72, "GPUs in one NVLink domain"), default=8,
                   help="GPUs that share the fast intra-node link (default: %(default)s)")
    p.add_argument("--nodes", type=cli.bounded_int(1, 64), default=1, help="nodes (default: %(default)s)")
    p.add_argument("--intra-link", type=cli.choice(alphabeta.links(), "link"), default="nvlink-h200",
                   help="link between GPUs of one node (default: %(default)s)")
    p.add_argument("--inter-link", type=cli.choice(alphabeta.links(), "link"), default="ib-ndr400",
                   help="link between nodes (default: %(default)s)")
    p.add_argument("--inter-node-gbps", type=cli.finite_float(0, 1000, lo_open=True, unit="GB/s per GPU"),
                   default=None, help="bus bandwidth between nodes, replacing --inter-link's")
    p.add_argument("--max-model-len", type=cli.bounded_int(1, 10**7, "tokens"), default=8192,
                   help="context one request may reach (default: %(default)s)")
    p.add_argument("--batch", type=cli.bounded_int(1, 65536, "sequences"), default=64,
                   help="sequences in one decode step per replica (default: %(default)s)")
    p.add_argument("--gpu-memory-utilization", type=cli.fraction,
                   default=vllm_facts.resolved_default("gpu_memory_utilization"),
                   help="share of each GPU's memory vLLM may use (vLLM 0.33 default: %(default)s)")
    p.add_argument("--moe-dispatch", type=cli.choice(("allgather", "all-to-all"), "MoE dispatch"),
                   default="allgather",
                   help="how MoE layers with DP > 1 move tokens: allgather = vLLM's default allgather_reducescatter "
                        "backend, all-to-all = a dispatch to the experts' GPUs as the DeepEP backends do "
                        "(default: %(default)s)")
    p.add_argument("--top", type=cli.bounded_int(1, 1000), default=12, help="layouts to print (default: %(default)s)")
    p.add_argument("--out", type=cli.output_dir, default=None, help="folder to write plan.json to")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    model = specs.get_model(args.model)
    gpu = specs.get_gpu(args.gpu)
    if args.max_model_len > model.max_position_embeddings:
        cli.reject(parser, "--max-model-len", f"{model.name} takes at most {model.max_position_embeddings:,} tokens")
    inter = alphabeta.get_link(args.inter_link)
    if args.inter_node_gbps is not None:
        inter = inter.with_(bus_bandwidth_gbps=args.inter_node_gbps,
                            peak_gbps_per_direction=max(inter.peak_gbps_per_direction, args.inter_node_gbps),
                            provenance={**inter.provenance, "bus_bandwidth_gbps": "assumed"})
    memory = int(args.gpu_memory_gib * GIB) if args.gpu_memory_gib is not None else gpu.memory_bytes_budget
    cluster = Cluster(memory, args.gpus_per_node, args.nodes, alphabeta.get_link(args.intra_link), inter, gpu)
    rows, rejected = layouts(model, cluster, args.max_model_len, args.batch, args.gpu_memory_utilization,
                             args.moe_dispatch)
    print(format_plan(model, cluster, rows, rejected, args.max_model_len, args.batch, args.top))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(json.dumps({"model": model.name, "layouts": [asdict(r) for r in rows],
                                                        "rejected": rejected}, indent=1))
    return 0 if any(r.fits for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
