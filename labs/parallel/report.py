"""The parallel lab as Markdown for the site: collective costs, TP and EP traffic, plans, recorded runs.

Pages must not compute: every figure about communication comes from
labs.parallel.alphabeta and labs.parallel.comm, every compute floor from
labs.roofline, every measurement from labs/results/parallel_*.json. Until the
multi-GPU run lands, tables say "derived" and name the constants' sources.
No torch: the site build imports this module. Names carry a `parallel_`
prefix to stay unique across the site's macros.
"""

from __future__ import annotations

import contextlib
import io
import shlex

from labs import recorded, specs
from labs.parallel import alphabeta, comm, results

GEMM_COMMAND = "python -m labs.parallel.gemm_shards --out out/parallel --record"
COLLECTIVES_COMMAND = "python -m labs.parallel.collectives --world-size 2 --out out/parallel --record"
KIB, MIB, GIB = 1024, 1024**2, 1024**3


class ReportError(ValueError):
    """A macro called with something the lab cannot price; the build fails with this message."""


def _size(n: int) -> str:
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n:,} B"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


def _link(name: str) -> alphabeta.Link:
    try:
        return alphabeta.get_link(name)
    except alphabeta.ModelError as err:
        raise ReportError(str(err)) from None


def _model(name: str) -> specs.ModelSpec:
    try:
        return specs.get_model(name)
    except specs.SpecError as err:
        raise ReportError(str(err)) from None


# ---------------------------------------------------------------------------
# Inline numbers
# ---------------------------------------------------------------------------


def parallel_bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus factor: 2(n-1)/n for all-reduce, (n-1)/n for the others."""
    return alphabeta.bus_factor(op, n)


def parallel_link(name: str) -> alphabeta.Link:
    """An interconnect's constants (labs/data/interconnects.yaml), for `.bus_bandwidth_gbps` and friends."""
    return _link(name)


def parallel_anchor(key: str):
    """A measured 2 x H200 anchor from interconnects.yaml."""
    found = alphabeta.anchors()
    if key not in found:
        raise ReportError(f"parallel_anchor({key!r}): known anchors are {', '.join(found)}")
    return found[key]


def parallel_collective_us(op: str, size: int, n: int, link: str = "nvlink-h200", graph: bool = True) -> str:
    """One collective's alpha-beta time, formatted."""
    return _us(alphabeta.collective_time(op, size, n, _link(link), graph))


def parallel_tp_bytes_per_token(model: str, tp: int) -> float:
    """Bytes one TP rank sends per token through the whole model (two ring all-reduces per layer)."""
    return comm.tp_bytes_per_token_per_rank(_model(model), tp)


def parallel_pp_bytes_per_token(model: str) -> int:
    return comm.pp_bytes_per_token(_model(model))


def parallel_moe(model: str, n: int, tokens: int) -> comm.MoELayerComm:
    """One MoE layer's TP-vs-EP traffic (comm.moe_layer_comm), for `.ratio`, `.ep_ranks_per_token`, ..."""
    try:
        return comm.moe_layer_comm(_model(model), n, tokens)
    except alphabeta.ModelError as err:
        raise ReportError(str(err)) from None


def parallel_tp_step(model: str, gpu: str, tp: int, tokens: int, kind: str = "decode", graph: bool = True,
                     link: str = "nvlink-h200") -> comm.TPStep:
    """The derived TP step (cost-model floor + alpha-beta all-reduces), for `.speedup`, `.comm_share`."""
    return comm.derived_tp_step(model, gpu, tp, tokens, kind, link=link, graph=graph)


def parallel_params_b(model: str, which: str = "total") -> str:
    """A parameter count from the cost model's split, in billions: 'total', 'active' or 'routed'."""
    from labs import roofline

    split = roofline.deployment(model, "h200").params
    value = {"total": split.total, "active": split.active, "routed": split.routed_experts}.get(which)
    if value is None:
        raise ReportError(f"parallel_params_b({model!r}, {which!r}): which is total, active or routed")
    return f"{value / 1e9:,.1f}B"


