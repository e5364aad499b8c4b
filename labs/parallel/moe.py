"""Mixture of experts: a top-k router, expert MLPs, expert parallelism in one process, and skewed routing.

    python -m labs.parallel.moe                          # Mixtral-8x7B and DeepSeek-V3, EP = 8
    python -m labs.parallel.moe --tokens 8192 --ep 16 --skew 0 0.8 1.2

Three things, each checked against a plain reference:

* **Routing.** Softmax top-k with the k weights renormalised (Mixtral), or
  sigmoid scores whose top-k are normalised (DeepSeek-V3, without its group
  limit and bias), per token.
* **Experts and EP.** The reference loops over tokens and their k experts.
  The grouped version sorts tokens by expert and runs one GEMM per expert, as
  a fused-MoE kernel does. The EP version splits the experts over `ep` ranks
  in contiguous blocks (vLLM's "linear" placement), gives every rank its own
  tokens (data-parallel attention), sends each token to the ranks of its
  experts, computes there and sends the weighted outputs back. All three
  agree; the EP run also counts what crossed between ranks.
* **Skew.** Router scores drawn so expert e is picked with weight
  (e + 1)^-s (a Zipf law; s = 0 is uniform). Tokens per expert and per EP rank
  show the straggler: a step waits for the most loaded rank.

The bytes per layer, EP all-to-all against TP all-reduce, come from
labs.parallel.comm for the real models; the simulation's counted dispatch
matches its formula under uniform routing.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from labs import cli, specs
from labs.parallel import alphabeta, comm


def route(logits: torch.Tensor, k: int, scoring: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert ids [T, k]) for router logits [T, E]."""
    if scoring == "softmax":
        top, ids = logits.topk(k, dim=-1)
        return torch.softmax(top.float(), dim=-1).to(logits.dtype), ids
    if scoring == "sigmoid":
        scores = torch.sigmoid(logits.float())
        top, ids = scores.topk(k, dim=-1)
        return (top / top.sum(-1, keepdim=True)).to(logits.dtype), ids
    raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")


