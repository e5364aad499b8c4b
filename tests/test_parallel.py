"""The parallel lab: TP split against the whole layer, the alpha-beta model, MoE routing and EP, the planner.

CPU tests run in CI: the split layer in one process over many shapes and TP
degrees, then for real across 2 and 4 gloo processes. `gpu` tests time the
per-rank GEMMs on one GPU; `multigpu` tests (never also `gpu`) run TP and the
collectives over NCCL and skip with the GPU count on smaller machines.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

torch = pytest.importorskip("torch")

from labs import specs  # noqa: E402
from labs.parallel import alphabeta, comm, gemm_shards, launch, moe, plan, results, tp, tp_layers  # noqa: E402
from labs.parallel.tp_layers import LayerShape  # noqa: E402


def _run(main, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------
# Tensor parallelism
# ---------------------------------------------------------------------------

SHAPES = [
    LayerShape(64, 128, 4, 4, 16),       # MHA
    LayerShape(128, 256, 8, 2, 16),      # GQA, TP > H_kv at 4 and 8: replicated KV heads
    LayerShape(128, 384, 8, 8, 16),
    LayerShape(256, 512, 16, 4, 16),
    LayerShape(96, 192, 8, 1, 12),       # MQA
]


def _simulated(x, w, shape, pos, world, block):
    """Every rank's partial output, summed in one process: what the all-reduce computes."""
    total, calls = None, 0
    for rank in range(world):
        ws = tp_layers.shard(w, shape, world, rank)
        count = {"n": 0}

        def ar(t, count=count):
            count["n"] += 1

        if block == "attention":
            part = tp_layers.tp_attention_block(x, ws, shape, pos, ar)
        else:
            part = tp_layers.tp_mlp_block(x, ws, shape, ar)
        calls = count["n"]
        total = part if total is None else total + part
    return total, calls


SPLITS = [pytest.param(s, world, id=f"h{s.hidden}-q{s.n_heads}-kv{s.n_kv_heads}-tp{world}")
          for s in SHAPES for world in (1, 2, 4, 8)
          if not (s.n_heads % world or (s.n_kv_heads % world and world % s.n_kv_heads))]


@pytest.mark.parametrize("shape, world", SPLITS)
@pytest.mark.parametrize("tokens", [1, 5, 17])
def test_split_blocks_sum_to_the_whole_layer(shape, world, tokens):
    w = tp_layers.random_weights(shape, seed=world + tokens)
    x = torch.randn(tokens, shape.hidden, generator=torch.Generator().manual_seed(tokens))
    pos = torch.arange(tokens)
    for block, ref in (("attention", tp_layers.attention_block(x, w, shape, pos)),
                       ("mlp", tp_layers.mlp_block(x, w, shape))):
        got, calls = _simulated(x, w, shape, pos, world, block)
        assert calls == 1, f"{block}: one all-reduce per block"
        torch.testing.assert_close(got, ref, rtol=0, atol=tp.FP32_RTOL * max(1.0, ref.abs().max().item()))


def test_replicated_kv_heads_follow_vllm():
    shape = LayerShape(128, 256, 8, 2, 16)
    assert [list(tp_layers.kv_heads_of_rank(shape, 8, r)) for r in range(8)] == [[0]] * 4 + [[1]] * 4
    assert [list(tp_layers.kv_heads_of_rank(shape, 2, r)) for r in range(2)] == [[0], [1]]


def test_a_missing_all_reduce_is_caught():
    shape = SHAPES[1]
    w = tp_layers.random_weights(shape)
    x = torch.randn(3, shape.hidden)
    part = tp_layers.tp_mlp_block(x, tp_layers.shard(w, shape, 2, 0), shape, lambda t: None)
    assert not torch.allclose(part, tp_layers.mlp_block(x, w, shape), atol=1e-3)


@pytest.mark.parametrize("tp_degree, why", [(3, "query heads"), (16, "query heads")])
def test_shard_refuses_degrees_vllm_refuses(tp_degree, why):
    with pytest.raises(tp_layers.ShardError, match=why):
        tp_layers.shard(tp_layers.random_weights(SHAPES[1]), SHAPES[1], tp_degree, 0)
    with pytest.raises(tp_layers.ShardError, match="KV heads"):
        LayerShape(96, 192, 24, 6, 4).check_tp(4)


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_match_the_whole_layer(world):
    rows = tp.check(world, "gloo", timeout_s=180)
    assert len(rows) == len(tp.CPU_CASES)
    assert tp.all_ok(rows), tp.format_rows(rows, world, "gloo")
    assert all(r["layer"]["all_reduces"] == 2 for r in rows)


