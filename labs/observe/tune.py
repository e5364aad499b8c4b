"""The tuning loop on the real engine, one knob at a time, against a stated SLO: `python -m labs.observe.tune`.

    python -m labs.observe.tune --model llama-3.1-8b --rate-scale 1.5 --slo ttft:300 tpot:40 --out out/tune
    python -m labs.observe.tune --tiny --device cpu --requests 12 --out out/tune     # a smoke run

The stored trace (labs/data/engine_trace.yaml) is replayed on the wall clock with its
arrival times divided by --rate-scale (1.5 offers 1.5 times the trace's request rate).
Each setting changes ONE knob from the base (max_num_batched_tokens, max_num_seqs,
chunked prefill on or off, and a KV pool cut short to show a KV-bound run). For each it
prints goodput (requests per second that met both SLO targets), the p99s, what the
gauges did, and the binding constraint named from them (labs/observe/diagnose.py).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import deque

from labs import cli
from labs.observe import common, diagnose

KEY = ("setting",)
BASE = {"max_num_batched_tokens": 2048, "max_num_seqs": 32, "enable_chunked_prefill": True}
KV_SHORT_SEQS = 6  # the cut pool holds this many max-length sequences
SETTINGS = (
    ("base", {}),
    ("mnbt-512", {"max_num_batched_tokens": 512}),
    ("mnbt-8192", {"max_num_batched_tokens": 8192}),
    ("seqs-8", {"max_num_seqs": 8}),
    ("seqs-128", {"max_num_seqs": 128}),
    ("chunking-off", {"enable_chunked_prefill": False}),
    ("kv-cut", {"num_blocks": "short"}),
)
NAMES = tuple(n for n, _ in SETTINGS)


def slo_pair(text: str) -> tuple[str, float]:
    name, sep, value = text.partition(":")
    if not sep or name not in ("ttft", "tpot"):
        raise argparse.ArgumentTypeError(f"expected ttft:MS or tpot:MS, got {text!r}")
    return name, cli.finite_float(0, 3.6e6, lo_open=True, unit="ms")(value)


def parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.observe.tune", description=__doc__.split("\n\n")[0])
    common.add_engine_flags(p)
    p.add_argument("--rate-scale", type=cli.finite_float(0.01, 100), default=1.5,
                   help="offered load as a multiple of the trace's rate (default: %(default)s)")
    p.add_argument("--requests", type=cli.bounded_int(1, 96), default=96, help="the trace's first N requests")
    p.add_argument("--length-scale", type=cli.finite_float(0.001, 1), default=1.0,
                   help="scale prompt and output lengths down (a CPU smoke run; default 1)")
    p.add_argument("--slo", type=slo_pair, nargs=2, metavar="NAME:MS", default=[("ttft", 300.0), ("tpot", 40.0)],
                   help="the two targets on p99, ttft:MS tpot:MS (default: ttft:300 tpot:40)")
    p.add_argument("--only", type=cli.number_list(cli.choice(NAMES, "setting"), len(NAMES)),
                   help="comma-separated settings (default: all)")
    p.add_argument("--max-run-s", type=cli.finite_float(1, 600), default=20.0,
                   help="a setting's run is cut after this many seconds; unfinished requests count as missed")
    p.add_argument("--budget-s", type=cli.finite_float(1, 3600), default=600.0,
                   help="skip the settings that would start after this many seconds")
    common.add_output_flags(p, common.TUNE_FILE)
    return p


def load_trace(n: int, rate_scale: float, length_scale: float) -> list[tuple[float, int, int]]:
    from labs.engine.bench import load_trace as stored

    return [(a / rate_scale, max(2, int(p * length_scale)), max(2, int(o * length_scale)))
            for a, p, o in stored()[:n]]


def replay(llm, trace, max_run_s: float, seed: int = 0) -> dict:
    """Feed the trace on the wall clock; per step, the gauges; per request, its times. Returns raw samples."""
    from labs.engine.sequence import SamplingParams

    sched, blocks = llm.scheduler, llm.blocks
    rng = random.Random(seed)
    vocab = llm.model.cfg.vocab_size
    pending = deque(sorted(trace))
    seqs, admitted, steps = [], {}, []
    start = time.perf_counter()
    while (pending or sched.has_work()) and time.perf_counter() - start < max_run_s:
        now = time.perf_counter()
        while pending and pending[0][0] <= now - start:
            a, p, o = pending.popleft()
            seq, out = llm.add_request([rng.randrange(vocab) for _ in range(p)],
                                       SamplingParams(max_tokens=o, ignore_eos=True))
            if seq is None:
                raise RuntimeError(f"the engine refused a trace request: {out.error}")
            seq.arrival = start + a
            seqs.append(seq)
        if not sched.has_work():
            time.sleep(max(0.0, min(pending[0][0] - (time.perf_counter() - start), 0.05)))
            continue
        t = time.perf_counter()
        waiting_before = len(sched.waiting)
        n_steps = len(llm.steps)
        finished = llm.step()
        for s in list(sched.running) + finished:
            admitted.setdefault(s.seq_id, t)
        rec = llm.steps[-1] if len(llm.steps) > n_steps else None
        usable = blocks.num_usable
        steps.append({"t": t - start, "waiting_before": waiting_before, "waiting": len(sched.waiting),
                      "running": len(sched.running), "kv": (usable - blocks.num_free) / usable if usable else 0.0,
                      "seconds": rec.seconds if rec else time.perf_counter() - t,
                      "tokens": rec.num_tokens if rec else 0, "decode_only": rec.decode_only if rec else False})
    cut = bool(pending or sched.has_work())
    for s in list(sched.running) + list(sched.waiting):
        llm.abort(s)
    return {"seqs": seqs, "admitted": admitted, "steps": steps, "wall": time.perf_counter() - start, "cut": cut,
            "unsent": len(pending), "preemptions": sched.preemptions}


def _pct(xs, q):
    from labs.serving_sim.metrics import percentile

    v = percentile(xs, q)
    return None if math.isnan(v) else v


def _ms(x):
    return None if x is None else round(x * 1e3, 2)


def summarise(raw: dict, config, slo: diagnose.SLO, offered: int) -> dict:
    """One row: goodput, the p99s, the gauges' story, and the binding constraint."""
    seqs, steps = raw["seqs"], raw["steps"]
    done = [s for s in seqs if s.finish_time is not None and s.finish_reason != "abort"]  # aborted: cut at the end
    ttft = [s.first_token_time - s.arrival for s in seqs if s.first_token_time is not None]
    tpot = [(s.finish_time - s.first_token_time) / (s.num_output - 1) for s in done if s.num_output > 1]
    queue = [raw["admitted"][s.seq_id] - s.arrival for s in seqs if s.seq_id in raw["admitted"]]
    prefill = [s.first_token_time - raw["admitted"][s.seq_id] for s in seqs
               if s.first_token_time is not None and s.seq_id in raw["admitted"]]
    good = sum(1 for s in done if s.first_token_time - s.arrival <= slo.ttft_ms / 1e3
               and (s.num_output < 2 or (s.finish_time - s.first_token_time) / (s.num_output - 1) <= slo.tpot_ms / 1e3))
    span = raw["wall"]
    budget, seats = config.token_budget, config.max_num_seqs
    n = max(1, len(steps))
    queued = [x for x in steps if x["waiting_before"] > 0]
    dec = [x["seconds"] for x in steps if x["decode_only"]]
    mixed = [x["seconds"] for x in steps if not x["decode_only"] and x["tokens"] > 0]
    # an unfinished or unserved request misses its SLO: its TTFT or TPOT is beyond the run
    missing = offered - len(done)
    ttft_all = ttft + [math.inf] * (offered - len(ttft))
    tpot_all = tpot + [math.inf] * missing
    stats = {
        "ttft_p99_ms": _ms(_pct_inf(ttft_all, 99)), "tpot_p99_ms": _ms(_pct_inf(tpot_all, 99)),
        "queue_p99_ms": _ms(_pct(queue, 99)) or 0.0,
        "preemptions": raw["preemptions"],
        "seats_full_share": round(sum(x["running"] >= seats for x in queued) / n, 3),
        "budget_full_share": round(sum(x["tokens"] >= budget for x in queued) / n, 3),
        "kv_full_share": round(sum(x["kv"] >= 0.9 and x["running"] < seats for x in queued) / n, 3),
        "mixed_step_ms": _ms(_pct(mixed, 50)), "decode_step_ms": _ms(_pct(dec, 50)),
    }
    d = diagnose.binding({k: (math.inf if v is None and k.endswith("p99_ms") else v) for k, v in stats.items()}, slo)
    stats = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in stats.items()}  # JSON has no inf
    row = {
        "requests": offered, "completed": len(done), "unfinished": missing, "good": good, "seconds": round(span, 3), "cut": raw["cut"],
        "goodput_rps": round(good / span, 3), "throughput_rps": round(len(done) / span, 3),
        "output_tok_s": round(sum(s.num_output for s in seqs) / span, 1),
        "ttft_p50_ms": _ms(_pct(ttft, 50)), "tpot_p50_ms": _ms(_pct(tpot, 50)),
        "prefill_p99_ms": _ms(_pct(prefill, 99)),
        **stats, "waiting_mean": round(sum(x["waiting"] for x in steps) / n, 2),
        "waiting_max": max((x["waiting"] for x in steps), default=0),
        "running_mean": round(sum(x["running"] for x in steps) / n, 2),
        "kv_peak": round(max((x["kv"] for x in steps), default=0.0), 3), "steps": len(steps), **d,
    }
    return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}  # JSON has no inf


