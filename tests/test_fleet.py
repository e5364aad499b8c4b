"""The fleet simulator: routing keeps each replica's cache useful, the autoscaler's signals, cold starts and drains.

Tiny configurations only (a few conversations, a few hundred tokens): every test here runs in
well under a second or two on one core.
"""

from __future__ import annotations

import math

import pytest

from labs.engine.config import EngineConfig
from labs.fleet import cli, scenarios, trace
from labs.fleet.calibration import calibrated_roofline, engine_calibration
from labs.fleet.fleet import Autoscaler, Fleet, LeastLoaded, PrefixAware, RoundRobin, new_sequence
from labs.specs import SpecError

CFG = EngineConfig(max_model_len=16384, max_num_seqs=256, max_num_batched_tokens=8192, num_blocks=4096)


@pytest.fixture(scope="module")
def cost():
    return calibrated_roofline("llama-3.1-8b", "h200", engine_calibration("H200"))


def test_calibration_reproduces_the_engine_rows_it_uses(cost):
    from labs.recorded import load_results
    from labs.fleet.calibration import ENGINE_RESULTS
    from labs.roofline import Chunk

    rows = load_results(ENGINE_RESULTS).machine("H200").rows
    prefill = next(r for r in rows if r["name"] == "chunked/off")
    step = cost.step_time([Chunk(prefill["prompt"], 0)] + [Chunk(1, 512)] * prefill["decodes"])
    assert step * 1e3 == pytest.approx(prefill["ttft_ms"], rel=0.02)  # the compute factor is this row's
    decode = [r for r in rows if r["section"] == "decode" and r["cuda_graphs"]]
    errors = [cost.decode_step_time(r["batch"], r["context"]) * 1e3 / r["step_ms"] - 1 for r in decode]
    assert sorted(abs(e) for e in errors)[len(errors) // 2] < 0.1  # half the rows within 10%
    assert max(abs(e) for e in errors) < 0.4  # the worst (compute-bound B = 256 at L = 128) within 40%
    assert cost.decode_step_time(1, 128) > cost.deployment.decode(1, 128).floor_s  # never faster than the floor


def test_prefix_aware_routing_beats_round_robin_on_the_shared_prefix_trace(cost):
    chat, _ = trace.load()
    small = chat.limit(16)
    rr = scenarios.routing_run(small, cost, CFG, 4, "round-robin")
    pa = scenarios.routing_run(small, cost, CFG, 4, "prefix-aware")
    assert rr["requests"] == pa["requests"] == small.turns
    assert pa["hit_rate"] > rr["hit_rate"] + 0.05
    assert pa["prefill_tokens"] < rr["prefill_tokens"]
    assert pa["ttft_p50_ms"] < rr["ttft_p50_ms"]


def test_prefix_router_spills_to_another_replica_past_its_load_bound(cost):
    """Identical prompts all hit replica 0's cache; the load bound still spreads them."""
    fleet = Fleet(cost, CFG, PrefixAware(1.0), 2)
    shared = list(range(1, 2049))
    arrivals = [(0.001 * i, new_sequence(i, shared + [10**6 + i], 512, 0.001 * i), i) for i in range(40)]
    res = fleet.run(arrivals, lambda seq: 0)
    per = [sum(1 for v in res.replica_of.values() if v == k) for k in range(2)]
    assert min(per) >= 10  # the bound (>= 8 requests, or cap x mean) moved the rest


def _util_ticks(cost, n_requests: int):
    scaler = Autoscaler("util", period_s=2.0, cold_start_s=1000.0, min_replicas=1, max_replicas=8, util_target=0.9)
    fleet = Fleet(cost, CFG, LeastLoaded(), 1, prefix_caching=False, autoscaler=scaler)
    arrivals = [(0.0, new_sequence(i, list(range(10**6 * (i + 1), 10**6 * (i + 1) + 256)), 2000, 0.0), i)
                for i in range(n_requests)]
    return fleet.run(arrivals, lambda seq: 0, until=6.0, stop=4.5).ticks


def test_gpu_utilisation_reads_full_at_any_queue_depth(cost):
    light = _util_ticks(cost, 4)  # four requests decoding: a nearly empty batch
    heavy = _util_ticks(cost, 400)  # 256 running (max_num_seqs) and 144 waiting
    assert light[0].running == 4 and light[0].waiting == 0
    assert heavy[0].waiting > 100
    assert light[0].util > 0.99 and heavy[0].util > 0.99  # the signal cannot tell them apart


def test_util_autoscaler_adds_a_bounded_factor_per_tick_the_queue_one_what_is_missing(cost):
    fleet = Fleet(cost, CFG, RoundRobin(), 2, prefix_caching=False)
    for i in range(600):
        fleet.replicas[i % 2].sched.add(new_sequence(i, [i + 1] * 64, 16, 0.0))
    ready = fleet.replicas
    util = Autoscaler("util", util_target=0.9, max_replicas=32).desired(ready, [1.0, 1.0])
    queue = Autoscaler("queue", target_running=16, max_replicas=32).desired(ready, [1.0, 1.0])
    assert util == math.ceil(2 / 0.9) == 3  # utilisation tops out at 1: one tick adds at most 1 / target
    assert queue == 32  # 600 requests / 16 per replica, clamped to max_replicas


def test_cold_start_delays_capacity_and_a_drain_aborts_nothing(cost):
    scaler = Autoscaler("queue", period_s=1.0, cold_start_s=5.0, stabilization_s=2.0, min_replicas=1,
                        max_replicas=4, target_running=8)
    fleet = Fleet(cost, CFG, LeastLoaded(), 1, prefix_caching=False, autoscaler=scaler)
    arrivals = [(0.02 * i, new_sequence(i, list(range(10**6 * (i + 1), 10**6 * (i + 1) + 2048)), 32, 0.02 * i), i)
                for i in range(120)]
    res = fleet.run(arrivals, lambda seq: 0, until=20.0)
    added = [r for r in res.replicas if r.created > 0]
    assert added, "a queue of 2K-token prompts at 50/s must trigger a scale-up"
    first = min(added, key=lambda r: r.created)
    assert first.ready_at == pytest.approx(first.created + 5.0)
    routed_at = [s.arrival for s in res.requests if res.replica_of[s.seq_id] == first.index]
    assert all(t >= first.ready_at for t in routed_at)  # nothing is routed to a loading replica
    assert len(res.requests) == 120 and all(s.finish_reason == "length" for s in res.requests)
    drained = [r for r in res.replicas if r.released is not None]
    assert drained, "the load ends at 2.4 s: the fleet must scale back down"
    for r in drained:
        done_here = [s.finish_time for s in res.requests if res.replica_of[s.seq_id] == r.index]
        assert all(t <= r.released for t in done_here)


def test_trace_file_matches_its_generator():
    chat, day = trace.load()
    from labs.serving_sim.trace import LengthRange as L
    import yaml

    gen = yaml.safe_load(trace.TRACE_PATH.read_text())["chat"]["generator"]
    drawn = trace.draw_chat(gen["seed"], gen["tenants"], gen["conversations"], gen["preamble"], L.parse(gen["system"]),
                            L.parse(gen["turns"]), L.parse(gen["user"]), L.parse(gen["output"]),
                            tuple(gen["think_s"]), gen["rate_per_s"])
    assert drawn.tenants == chat.tenants and drawn.conversations == chat.conversations
    rates = [day.rate(t) for t in range(0, int(day.seconds))]
    assert min(rates) == pytest.approx(day.base_rate - day.swing, abs=0.05)
    assert max(rates) > day.base_rate + day.peak_rate  # the peak sits on the sinusoid's upper half


def test_bad_trace_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text(trace.TRACE_PATH.read_text().replace("  seed: 8", "  seed: 8\n  sed: 9"))
    with pytest.raises(SpecError, match=r"'day' has unknown key\(s\) \['sed'\]"):
        trace.load(bad)


def test_record_refuses_a_partial_run(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--record", "--conversations", "3"])
    assert exc.value.code == 2
    assert "--record" in capsys.readouterr().err