def _hang(rank, world, backend, init_method, args):
    dist = launch.init_group(backend, init_method, rank, world, 30)
    if rank == 0:
        dist.all_reduce(torch.ones(4))   # rank 1 never joins this collective
    return {}


def _stall(rank, world, backend, init_method, args):
    import time

    dist = launch.init_group(backend, init_method, rank, world, 30)
    if rank == 1:
        time.sleep(60)                   # a rank stuck before its collective: the others wait on it
    dist.all_reduce(torch.ones(4))
    return {}


def test_a_rank_that_leaves_a_collective_fails_the_run():
    with pytest.raises(launch.LaunchError, match="rank"):
        launch.run(_hang, 2, "gloo", None, timeout_s=10)


def test_a_stalled_rank_is_killed_at_the_timeout():
    import time

    t0 = time.monotonic()
    with pytest.raises(launch.LaunchError, match=r"ranks \[0, 1\] of 2 did not finish within 3 s"):
        launch.run(_stall, 2, "gloo", None, timeout_s=3)
    assert time.monotonic() - t0 < 15


# ---------------------------------------------------------------------------
# The alpha-beta model
# ---------------------------------------------------------------------------


def test_bus_factors_are_nccl_tests():
    assert alphabeta.bus_factor("all_reduce", 2) == 1.0
    assert alphabeta.bus_factor("all_reduce", 8) == 1.75
    assert alphabeta.bus_factor("all_gather", 8) == 0.875
    assert alphabeta.bus_factor("all_to_all", 4) == 0.75
    with pytest.raises(alphabeta.ModelError):
        alphabeta.bus_factor("broadcast", 2)


def test_fit_recovers_alpha_and_beta():
    sizes = [2**k for k in range(13, 31)]
    link = alphabeta.get_link("nvlink-h200")
    times = [alphabeta.collective_time("all_reduce", s, 8, link) for s in sizes]
    f = alphabeta.fit("all_reduce", 8, sizes, times)
    assert math.isclose(f.alpha, link.alpha, rel_tol=1e-6)
    assert math.isclose(f.beta, link.beta, rel_tol=1e-6)
    assert f.max_rel_error < 1e-9
    with pytest.raises(alphabeta.ModelError):
        alphabeta.fit("all_reduce", 2, [1, 2], [1.0, 0.5])


def test_the_model_reproduces_its_anchors():
    link, a = alphabeta.get_link("nvlink-h200"), alphabeta.anchors()
    one_gib = alphabeta.collective_time("all_reduce", 2**30, 2, link)
    assert alphabeta.bus_bandwidth("all_reduce", 2, 2**30, one_gib) / 1e9 == pytest.approx(
        a["allreduce_busbw_1gib_gbps"], rel=0.01)
    assert alphabeta.collective_time("all_reduce", 8192, 2, link) * 1e6 == pytest.approx(
        a["allreduce_8kib_graph_us"], rel=0.01)
    assert alphabeta.collective_time("all_reduce", 8192, 2, link, graph=False) * 1e6 == pytest.approx(
        a["allreduce_8kib_eager_us"], rel=0.01)
    assert alphabeta.collective_time("all_reduce", 8192, 1, link) == 0


def test_links_validate(tmp_path):
    bad = tmp_path / "links.yaml"
    entry = {k: v for k, v in vars(alphabeta.get_link("nvlink-h200")).items() if k != "name"}
    entry["bus_bandwidth_gbps"] = 900.0
    import yaml

    bad.write_text(yaml.safe_dump({"links": {"x": entry}}))
    with pytest.raises(alphabeta.ModelError, match="exceeds"):
        alphabeta.links(str(bad))
    entry["typo"] = 1
    bad.write_text(yaml.safe_dump({"links": {"x": entry}}))
    with pytest.raises(alphabeta.ModelError, match="unknown fields"):
        alphabeta.links(str(bad))


# ---------------------------------------------------------------------------
# Bytes per token
# ---------------------------------------------------------------------------


def test_tp_bytes_follow_two_ring_all_reduces_per_layer():
    m = specs.get_model("llama-3.1-8b")
    # 2 all-reduces x 32 layers x 2(n-1)/n x 4096 x 2 bytes
    assert comm.tp_bytes_per_token_per_rank(m, 2) == 2 * 32 * 1.0 * 4096 * 2
    assert comm.tp_bytes_per_token_per_rank(m, 8) == 2 * 32 * 1.75 * 4096 * 2
    assert comm.pp_bytes_per_token(m) == 2 * 4096 * 2


