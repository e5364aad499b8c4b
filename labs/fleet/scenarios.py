"""The fleet lab's two experiments; each returns JSON-ready rows and the table the CLI prints.

* `routing`: the stored chat trace through N replicas under each router: prefix-cache hit rate
  (cached prompt tokens / prompt tokens, as vllm:prefix_cache_hits / vllm:prefix_cache_queries
  count it), TTFT p50/p99, TPOT p50, and how unevenly the work landed.
* `autoscale`: the day-shaped load through a fleet that starts at its minimum and is scaled by
  each autoscaler: requests that missed the SLO, GPU-hours, replicas over time.

Every number is derived by the simulator on the calibrated clock (labs/fleet/calibration.py), never
measured on a fleet.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.config import EngineConfig
from labs.fleet.calibration import CalibratedRoofline
from labs.fleet.fleet import ROUTERS, Autoscaler, Fleet, LeastLoaded, PrefixAware, RunResult, new_sequence
from labs.fleet.trace import ChatTrace, DayLoad
from labs.serving_sim.metrics import percentile, table
from labs.specs import SpecError

LABEL = "derived (fleet simulator on the engine-calibrated roofline), not measured"
MAX_TURNS = 64  # per conversation: sequence ids and token ranges are laid out for at most this many
SEGMENT = 10_000  # token ids per segment: longer than any one message


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float

    def met(self, seq) -> bool:
        if seq.first_token_time is None or seq.finish_time is None:
            return False
        ttft = seq.first_token_time - seq.arrival
        tpot = (seq.finish_time - seq.first_token_time) / (seq.num_output - 1) if seq.num_output > 1 else 0.0
        return ttft <= self.ttft_s and tpot <= self.tpot_s


def _ttfts(seqs) -> list[float]:
    return [s.first_token_time - s.arrival for s in seqs]


def _tpots(seqs) -> list[float]:
    return [(s.finish_time - s.first_token_time) / (s.num_output - 1) for s in seqs if s.num_output > 1]


# ---------------------------------------------------------------------------
# Routing on the multi-turn chat trace
# ---------------------------------------------------------------------------


class ChatWorkload:
    """Prompts and replies of the chat trace as token ids, and the next turn when a reply ends."""

    def __init__(self, trace: ChatTrace):
        if any(len(c.turns) > MAX_TURNS for c in trace.conversations):
            raise SpecError(f"a conversation has more than {MAX_TURNS} turns")
        self.trace = trace
        self.by_id = {c.cid: c for c in trace.conversations}
        self.preamble = list(range(1, trace.preamble + 1))
        self.replies: dict[int, list[int]] = {}

    @staticmethod
    def seq_id(cid: int, turn: int) -> int:
        return cid * MAX_TURNS + turn

    def _segment(self, cid: int, turn: int, reply: bool, n: int) -> list[int]:
        base = 10**9 + (2 * self.seq_id(cid, turn) + reply) * SEGMENT
        return list(range(base, base + n))

    def request(self, cid: int, turn: int, arrival: float):
        c = self.by_id[cid]
        system = list(range((c.tenant + 1) * 10**6, (c.tenant + 1) * 10**6 + self.trace.tenants[c.tenant]))
        prompt = self.preamble + system
        for k in range(turn):
            prompt += self._segment(cid, k, False, c.turns[k].user) + self._segment(cid, k, True, c.turns[k].output)
        prompt += self._segment(cid, turn, False, c.turns[turn].user)
        sid = self.seq_id(cid, turn)
        self.replies[sid] = self._segment(cid, turn, True, c.turns[turn].output)
        return arrival, new_sequence(sid, prompt, c.turns[turn].output, arrival), cid

    def first_turns(self):
        return [self.request(c.cid, 0, c.start) for c in self.trace.conversations]

    def token(self, seq) -> int:
        return self.replies[seq.seq_id][seq.num_output]

    def on_finish(self, seq, now: float):
        cid, turn = divmod(seq.seq_id, MAX_TURNS)
        del self.replies[seq.seq_id]
        c = self.by_id[cid]
        if turn + 1 < len(c.turns):
            return [self.request(cid, turn + 1, now + c.turns[turn].think_s)]
        return []


def routing_run(trace: ChatTrace, cost: CalibratedRoofline, cfg: EngineConfig, replicas: int, policy: str,
                load_cap: float = 1.25) -> dict:
    """One router over the chat trace: hit rate, TTFT and TPOT percentiles, balance."""
    if policy not in ROUTERS:
        raise SpecError(f"unknown router {policy!r}; one of {', '.join(ROUTERS)}")
    router = PrefixAware(load_cap) if policy == "prefix-aware" else ROUTERS[policy]()
    work = ChatWorkload(trace)
    res = Fleet(cost, cfg, router, replicas).run(work.first_turns(), work.token, work.on_finish)
    return _routing_row(res, policy, replicas, load_cap)


def _routing_row(res: RunResult, policy: str, replicas: int, load_cap: float) -> dict:
    seqs = res.requests
    prompt = sum(s.num_prompt_tokens for s in seqs)
    cached = sum(s.num_cached_tokens for s in seqs)
    per = [0] * replicas
    for s in seqs:
        per[res.replica_of[s.seq_id]] += s.num_prompt_tokens - s.num_cached_tokens
    t, p = _ttfts(seqs), _tpots(seqs)
    busy = [r.busy_s for r in res.replicas]
    return {"name": f"routing/{policy}/N{replicas}", "section": "routing", "ok": True, "policy": policy,
            "replicas": replicas, "load_cap": load_cap if policy == "prefix-aware" else None,
            "requests": len(seqs), "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": round(cached / prompt, 4), "prefill_tokens": prompt - cached,
            "ttft_p50_ms": round(percentile(t, 50) * 1e3, 1), "ttft_p99_ms": round(percentile(t, 99) * 1e3, 1),
            "tpot_p50_ms": round(percentile(p, 50) * 1e3, 2), "tpot_p99_ms": round(percentile(p, 99) * 1e3, 2),
            "prefill_max_over_mean": round(max(per) / (sum(per) / replicas), 3) if sum(per) else None,
            "busy_max_over_mean": round(max(busy) / (sum(busy) / replicas), 3) if sum(busy) else None,
            "duration_s": round(res.end_time, 2)}


ROUTING_COLUMNS = [("policy", "router", "{}"), ("replicas", "replicas", "{}"), ("hit_rate", "prefix-cache hit rate", "{:.1%}"),
                   ("prefill_tokens", "prompt tokens prefilled", "{:,}"), ("ttft_p50_ms", "TTFT p50 ms", "{:,.0f}"),
                   ("ttft_p99_ms", "TTFT p99 ms", "{:,.0f}"), ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
                   ("busy_max_over_mean", "busiest GPU / mean", "{:.2f}")]


def routing(trace: ChatTrace, cost: CalibratedRoofline, cfg: EngineConfig, replica_counts: tuple[int, ...],
            policies: tuple[str, ...], load_cap: float) -> tuple[list[dict], str]:
    rows = [routing_run(trace, cost, cfg, n, p, load_cap) for n in replica_counts for p in policies]
    text = "\n".join([
        f"{len(trace.conversations)} conversations, {trace.turns:,} turns, {len(trace.tenants)} tenants behind one "
        f"{trace.preamble}-token preamble; prefix-aware load cap {load_cap:g}. {LABEL}.", "",
        table([h for _, h, _ in ROUTING_COLUMNS],
              [[fmt.format(r[k]) if r[k] is not None else "-" for k, _, fmt in ROUTING_COLUMNS] for r in rows],
              "lrrrrrrr")])
    return rows, text


# ---------------------------------------------------------------------------
# Autoscaling over the day-shaped load
# ---------------------------------------------------------------------------


def day_requests(day: DayLoad, first_id: int = 0):
    """The day's requests, each with a prompt of its own (ids no other request shares)."""
    out = []
    for i, (t, p, o) in enumerate(day.draw()):
        base = 10**9 + i * SEGMENT
        out.append((t, new_sequence(first_id + i, list(range(base, base + p)), o, t), i))
    return out