def expert_weights(n_experts: int, hidden: int, inter: int, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {
        "router": torch.randn(n_experts, hidden, generator=g).to(dtype) / hidden ** 0.5,
        "gate": torch.randn(n_experts, inter, hidden, generator=g).to(dtype) / hidden ** 0.5,
        "up": torch.randn(n_experts, inter, hidden, generator=g).to(dtype) / hidden ** 0.5,
        "down": torch.randn(n_experts, hidden, inter, generator=g).to(dtype) / inter ** 0.5,
    }


def _expert(x: torch.Tensor, w: dict, e: int) -> torch.Tensor:
    return (F.silu(x @ w["gate"][e].T) * (x @ w["up"][e].T)) @ w["down"][e].T


def moe_reference(x, w, k: int, scoring: str = "softmax"):
    """Token by token, expert by expert: the definition."""
    weights, ids = route(x @ w["router"].T, k, scoring)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            out[t] += weights[t, j] * _expert(x[t:t + 1], w, int(ids[t, j]))[0]
    return out


def moe_grouped(x, w, k: int, scoring: str = "softmax"):
    """Sort the (token, expert) pairs by expert; one GEMM per expert over its tokens."""
    weights, ids = route(x @ w["router"].T, k, scoring)
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    token_of = order // k
    counts = torch.bincount(flat, minlength=w["router"].shape[0])
    out = torch.zeros_like(x)
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c:
            rows = token_of[start:start + c]
            y = _expert(x[rows], w, e) * weights.reshape(-1)[order[start:start + c]][:, None]
            out.index_add_(0, rows, y)
        start += c
    return out


def owner(expert: torch.Tensor, n_experts: int, ep: int) -> torch.Tensor:
    """EP rank of each expert id, contiguous blocks ('linear' placement)."""
    return expert // (n_experts // ep)


def dispatch_rows(ids: torch.Tensor, src: int, n_experts: int, ep: int, dedup: bool = False) -> torch.Tensor:
    """Hidden-state rows rank `src` sends to each rank for its tokens' expert ids [T, k] (0 to itself)."""
    dst = owner(ids, n_experts, ep)
    hit = torch.stack([(dst == r).any(-1) for r in range(ep)], dim=1)        # [T, ep]: token needs rank r
    rows = hit.sum(0) if dedup else torch.bincount(dst.reshape(-1), minlength=ep)
    rows = rows.clone()
    rows[src] = 0
    return rows


def moe_expert_parallel(xs: list[torch.Tensor], w, k: int, ep: int, scoring: str = "softmax",
                        dedup: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
    """EP over `ep` simulated ranks, each with its own tokens xs[r].

    Returns every rank's output and a [ep, ep] matrix of hidden-state rows sent
    from rank i to rank j by dispatch (combine sends the same rows back). With
    `dedup`, a token goes once to a rank that holds several of its experts.
    """
    n_experts = w["router"].shape[0]
    if n_experts % ep:
        raise ValueError(f"{n_experts} experts do not divide over EP = {ep}")
    sent = torch.zeros(ep, ep, dtype=torch.long)
    outs = [torch.zeros_like(x) for x in xs]
    for src, x in enumerate(xs):
        weights, ids = route(x @ w["router"].T, k, scoring)
        dst = owner(ids, n_experts, ep)
        sent[src] = dispatch_rows(ids, src, n_experts, ep, dedup)
        for r in range(ep):
            mask = dst == r
            # on rank r: each received token through the local experts it picked
            for t in mask.any(-1).nonzero().flatten().tolist():
                for j in mask[t].nonzero().flatten().tolist():
                    outs[src][t] += weights[t, j] * _expert(x[t:t + 1], w, int(ids[t, j]))[0]
    return outs, sent


def skewed_choices(tokens: int, n_experts: int, k: int, skew: float, seed: int = 0) -> torch.Tensor:
    """[tokens, k] expert ids, expert e drawn with weight (e+1)^-skew, k distinct per token (Gumbel top-k)."""
    g = torch.Generator().manual_seed(seed)
    logw = -skew * torch.log(torch.arange(1, n_experts + 1, dtype=torch.float64))
    u = torch.rand(tokens, n_experts, generator=g, dtype=torch.float64).clamp_min(1e-12)
    return (logw - torch.log(-torch.log(u))).topk(k, dim=-1).indices


def load_stats(ids: torch.Tensor, n_experts: int, ep: int) -> dict:
    """Expert and rank loads; ranks under contiguous ('linear') and 'round_robin' placement (vLLM's two)."""
    per_expert = torch.bincount(ids.reshape(-1), minlength=n_experts).double()
    linear = per_expert.view(ep, -1).sum(-1)          # rank r: experts r*E/ep .. (r+1)*E/ep - 1
    robin = per_expert.view(-1, ep).sum(0)            # rank r: experts r, r+ep, r+2ep, ...
    return {"max_over_mean_expert": (per_expert.max() / per_expert.mean()).item(),
            "idle_experts": int((per_expert == 0).sum()),
            "max_over_mean_rank": (linear.max() / linear.mean()).item(),
            "max_over_mean_rank_round_robin": (robin.max() / robin.mean()).item()}


def skew_table(model: specs.ModelSpec, tokens: int, ep: int, skews) -> list[dict]:
    rows = []
    for s in skews:
        ids = skewed_choices(tokens, model.moe.n_routed_experts, model.moe.experts_per_token, s)
        rows.append({"model": model.name, "skew": s, "tokens": tokens, "ep": ep,
                     **load_stats(ids, model.moe.n_routed_experts, ep)})
    return rows


def comm_table(models, tokens: int, ep: int, link: alphabeta.Link) -> list[dict]:
    rows = []
    for name in models:
        m = specs.get_model(name)
        c = comm.moe_layer_comm(m, ep, tokens)
        tp_t, ep_t = comm.moe_layer_times(c, link)
        rows.append({"model": name, "tokens": tokens, "n": ep, "k": m.moe.experts_per_token,
                     "tp_mib_per_rank": c.tp_bytes_per_rank / 2**20, "ep_mib_per_rank": c.ep_bytes_per_rank / 2**20,
                     "ep_dedup_mib_per_rank": c.ep_bytes_per_rank_dedup / 2**20, "ratio": c.ratio,
                     "tp_us": tp_t * 1e6, "ep_us": ep_t * 1e6})
    return rows


def _parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.parallel.moe", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    moe_models = [n for n, m in specs.all_models().items() if m.moe is not None]
    p.add_argument("--models", nargs="+", type=cli.choice(moe_models, "MoE model"), default=moe_models,
                   help="MoE models from labs/data/models.yaml (default: all of them)")
    p.add_argument("--tokens", type=cli.bounded_int(8, 65536, "tokens in the step, all ranks together"),
                   default=4096, help="tokens in one step across all ranks (default: %(default)s)")
    p.add_argument("--ep", type=cli.choice(("2", "4", "8", "16", "32"), "EP size"), default="8",
                   help="GPUs the experts are spread over (default: %(default)s)")
    p.add_argument("--skew", nargs="+", type=cli.finite_float(0, 3), default=[0.0, 0.5, 1.0],
                   help="Zipf exponents of the expert popularity, 0 = uniform (default: 0 0.5 1)")
    p.add_argument("--link", type=cli.choice(alphabeta.links(), "link"), default="nvlink-h200",
                   help="interconnect that prices the collectives (default: %(default)s)")
    p.add_argument("--out", type=cli.output_dir, default=None, help="folder to write moe.json to")
    p.add_argument("--record", action="store_true",
                   help="merge the skew rows into labs/results/parallel_moe_skew.json (a seeded simulation, "
                        "identical on any machine)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    ep = int(args.ep)
    link = alphabeta.get_link(args.link)
    for name in args.models:
        m = specs.get_model(name)
        if m.moe.n_routed_experts % ep:
            cli.reject(parser, "--ep", f"{name}'s {m.moe.n_routed_experts} experts do not divide over {ep} ranks")
        if args.tokens % ep:
            cli.reject(parser, "--tokens", f"must divide over --ep {ep} ranks")
    print(f"Load under skewed routing, {args.tokens} tokens, experts over EP = {ep}; max/mean tokens per expert "
          f"and per rank (derived by sampling):")
    print(f"{'model':>14} {'skew':>5} {'max/mean expert':>16} {'idle experts':>13} {'rank, linear':>13} "
          f"{'rank, round-robin':>18}")
    skew_rows = [r for name in args.models for r in skew_table(specs.get_model(name), args.tokens, ep, args.skew)]
    for r in skew_rows:
        print(f"{r['model']:>14} {r['skew']:>5.2f} {r['max_over_mean_expert']:>16.2f} {r['idle_experts']:>13} "
              f"{r['max_over_mean_rank']:>13.2f} {r['max_over_mean_rank_round_robin']:>18.2f}")
    print(f"\nOne MoE layer, {args.tokens} tokens over {ep} GPUs: TP all-reduce vs EP all-to-all "
          f"(bf16, uniform routing; alpha-beta on {link.name}, derived):")
    print(f"{'model':>14} {'k':>3} {'TP MiB/rank':>12} {'EP MiB/rank':>12} {'EP dedup':>9} {'EP/TP':>6} "
          f"{'TP us':>7} {'EP us':>7}")
    comm_rows = comm_table(args.models, args.tokens, ep, link)
    for r in comm_rows:
        print(f"{r['model']:>14} {r['k']:>3} {r['tp_mib_per_rank']:>12.2f} {r['ep_mib_per_rank']:>12.2f} "
              f"{r['ep_dedup_mib_per_rank']:>9.2f} {r['ratio']:>6.3f} {r['tp_us']:>7.1f} {r['ep_us']:>7.1f}")
    if args.out is not None:
        import json

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "moe.json").write_text(json.dumps({"skew": skew_rows, "comm": comm_rows}, indent=1))
    if args.record:
        from labs.parallel import results

        print(results.record("moe", results.CPU, [{**r, "ok": True} for r in skew_rows],
                             {"torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
