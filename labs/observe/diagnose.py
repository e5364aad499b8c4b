"""Name the binding constraint of one run from its metrics, and the knob that relieves it.

The SLO has two targets, TTFT p99 and TPOT p99. The binding SLO is the one furthest over
(or, when both are met, the one with the least headroom). Its cause is then read from the
engine's own signals, the same ones vLLM exports:

- KV: requests were preempted (`vllm:num_preemptions`), or the queue waited with free
  seats while the KV pool was nearly full (`vllm:kv_cache_usage_perc`).
- queue: TTFT is mostly time spent waiting (`vllm:request_queue_time_seconds`) and the
  running batch sat at max_num_seqs with a queue behind it (`vllm:num_requests_running`,
  `vllm:num_requests_waiting`).
- prefill: TTFT is mostly time after admission (`vllm:request_prefill_time_seconds`), or
  the queue waited with free seats while every step used its whole token budget
  (`vllm:iteration_tokens_total` at max_num_batched_tokens).
- decode: TPOT is over; the cause is either prefill chunks sharing the decode steps (mixed
  steps much slower than decode-only ones) or the decode batch itself.

Pure functions on a dict of run statistics, so the rules are tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

CONSTRAINTS = ("queue", "prefill", "decode", "kv")
SHARE = 0.1  # a condition that holds on at least this share of steps counts
MIXED_SLOWDOWN = 2.0  # mixed steps this many times the decode-only step: prefill is stalling decode

# What relieves each cause: (constraint, cause, knob, the price).
RELIEF = (
    ("queue", "seats full: running at max_num_seqs with a queue behind",
     "raise max_num_seqs (if KV and TPOT have room)", "TPOT grows with the batch"),
    ("prefill", "token budget full: every step spends max_num_batched_tokens",
     "raise max_num_batched_tokens", "longer mixed steps: TPOT and ITL grow"),
    ("prefill", "long prompts take several chunks after admission",
     "raise max_num_batched_tokens (or turn on prefix caching for shared prompts)", "longer mixed steps"),
    ("decode", "prefill chunks share the decode steps",
     "lower max_num_batched_tokens (or long_prefill_token_threshold)", "TTFT of long prompts grows"),
    ("decode", "the decode batch itself is too slow",
     "lower max_num_seqs, or more GPUs (TP) for the same load", "queueing: TTFT grows"),
    ("kv", "preemptions, or a queue with free seats and a full KV pool",
     "more KV memory (gpu_memory_utilization, fp8 KV cache, TP) or a lower max_num_seqs", "fewer requests in flight"),
)


@dataclass(frozen=True)
class SLO:
    ttft_ms: float
    tpot_ms: float


def binding(stats: dict, slo: SLO) -> dict:
    """{'binding_slo', 'slo_met', 'binding', 'cause', 'knob'} for one run's statistics.

    stats: ttft_p99_ms, tpot_p99_ms, queue_p99_ms, preemptions, and the shares of steps on
    which seats_full / budget_full / kv_full held, mixed_step_ms and decode_step_ms (None
    when a kind of step did not occur).
    """
    r_ttft = stats["ttft_p99_ms"] / slo.ttft_ms
    r_tpot = stats["tpot_p99_ms"] / slo.tpot_ms
    which = "ttft" if r_ttft >= r_tpot else "tpot"
    met = r_ttft <= 1 and r_tpot <= 1
    if stats["preemptions"] > 0 or stats["kv_full_share"] >= SHARE:
        i = 5
    elif which == "ttft":
        queued = stats["queue_p99_ms"] >= 0.5 * stats["ttft_p99_ms"]
        if queued and stats["seats_full_share"] >= SHARE and stats["seats_full_share"] >= stats["budget_full_share"]:
            i = 0
        elif queued and stats["budget_full_share"] >= SHARE:
            i = 1
        else:
            i = 2
    else:
        mixed, dec = stats.get("mixed_step_ms"), stats.get("decode_step_ms")
        i = 3 if mixed is not None and dec and mixed >= MIXED_SLOWDOWN * dec else 4
    constraint, cause, knob, _ = RELIEF[i]
    return {"binding_slo": which, "slo_met": met, "binding": constraint, "cause": cause,
            "knob": knob, "ttft_ratio": round(r_ttft, 3), "tpot_ratio": round(r_tpot, 3)}