def autoscale_run(day: DayLoad, cost: CalibratedRoofline, cfg: EngineConfig, scaler: Autoscaler, slo: SLO,
                  label: str) -> dict:
    arrivals = day_requests(day)
    fleet = Fleet(cost, cfg, LeastLoaded(), scaler.min_replicas, prefix_caching=False, autoscaler=scaler)
    res = fleet.run(arrivals, lambda seq: 0, until=day.seconds)
    seqs = res.requests
    met = sum(1 for s in seqs if slo.met(s))
    t, p = _ttfts(seqs), _tpots(seqs)
    gpu_s = res.gpu_seconds()
    return {"name": f"autoscale/{label}", "section": "autoscale", "ok": True, "policy": scaler.policy,
            "label": label, "util_target": scaler.util_target if scaler.policy == "util" else None,
            "target_running": scaler.target_running if scaler.policy == "queue" else None,
            "requests": len(seqs), "slo_violations": len(seqs) - met,
            "slo_violation_rate": round((len(seqs) - met) / len(seqs), 4),
            "ttft_p50_ms": round(percentile(t, 50) * 1e3, 1), "ttft_p99_ms": round(percentile(t, 99) * 1e3, 1),
            "tpot_p99_ms": round(percentile(p, 99) * 1e3, 2),
            "gpu_hours": round(gpu_s / 3600, 4), "mean_replicas": round(gpu_s / res.end_time, 2),
            "peak_replicas": max((k.ready + k.loading for k in res.ticks), default=scaler.min_replicas),
            "scale_ups": sum(1 for r in res.replicas if r.created > 0),
            "duration_s": round(res.end_time, 1),
            "ticks": [[round(k.t, 1), k.ready, k.loading, k.waiting, k.running, round(k.util, 3), k.desired]
                      for k in res.ticks]}