def parallel_allreduces_per_step(model: str) -> int:
    """TP all-reduces in one forward pass: one per attention block and one per MLP/MoE block."""
    return comm.ALL_REDUCES_PER_LAYER * _model(model).n_layers


def parallel_tp_message(model: str, tokens: int) -> int:
    """Bytes one TP all-reduce reduces for `tokens` tokens (hidden x bf16 each)."""
    return comm.tp_message_bytes(_model(model), tokens)


def parallel_expert_slice(model: str, tp: int) -> int:
    """Columns of each expert's intermediate size that one rank holds when experts are TP-sliced."""
    m = _model(model)
    if m.moe is None or m.moe.moe_intermediate_size % tp:
        raise ReportError(f"parallel_expert_slice({model!r}, {tp}): not an MoE model or TP does not divide it")
    return m.moe.moe_intermediate_size // tp


def parallel_tokens_per_expert(model: str, tokens: int) -> float:
    """Average tokens each routed expert sees in a step of `tokens` tokens: tokens x k / E."""
    m = _model(model)
    return tokens * m.moe.experts_per_token / m.moe.n_routed_experts


def parallel_experts_per_rank(model: str, ep: int) -> int:
    m = _model(model)
    return m.moe.n_routed_experts // ep


def parallel_pp_bubble(stages: int, batches: int) -> float:
    """Idle share of a pipeline that drains after `batches` equal batches: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (batches + stages - 1)


def parallel_layout(model: str, gpu: str = "h200", tp: int = 1, pp: int = 1, dp: int = 1, ep: bool = False,
                    gpus_per_node: int = 8, max_model_len: int = 8192, batch: int = 64, backend: str = "allgather"):
    """One planner layout (labs.parallel.plan), for `.weights_gib`, `.requests`, `.comm_us_per_step`."""
    from labs import vllm_facts
    from labs.parallel import plan

    g = specs.get_gpu(gpu)
    nodes = max(1, (tp * pp * dp) // gpus_per_node)
    cluster = plan.Cluster(g.memory_bytes_budget, min(gpus_per_node, tp * pp * dp), nodes,
                           _link("nvlink-h200"), _link("ib-ndr400"), g)
    rows, _ = plan.layouts(_model(model), cluster, max_model_len, batch,
                           vllm_facts.resolved_default("gpu_memory_utilization"), backend)
    for r in rows:
        if (r.tp, r.pp, r.dp, r.ep) == (tp, pp, dp, ep):
            return r
    raise ReportError(f"parallel_layout: TP={tp} PP={pp} DP={dp} EP={ep} is not a layout of {model}")


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------


def parallel_bus_factor_table(ns=(2, 4, 8, 16)) -> str:
    """What each collective moves per rank, as a multiple of the message S."""
    what = {"all_reduce": "sum of every rank's S, result on every rank",
            "all_gather": "every rank's S/n, concatenated on every rank (S = the output)",
            "reduce_scatter": "sum of every rank's S, rank r keeps slice r (S = the input)",
            "all_to_all": "rank r sends slice j of its S to rank j"}
    head = "| Collective | What it computes | " + " | ".join(f"n = {n}" for n in ns) + " |"
    lines = [head, "|---|---|" + "---:|" * len(ns)]
    for op in alphabeta.COLLECTIVES:
        lines.append(f"| {op.replace('_', '-')} | {what[op]} | "
                     + " | ".join(f"{alphabeta.bus_factor(op, n):.3g} S" for n in ns) + " |")
    return "\n".join(lines)


def parallel_links_table() -> str:
    lines = ["| Link | Peak per direction | Bus bandwidth β | Latency α | Eager launch | Sources |",
             "|---|---:|---:|---:|---:|---|"]
    for name, l in alphabeta.links().items():
        p = l.provenance
        lines.append(f"| {l.display_name} | {l.peak_gbps_per_direction:g} GB/s ({p.get('peak_gbps_per_direction')}) "
                     f"| {l.bus_bandwidth_gbps:g} GB/s ({p['bus_bandwidth_gbps']}) | {l.alpha_us:g} µs ({p['alpha_us']}) "
                     f"| {l.eager_launch_us:g} µs ({p.get('eager_launch_us')}) | [{l.kind} source]({l.source}) |")
    return "\n".join(lines)


def parallel_collective_table(ns=(2, 8), sizes=(8 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 256 * MIB, 1 * GIB),
                              link: str = "nvlink-h200") -> str:
    """All-reduce time and bus bandwidth by size, derived from the alpha-beta model."""
    lk = _link(link)
    head = "| Message | " + " | ".join(f"n = {n}, graph | n = {n}, eager | busbw n = {n}" for n in ns) + " |"
    lines = [head, "|---:|" + "---:|---:|---:|" * len(ns)]
    for s in sizes:
        cells = []
        for n in ns:
            tg = alphabeta.collective_time("all_reduce", s, n, lk, True)
            te = alphabeta.collective_time("all_reduce", s, n, lk, False)
            cells += [_us(tg), _us(te), f"{alphabeta.bus_bandwidth('all_reduce', n, s, tg) / 1e9:,.0f} GB/s"]
        lines.append(f"| {_size(s)} | " + " | ".join(cells) + " |")
    lines += ["", f"Derived: t = α + 2(n−1)/n · S / β on {lk.display_name}, α = {lk.alpha_us:g} µs "
                  f"({lk.provenance['alpha_us']}), β = {lk.bus_bandwidth_gbps:g} GB/s ({lk.provenance['bus_bandwidth_gbps']}), "
                  f"eager adds {lk.eager_launch_us:g} µs; bus bandwidth as nccl-tests computes it from t."]
    return "\n".join(lines)


def parallel_tp_speedup_table(model: str = "llama-3.1-8b", gpu: str = "h200", tps=(2, 4, 8),
                              cases=((1, "decode"), (64, "decode"), (4096, "prefill")), link: str = "nvlink-h200") -> str:
    """Derived TP speedup per step: cost-model floor per rank plus two all-reduces per layer."""
    m = _model(model)
    lines = ["| Step | TP | Floor per rank | All-reduces (graph) | Speedup, graph | Speedup, eager | Comm share |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for tokens, kind in cases:
        label = f"decode, {tokens} seq" if kind == "decode" else f"prefill, {tokens:,} tokens"
        for tp in tps:
            g = comm.derived_tp_step(model, gpu, tp, tokens, kind, link=link)
            e = comm.derived_tp_step(model, gpu, tp, tokens, kind, link=link, graph=False)
            lines.append(f"| {label} | {tp} | {_us(g.floor_s)} | {_us(g.comm_s)} | {g.speedup:.2f}× | "
                         f"{e.speedup:.2f}× | {g.comm_share * 100:.0f}% |")
    lines += ["", f"Derived for {m.display_name} on {specs.get_gpu(gpu).display_name}: floors from the cost model "
                  f"(labs/roofline.py, datasheet bandwidth, decode at 1,024 tokens of context), "
                  f"{comm.ALL_REDUCES_PER_LAYER * m.n_layers} all-reduces per step from the α–β model on {link}, "
                  "added, not overlapped."]
    return "\n".join(lines)


def parallel_moe_table(models=("mixtral-8x7b", "deepseek-v3"), n: int = 8, tokens: int = 4096,
                       link: str = "nvlink-h200") -> str:
    """One MoE layer: TP all-reduce vs EP all-to-all, bytes per rank and alpha-beta time."""
    lk = _link(link)
    lines = ["| Model | k of E | TP all-reduce, per rank | EP all-to-all, per rank | EP, deduplicated | EP / TP bytes "
             "| TP time | EP time |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name in models:
        m = _model(name)
        c = parallel_moe(name, n, tokens)
        tp_t, ep_t = comm.moe_layer_times(c, lk)
        lines.append(f"| {m.display_name} | {m.moe.experts_per_token} of {m.moe.n_routed_experts} "
                     f"| {c.tp_bytes_per_rank / MIB:,.1f} MiB | {c.ep_bytes_per_rank / MIB:,.1f} MiB "
                     f"| {c.ep_bytes_per_rank_dedup / MIB:,.1f} MiB ({c.ep_ranks_per_token:.2f} ranks per token) "
                     f"| {c.ratio:.3g} | {_us(tp_t)} | {_us(ep_t)} |")
    lines += ["", f"Derived: {tokens:,} tokens over {n} GPUs, bf16 activations, uniform routing. TP: every GPU holds "
                  "all tokens and all-reduces the MoE output once. EP: data-parallel attention, each GPU owns "
                  f"{tokens // n:,} tokens and sends each to its k experts' GPUs and back (dispatch + combine); "
                  f"deduplicated sends a token once per GPU. Times: α–β on {lk.display_name}."]
    return "\n".join(lines)


def parallel_plan_cli(args: str) -> str:
    """The planner run in-process: the command, then what it prints (derived)."""
    from labs.parallel.plan import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(shlex.split(args))
        except SystemExit as exc:
            code = exc.code
    if code not in (0, 1):
        raise ReportError(f"python -m labs.parallel.plan {args} exited {code}: {err.getvalue().strip()}")
    return (f"```bash\npython -m labs.parallel.plan {args}\n```\n\n```text\n{out.getvalue().rstrip()}\n```")


# ---------------------------------------------------------------------------
# Recorded runs
# ---------------------------------------------------------------------------


def _machine_line(m) -> str:
    v = m.runs[-1] if m.runs else {}
    return (f"Measured on {m.label} on {m.dates}; torch {v.get('torch', '?')}, CUDA {v.get('cuda', '?')}"
            + (f", NCCL {v['nccl']}" if v.get("nccl") else "") + ".")


def parallel_gemm_table(gpu: str = "H200", models=("llama-3.1-8b", "llama-3.1-70b"), tokens=(1, 4096)) -> str:
    """Measured per-rank GEMM time per layer at TP-shard shapes, and the speedup it predicts with α–β."""
    entry = results.load("gemm", gpu, 1)
    if entry is None:
        return recorded.missing(results.path("gemm"), GEMM_COMMAND)
    lines = ["| Model | Tokens | TP | GEMMs per layer, measured | + 2 all-reduces (α–β) | GEMM scaling "
             "| Predicted layer speedup | Predicted MLP speedup |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(entry.rows, key=lambda r: (r["model"], r["tokens"], r["tp"])):
        if r["model"] in models and r["tokens"] in tokens:
            lines.append(f"| {_model(r['model']).display_name} | {r['tokens']:,} | {r['tp']} | {r['gemm_us']:,.1f} µs "
                         f"| {2 * r['allreduce_us']:,.1f} µs | {r['gemm_scaling']:.2f}× | {r['speedup_layer']:.2f}× "
                         f"| {r['speedup_mlp']:.2f}× |")
    return "\n".join(lines + ["", _machine_line(entry) + " All-reduce times are the α–β model's (derived)."])


def parallel_collectives_measured(gpu: str = "H200", gpu_count: int = 2) -> str:
    """The recorded collectives run, or what command records it."""
    entry = results.load("collectives", gpu, gpu_count)
    if entry is None:
        return recorded.missing(results.path("collectives"), COLLECTIVES_COMMAND)
    lines = ["| Collective | Message | Mode | Time | busbw |", "|---|---:|---|---:|---:|"]
    for r in entry.rows:
        if r["size"] in (8 * KIB, 1 * MIB, 1 * GIB):
            lines.append(f"| {r['op']} | {_size(r['size'])} | {r['mode']} | {r['seconds'] * 1e6:,.1f} µs "
                         f"| {r['busbw_gbps']:,.1f} GB/s |")
    fits = entry.derived.get("fits", [])
    if fits:
        lines += ["", "| Collective | α fitted | β fitted | worst error |", "|---|---:|---:|---:|"]
        lines += [f"| {f['op']} | {f['alpha_us']:.1f} µs | {f['beta_gbps']:.0f} GB/s | {f['max_rel_error'] * 100:.0f}% |"
                  for f in fits if "error" not in f]
    return "\n".join(lines + ["", _machine_line(entry)])


def parallel_tp_check_table(backend: str = "gloo", gpu: str = "H200", gpu_count: int = 2) -> str:
    """The recorded TP check: split layer vs whole layer per case and block, with its bound."""
    entry = results.load("tp", "CPU", 1) if backend == "gloo" else results.load("tp", gpu, gpu_count)
    if entry is None:
        return recorded.missing(results.path("tp"), f"python -m labs.parallel.tp --world-size 2 --backend {backend} --record")
    lines = ["| Ranks | Layer (hidden, intermediate, H_q / H_kv) | Tokens | Block | max abs difference | Bound "
             "| All-reduces |", "|---:|---|---:|---|---:|---:|---:|"]
    for r in sorted(entry.rows, key=lambda r: (r["world_size"], r["case"])):
        if r["backend"] != backend:
            continue
        sh = r["shape"]
        for b in ("attention", "mlp", "layer"):
            c = r[b]
            lines.append(f"| {r['world_size']} | {sh['hidden']}, {sh['intermediate']}, {sh['n_heads']} / "
                         f"{sh['n_kv_heads']} | {r['tokens']} | {b} | {c['max_abs_diff']:.1e} | {c['bound']:.1e} "
                         f"| {c['all_reduces']} |")
    v = entry.runs[-1] if entry.runs else {}
    where = "CPU processes over gloo, float32" if backend == "gloo" else entry.label
    return "\n".join(lines + ["", f"Recorded by `python -m labs.parallel.tp --record` ({where}; torch "
                                   f"{v.get('torch', '?')}, {entry.dates})."])


def parallel_moe_skew_table(ep: int = 8, tokens: int = 4096) -> str:
    """The recorded skew simulation: how uneven expert and rank loads get as routing concentrates."""
    entry = results.load("moe", "CPU", 1)
    if entry is None:
        return recorded.missing(results.path("moe"), "python -m labs.parallel.moe --record")
    lines = ["| Model | Zipf skew s | busiest expert / mean | busiest GPU / mean, contiguous placement "
             "| busiest GPU / mean, round-robin |", "|---|---:|---:|---:|---:|"]
    for r in entry.rows:
        if r["ep"] == ep and r["tokens"] == tokens:
            lines.append(f"| {_model(r['model']).display_name} | {r['skew']:g} | {r['max_over_mean_expert']:.2f} "
                         f"| {r['max_over_mean_rank']:.2f} | {r['max_over_mean_rank_round_robin']:.2f} |")
    return "\n".join(lines + ["", f"Derived by seeded sampling (`python -m labs.parallel.moe --record`, {entry.dates}): "
                                   f"{tokens:,} tokens, EP = {ep}, expert e picked with weight (e + 1)^−s."])


MACROS = [parallel_params_b, parallel_allreduces_per_step, parallel_tp_message, parallel_expert_slice, parallel_tokens_per_expert,
          parallel_experts_per_rank, parallel_pp_bubble, parallel_layout, parallel_tp_check_table,
          parallel_moe_skew_table, parallel_bus_factor, parallel_link, parallel_anchor, parallel_collective_us, parallel_tp_bytes_per_token,
          parallel_pp_bytes_per_token, parallel_moe, parallel_tp_step, parallel_bus_factor_table, parallel_links_table,
          parallel_collective_table, parallel_tp_speedup_table, parallel_moe_table, parallel_plan_cli,
          parallel_gemm_table, parallel_collectives_measured]