@pytest.mark.parametrize("model, n, ratio", [("mixtral-8x7b", 8, 2 / 8), ("deepseek-v3", 8, 1.0),
                                             ("deepseek-v3", 32, 8 / 32)])
def test_ep_over_tp_bytes_is_k_over_n(model, n, ratio):
    c = comm.moe_layer_comm(specs.get_model(model), n, 4096)
    assert c.ratio == pytest.approx(ratio)
    assert c.ep_bytes_per_rank_dedup <= c.ep_bytes_per_rank


@pytest.mark.parametrize("model, ep", [("deepseek-v3", 8), ("deepseek-v3", 64), ("mixtral-8x7b", 4)])
def test_counted_dispatch_matches_the_formula(model, ep):
    m = specs.get_model(model)
    e, k, t = m.moe.n_routed_experts, m.moe.experts_per_token, 8000
    ids = moe.skewed_choices(t, e, k, 0.0, seed=1)
    every = moe.dispatch_rows(ids, 0, e, ep).sum().item()
    dedup = moe.dispatch_rows(ids, 0, e, ep, dedup=True).sum().item()
    assert every / t == pytest.approx(k * (ep - 1) / ep, rel=0.02)
    assert dedup / t == pytest.approx(comm.expected_ranks_hit(m, ep) * (ep - 1) / ep, rel=0.02)


# ---------------------------------------------------------------------------
# MoE layer
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("experts, k, ep", [(8, 2, 2), (8, 2, 4), (16, 4, 8)])
def test_grouped_and_expert_parallel_equal_the_reference(scoring, experts, k, ep):
    w = moe.expert_weights(experts, 32, 48, seed=experts + k)
    xs = [torch.randn(4, 32, generator=torch.Generator().manual_seed(r)) for r in range(ep)]
    ref = [moe.moe_reference(x, w, k, scoring) for x in xs]
    for x, r in zip(xs, ref):
        torch.testing.assert_close(moe.moe_grouped(x, w, k, scoring), r, rtol=1e-5, atol=1e-5)
    for dedup in (False, True):
        outs, sent = moe.moe_expert_parallel(xs, w, k, ep, scoring, dedup)
        for o, r in zip(outs, ref):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        assert sent.diagonal().sum() == 0
        assert sent.sum() <= sum(x.shape[0] for x in xs) * (1 if dedup else k) * (ep - 1)


def test_router_weights_are_normalised():
    w, ids = moe.route(torch.randn(10, 8), 2)
    torch.testing.assert_close(w.sum(-1), torch.ones(10))
    assert (ids[:, 0] != ids[:, 1]).all()


def test_skew_concentrates_load():
    m = specs.get_model("deepseek-v3")
    rows = moe.skew_table(m, 8192, 8, [0.0, 0.5, 1.0])
    assert rows[0]["max_over_mean_rank"] < 1.1
    assert rows[0]["max_over_mean_expert"] < rows[1]["max_over_mean_expert"] < rows[2]["max_over_mean_expert"]
    assert rows[2]["max_over_mean_rank_round_robin"] < rows[2]["max_over_mean_rank"]


# ---------------------------------------------------------------------------
# Planner and GEMM prediction
# ---------------------------------------------------------------------------


def _cluster(**kw):
    g = specs.get_gpu(kw.pop("gpu", "h200"))
    return plan.Cluster(g.memory_bytes_budget, kw.pop("gpus_per_node", 8), kw.pop("nodes", 1),
                        alphabeta.get_link("nvlink-h200"), alphabeta.get_link("ib-ndr400"), g)


def test_planner_places_llama_70b_on_one_node():
    rows, rejected = plan.layouts(specs.get_model("llama-3.1-70b"), _cluster(), 8192, 64, 0.92)
    by = {r.name: r for r in rows}
    assert not by["TP=1 PP=1 DP=8"].fits            # 141 GB of bf16 weights on one GPU
    assert by["TP=8 PP=1 DP=1"].fits and by["TP=2 PP=1 DP=4"].fits
    assert by["TP=8 PP=1 DP=1"].comm_us_per_step > by["TP=2 PP=1 DP=4"].comm_us_per_step
    assert all(r.tp in (1, 2, 4, 8) for r in rows) and not rejected


def test_planner_refuses_tp_that_does_not_divide_heads():
    rows, rejected = plan.layouts(specs.get_model("qwen2.5-7b"), _cluster(), 8192, 64, 0.92)
    assert any("28 query heads" in why for why in rejected)
    assert all(r.tp != 8 for r in rows)