AUTOSCALE_COLUMNS = [("label", "autoscaler", "{}"), ("requests", "requests", "{:,}"),
                     ("slo_violation_rate", "missed the SLO", "{:.1%}"), ("ttft_p99_ms", "TTFT p99 ms", "{:,.0f}"),
                     ("tpot_p99_ms", "TPOT p99 ms", "{:.1f}"), ("gpu_hours", "GPU-hours", "{:.3f}"),
                     ("mean_replicas", "mean GPUs", "{:.2f}"), ("peak_replicas", "peak GPUs", "{}")]


def autoscale(day: DayLoad, cost: CalibratedRoofline, cfg: EngineConfig, scalers: list[tuple[str, Autoscaler]],
              slo: SLO) -> tuple[list[dict], str]:
    rows = [autoscale_run(day, cost, cfg, s, slo, label) for label, s in scalers]
    a = scalers[0][1]
    text = "\n".join([
        f"Compressed day of {day.seconds:g} s: {day.base_rate:g} +/- {day.swing:g} requests/s and a peak of "
        f"+{day.peak_rate:g} at t = {day.peak_at_s:g} s; prompts {day.prompt}, replies {day.output} tokens. "
        f"Cold start {a.cold_start_s:g} s, control period {a.period_s:g} s, scale-down window "
        f"{a.stabilization_s:g} s, {a.min_replicas} to {a.max_replicas} GPUs. SLO: TTFT <= {slo.ttft_s * 1e3:g} ms "
        f"and TPOT <= {slo.tpot_s * 1e3:g} ms per request. {LABEL}.", "",
        table([h for _, h, _ in AUTOSCALE_COLUMNS],
              [[fmt.format(r[k]) for k, _, fmt in AUTOSCALE_COLUMNS] for r in rows], "lrrrrrrr")])
    return rows, text