def _pct_inf(xs, q):
    """A percentile where an infinite value (a missed request) may be the answer."""
    if not xs:
        return None
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    if math.isinf(xs[hi]):
        return math.inf if math.isinf(xs[lo]) or hi == lo else xs[lo] if pos == lo else math.inf
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def engine_args(name_changes: dict, trace) -> dict:
    max_len = max(p + o for _, p, o in trace) + 16
    args = {**BASE, "max_model_len": max_len, "enable_prefix_caching": False, **name_changes}
    if args.get("num_blocks") == "short":
        args["num_blocks"] = KV_SHORT_SEQS * -(-max_len // 16)
    return args


def warm(llm) -> None:
    """Capture every decode bucket's graph and compile the kernels before the timed run."""
    from labs.engine import SamplingParams
    from labs.engine.runner import batch_buckets

    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for b in batch_buckets(llm.config.max_num_seqs):
        if llm.blocks.blocks_for(4) * b <= llm.blocks.num_usable:
            llm.generate([[1, 2, 3]] * b, params)
    llm.generate([[1] * min(512, llm.config.max_model_len - 4)], params)
    llm.steps.clear()


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    common.check_output_flags(p, a)
    slo_d = dict(a.slo)
    if sorted(slo_d) != ["tpot", "ttft"]:
        cli.reject(p, "--slo", "give both ttft:MS and tpot:MS")
    device = common.pick_device(p, a)
    slo = diagnose.SLO(slo_d["ttft"], slo_d["tpot"])
    from labs.engine.config import ConfigError

    trace = load_trace(a.requests, a.rate_scale, a.length_scale)
    wanted = a.only or NAMES
    t0 = time.perf_counter()
    try:
        first = engine_args(dict(SETTINGS)[wanted[0]], trace)
        llm = common.open_engine(a, device, **first)
    except ConfigError as exc:
        return cli.fail(str(exc))
    rows = []
    run = {"date": common.today(), "model": common.model_label(a), "device": device,
           "rate_scale": a.rate_scale, "length_scale": a.length_scale, "requests": len(trace),
           "slo_ms": {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms}, "trace": "labs/data/engine_trace.yaml",
           "max_run_s": a.max_run_s}
    machine = common.machine_name(a, device)
    print(f"SLO: TTFT p99 <= {slo.ttft_ms:g} ms, TPOT p99 <= {slo.tpot_ms:g} ms; {len(trace)} requests at "
          f"{a.rate_scale:g}x the trace's rate", file=sys.stderr)
    for name in wanted:
        if time.perf_counter() - t0 > a.budget_s:
            print(f"{name}: skipped, --budget-s {a.budget_s:g} s spent", file=sys.stderr)
            continue
        args = engine_args(dict(SETTINGS)[name], trace)
        llm.reconfigure(**args)
        warm(llm)
        raw = replay(llm, trace, a.max_run_s)
        row = {"setting": name, "ok": True, "knob_changed": _changed(name), **_config_fields(llm.config),
               **summarise(raw, llm.config, slo, len(trace))}
        rows.append(row)
        print(f"{name:>30}: goodput {row['goodput_rps']:.2f} req/s ({row['good']}/{row['requests']} good), "
              f"TTFT p99 {row['ttft_p99_ms']} ms, TPOT p99 {row['tpot_p99_ms']} ms, waiting max "
              f"{row['waiting_max']}, KV peak {row['kv_peak']:.0%}, preemptions {row['preemptions']} -> "
              f"binding: {row['binding']} ({row['cause']})", flush=True)
        rc = common.write(a, "tune", [row], common.TUNE_FILE, "observe_tune", KEY, run, machine)  # each as it lands
        if rc:
            return rc
    common.write_out(a, "tune", rows, run, machine)
    return 0


def _changed(name: str) -> str | None:
    changes = dict(SETTINGS)[name]
    return next(iter(changes), None)


def _config_fields(c) -> dict:
    return {"max_num_batched_tokens": c.max_num_batched_tokens, "max_num_seqs": c.max_num_seqs,
            "enable_chunked_prefill": c.enable_chunked_prefill, "token_budget": c.token_budget,
            "num_blocks": c.usable_blocks}


if __name__ == "__main__":
    sys.exit(main())