def test_planner_tp_across_nodes_uses_the_slow_link():
    rows, _ = plan.layouts(specs.get_model("llama-3.1-70b"), _cluster(nodes=2), 8192, 64, 0.92)
    by = {r.name: r for r in rows}
    assert by["TP=16 PP=1 DP=1"].tp_link == "ib-ndr400" and "TP" in by["TP=16 PP=1 DP=1"].crosses_nodes
    assert by["TP=8 PP=2 DP=1"].tp_link == "nvlink-h200" and by["TP=8 PP=2 DP=1"].crosses_nodes == "PP"


def test_planner_all_to_all_backend_halves_deepseek_traffic_at_16_gpus():
    m, c = specs.get_model("deepseek-v3"), _cluster(nodes=2)
    agrs = {r.name: r for r in plan.layouts(m, c, 8192, 64, 0.92, "allgather")[0]}
    a2a = {r.name: r for r in plan.layouts(m, c, 8192, 64, 0.92, "all-to-all")[0]}
    name = "TP=1 PP=1 DP=16 EP"
    assert a2a[name].comm_bytes_per_token < 0.6 * agrs[name].comm_bytes_per_token


def test_gemm_shapes_and_prediction():
    m = specs.get_model("llama-3.1-8b")
    g1 = {g.name: (g.k, g.n) for g in gemm_shards.shard_gemms(m, 1)}
    g2 = {g.name: (g.k, g.n) for g in gemm_shards.shard_gemms(m, 2)}
    assert g1 == {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
    assert g2 == {"qkv": (4096, 3072), "o": (2048, 4096), "gate_up": (4096, 14336), "down": (7168, 4096)}
    assert {g.name: g.n for g in gemm_shards.shard_gemms(m, 16 // 2)}["qkv"] == 4 * 128 + 2 * 128
    free = alphabeta.get_link("nvlink-h200").with_(alpha_us=0, bus_bandwidth_gbps=450)
    times = {1: dict.fromkeys(("qkv", "o", "gate_up", "down"), 2e-3), 2: dict.fromkeys(("qkv", "o", "gate_up", "down"), 1e-3)}
    rows = gemm_shards.predict(m, 1, times, free)
    assert rows[1]["gemm_scaling"] == 2 and rows[1]["speedup_layer"] == pytest.approx(2, rel=1e-3)


def test_derived_tp_speedup_is_below_ideal_and_eager_is_worse():
    s = comm.derived_tp_step("llama-3.1-8b", "h200", 2, 1)
    e = comm.derived_tp_step("llama-3.1-8b", "h200", 2, 1, graph=False)
    assert 1 < s.speedup < 2 and e.speedup < s.speedup


# ---------------------------------------------------------------------------
# Records and command lines
# ---------------------------------------------------------------------------


def test_records_go_through_the_shared_writer_and_render(tmp_path, monkeypatch):
    from labs import recorded
    from labs.parallel import report

    monkeypatch.setattr(recorded, "RESULTS_DIR", tmp_path)
    h200 = recorded.Machine("NVIDIA H200")
    m = specs.get_model("llama-3.1-8b")
    times = {tp: dict.fromkeys(("qkv", "o", "gate_up", "down"), 1e-4 / tp) for tp in (1, 2)}
    rows = [{"model": m.name, "tokens": 1, **p, "ok": True}
            for p in gemm_shards.predict(m, 1, times, alphabeta.get_link("nvlink-h200"))]
    msg = results.record("gemm", h200, rows, {"torch": "x", "cuda": "y"})
    assert "added: llama-3.1-8b/1/1, llama-3.1-8b/2/1" in msg
    table = report.parallel_gemm_table("H200", tokens=(1,))
    assert "Measured on NVIDIA H200" in table and "| 2 |" in table
    failing = [{**rows[1], "ok": False, "gemm_us": 1.0}]
    assert "kept the passing row" in results.record("gemm", h200, failing)
    assert results.load("gemm", "H200").row(model=m.name, tp=2, tokens=1)["gemm_us"] == rows[1]["gemm_us"]
    assert results.load("gemm", "H100") is None
    two = recorded.Machine("NVIDIA H200", 2, "NVLink")
    coll = [{"op": "all_reduce", "size": s, "mode": "eager", "seconds": 1e-5 + s / 3e11, "busbw_gbps": 1.0,
             "ok": True} for s in (8192, 2**20, 2**30)]
    from labs.parallel import collectives

    results.record("collectives", two, coll, derive=lambda all_rows: {"fits": collectives.summarise(all_rows, 2)[1]})
    shown = report.parallel_collectives_measured("H200", 2)
    assert "2x NVIDIA H200 (NVLink)" in shown and "α fitted" in shown


@pytest.mark.parametrize("module", [plan, moe, tp, gemm_shards, __import__("labs.parallel.collectives").parallel.collectives])
def test_every_cli_has_help(module):
    code, out, _ = _run(module.main, ["--help"])
    assert code == 0 and "usage" in out


@pytest.mark.parametrize("argv, option", [
    (["--gpus-per-node", "0"], "--gpus-per-node"), (["--inter-node-gbps", "nan"], "--inter-node-gbps"),
    (["--batch", "-3"], "--batch"), (["--max-model-len", "1000000"], "--max-model-len"),
    (["--gpu-memory-gib", "inf"], "--gpu-memory-gib"), (["--out", "/proc/x"], "--out"), (["--model", "gpt-9"], "--model"),
])
def test_planner_bad_arguments_exit_2_with_one_line(argv, option):
    code, _, err = _run(plan.main, argv)
    assert code == 2 and option in err and len(err.strip().splitlines()) == 1


def test_planner_prints_layouts():
    code, out, _ = _run(plan.main, ["--model", "mixtral-8x7b", "--gpus-per-node", "4"])
    assert code == 0 and "TP=1 PP=1 DP=4 EP" in out and "(derived)" in out


@pytest.mark.parametrize("argv", [["--ep", "3"], ["--tokens", "0"], ["--skew", "nan"], ["--tokens", "4097"]])
def test_moe_bad_arguments(argv):
    code, _, err = _run(moe.main, argv)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_collectives_gloo_smoke():
    from labs.parallel import collectives

    code, out, _ = _run(collectives.main, ["--backend", "gloo", "--ops", "all_reduce", "--min-size", "8KiB",
                                           "--max-size", "32KiB"])
    assert code == 0 and "busbw" in out and "8 KiB" in out


@pytest.mark.parametrize("argv", [["--min-size", "1GiB", "--max-size", "8KiB"], ["--max-size", "8 parsecs"],
                                  ["--backend", "gloo", "--max-size", "1GiB"], ["--world-size", "1"]])
def test_collectives_bad_arguments(argv):
    from labs.parallel import collectives

    code, _, err = _run(collectives.main, argv)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_report_renders_without_torch_results():
    from labs.parallel import report

    assert "1.75 S" in report.parallel_bus_factor_table()
    assert "derived" in report.parallel_plan_cli("--model llama-3.1-8b --gpus-per-node 2")
    assert "Derived" in report.parallel_moe_table()


# ---------------------------------------------------------------------------
# On GPUs
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_shard_gemms_time_on_one_gpu():
    m = specs.get_model("llama-3.1-8b")
    t1, t2 = gemm_shards.measure(m, 1, 1, reps=3), gemm_shards.measure(m, 2, 1, reps=3)
    assert all(v > 0 for v in t1.values())
    assert sum(t2.values()) < sum(t1.values())   # half the weight bytes to read at one token


@pytest.mark.gpu
def test_gpu_tp_layer_in_bf16_matches_fp64_like_the_whole_layer():
    shape = tp.GPU_CASES[0][0]
    w = tp_layers.random_weights(shape, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(4, shape.hidden, device="cuda").bfloat16()
    parts = [tp_layers.tp_mlp_block(x, tp_layers.shard(w, shape, 2, r), shape, lambda t: None) for r in range(2)]
    ref64 = tp_layers.mlp_block(x.double(), {k: v.double() for k, v in w.items()}, shape)
    whole = tp_layers.mlp_block(x, w, shape)
    err_tp = ((parts[0].double() + parts[1].double()) - ref64).abs().max().item()
    err_whole = (whole.double() - ref64).abs().max().item()
    assert err_tp <= 2 * err_whole + tp.BF16_STEP * max(1.0, ref64.abs().max().item())


@pytest.mark.multigpu(2)
def test_nccl_tp_two_gpus():
    rows = tp.check(2, "nccl", timeout_s=300)
    assert tp.all_ok(rows), tp.format_rows(rows, 2, "nccl")


@pytest.mark.multigpu(2)
def test_nccl_collectives_two_gpus(tmp_path):
    from labs.parallel import collectives

    code, out, err = _run(collectives.main, ["--max-size", "16MiB", "--out", str(tmp_path)])
    assert code == 0, err
    rows = json.loads((tmp_path / "collectives.json").read_text())["rows"]
    assert {r["mode"] for r in rows} == {"eager", "graph"}
