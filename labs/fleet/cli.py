"""Fleet simulator: N engine replicas behind a router, scaled by an autoscaler, on an engine-calibrated clock.

    python -m labs.fleet                          # both experiments, default settings (about a minute)
    python -m labs.fleet --only routing --replicas 2,4
    python -m labs.fleet --only autoscale --cold-start-s 120
    python -m labs.fleet --record                 # into labs/results/fleet.json

routing: the stored multi-turn chat trace (labs/data/fleet_trace.yaml) through round-robin,
least-loaded, session-sticky and prefix-aware routers: prefix-cache hit rate, TTFT, TPOT.
autoscale: the compressed day-shaped load through a fleet scaled on num_requests_waiting +
num_requests_running ("queue") or on GPU utilisation ("util"), with cold starts and drains:
requests that missed the SLO, GPU-hours. Every number is derived by the simulator, not
measured; the step times are calibrated by labs/results/engine.json. Exit code 2 on bad
input, with one line naming the argument.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

from labs import cli, recorded, specs
from labs.engine.config import ConfigError, EngineConfig
from labs.fleet import scenarios, trace
from labs.fleet.calibration import calibrated_roofline, engine_calibration
from labs.fleet.fleet import ROUTERS, Autoscaler
from labs.serving_sim import scenarios as sim_scenarios
from labs.specs import SpecError

RESULTS_PATH = recorded.RESULTS_DIR / "fleet.json"
LAB, KEY = "fleet", ("name",)
MACHINE = recorded.Machine("CPU (fleet simulator, derived)")
SECTIONS = ("routing", "autoscale")


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m labs.fleet", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", type=cli.number_list(cli.choice(SECTIONS, "section"), 2), default=SECTIONS,
                   help="experiments to run: routing, autoscale (default: both)")
    p.add_argument("--model", type=cli.choice(("llama-3.1-8b",), "model"), default="llama-3.1-8b",
                   help="model the engine was calibrated on (default: %(default)s)")
    p.add_argument("--calibration", type=cli.choice(("H200",), "calibration machine"), default="H200",
                   help="machine in labs/results/engine.json whose efficiencies set the clock (default: %(default)s)")
    p.add_argument("--kv-blocks", type=cli.count(1 << 22, "blocks per replica"), default=None,
                   help="KV pool per replica in blocks of 16 (default: sized as vLLM sizes it on an H200)")
    g = p.add_argument_group("routing")
    g.add_argument("--replicas", type=cli.number_list(cli.count(64, "replicas"), 8), default=(4,),
                   help="fleet sizes to run the chat trace on (default: 4)")
    g.add_argument("--routers", type=cli.number_list(cli.choice(tuple(ROUTERS), "router"), 4), default=tuple(ROUTERS),
                   help=f"routers to compare (default: {','.join(ROUTERS)})")
    g.add_argument("--load-cap", type=cli.finite_float(1.0, 16.0), default=1.25,
                   help="prefix-aware router: a replica may hold at most cap x the mean load (default: %(default)s)")
    g.add_argument("--conversations", type=cli.count(100_000, "conversations"), default=None,
                   help="use only the first N conversations of the trace (default: all)")
    a = p.add_argument_group("autoscale")
    a.add_argument("--cold-start-s", type=cli.finite_float(0.0, 3600.0), default=60.0,
                   help="seconds from asking for a replica to its first request: model load (default: %(default)s)")
    a.add_argument("--period-s", type=cli.finite_float(1.0, 600.0), default=15.0,
                   help="autoscaler control period, as HPA's sync period (default: %(default)s)")
    a.add_argument("--stabilization-s", type=cli.finite_float(0.0, 3600.0), default=180.0,
                   help="scale down only to the highest recommendation of this window (default: %(default)s)")
    a.add_argument("--min-replicas", type=cli.count(64, "replicas"), default=1, help="(default: %(default)s)")
    a.add_argument("--max-replicas", type=cli.count(64, "replicas"), default=12, help="(default: %(default)s)")
    a.add_argument("--target-running", type=cli.count(4096, "requests per replica"), default=3,
                   help="queue policy: requests (running + waiting) per replica to size for (default: %(default)s)")
    a.add_argument("--util-targets", type=cli.number_list(cli.finite_float(0.05, 1.0), 4), default=(0.9, 0.6),
                   help="util policy: GPU-utilisation targets to run (default: 0.9,0.6)")
    a.add_argument("--ttft-slo-ms", type=cli.finite_float(1.0, 600_000.0), default=1000.0,
                   help="SLO on time to first token (default: %(default)s)")
    a.add_argument("--tpot-slo-ms", type=cli.finite_float(1.0, 10_000.0), default=100.0,
                   help="SLO on time per output token (default: %(default)s)")
    a.add_argument("--day-scale", type=cli.finite_float(0.01, 1.0), default=1.0,
                   help="run only this fraction of the day's length, same rates (default: %(default)s; tests use less)")
    p.add_argument("--out", metavar="DIR", type=cli.output_dir, help="also write this run's rows as DIR/fleet.json")
    p.add_argument("--record", action="store_true", help="merge the rows into labs/results/fleet.json")
    return p


def engine_config(model: str, blocks: int | None, longest: int) -> EngineConfig:
    """One replica's limits: vLLM's `vllm serve` defaults on an H200, the KV pool sized as vLLM sizes it."""
    s = sim_scenarios.setup(model, "h200", max_model_len=16384)
    return EngineConfig(max_model_len=max(16384, longest), max_num_seqs=s.max_num_seqs,
                        max_num_batched_tokens=s.max_num_batched_tokens, block_size=s.block_size,
                        num_blocks=blocks or s.num_blocks, enable_prefix_caching=True)


def run(a: argparse.Namespace) -> tuple[list[dict], str, dict]:
    if a.min_replicas > a.max_replicas:
        raise SpecError(f"argument --min-replicas: must be <= --max-replicas ({a.max_replicas}), got {a.min_replicas}")
    chat, day = trace.load()
    if a.conversations:
        chat = chat.limit(a.conversations)
    if a.day_scale < 1:
        from dataclasses import replace
        day = replace(day, seconds=day.seconds * a.day_scale, peak_at_s=day.peak_at_s * a.day_scale)
    cal = engine_calibration(a.calibration)
    cost = calibrated_roofline(a.model, "h200", cal)
    cfg = engine_config(a.model, a.kv_blocks, chat.longest())
    if chat.longest() > cfg.usable_blocks * cfg.block_size:
        raise SpecError(f"argument --kv-blocks: the longest conversation needs {chat.longest():,} tokens, "
                        f"more than {cfg.usable_blocks:,} blocks x {cfg.block_size} hold")
    rows, texts = [], [cal.describe() + "."]
    if "routing" in a.only:
        r, t = scenarios.routing(chat, cost, cfg, a.replicas, a.routers, a.load_cap)
        rows += r
        texts += ["", "## Routing", "", t]
    if "autoscale" in a.only:
        common = dict(period_s=a.period_s, cold_start_s=a.cold_start_s, stabilization_s=a.stabilization_s,
                      min_replicas=a.min_replicas, max_replicas=a.max_replicas)
        scalers = [("queue", Autoscaler("queue", target_running=a.target_running, **common))]
        scalers += [(f"util {u:g}", Autoscaler("util", util_target=u, **common)) for u in a.util_targets]
        slo = scenarios.SLO(a.ttft_slo_ms / 1e3, a.tpot_slo_ms / 1e3)
        r, t = scenarios.autoscale(day, cost, cfg, scalers, slo)
        rows += r
        texts += ["", "## Autoscaling", "", t]
    info = {"calibration": cal.to_json(), "trace": "labs/data/fleet_trace.yaml", "model": a.model,
            "kv_blocks": cfg.usable_blocks, "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "slo_ms": {"ttft": a.ttft_slo_ms, "tpot": a.tpot_slo_ms},
            "autoscaler": {"period_s": a.period_s, "cold_start_s": a.cold_start_s, "stabilization_s": a.stabilization_s,
                           "min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
                           "target_running": a.target_running},
            "day": {"seconds": day.seconds, "base_rate": day.base_rate, "swing": day.swing, "peak_at_s": day.peak_at_s,
                    "peak_rate": day.peak_rate, "peak_width_s": day.peak_width_s, "prompt": str(day.prompt),
                    "output": str(day.output)},
            "chat": {"conversations": len(chat.conversations), "turns": chat.turns, "tenants": len(chat.tenants),
                     "preamble": chat.preamble}}
    return rows, "\n".join(texts), info


def _is_default(a: argparse.Namespace) -> bool:
    """Only the default run (whole trace, whole day) may be recorded: the page's figures assume it."""
    return a.conversations is None and a.day_scale == 1.0 and tuple(a.only) == SECTIONS


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.record and not _is_default(a):
        cli.reject(p, "--record", "records the whole trace and the whole day: drop --conversations, --day-scale "
                                  "and --only")
    t0 = time.perf_counter()
    try:
        rows, text, info = run(a)
    except (SpecError, ConfigError, specs.SpecError) as err:
        return cli.fail(str(err))
    print(text)
    run_info = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                "wall_s": round(time.perf_counter() - t0, 1), **info}
    targets = ([Path(a.out) / RESULTS_PATH.name] if a.out else []) + ([RESULTS_PATH] if a.record else [])
    for path in targets:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            print(recorded.record_rows(path, LAB, MACHINE, rows, KEY, run_info, replace=True,
                                       derive=lambda _rows: {"table": text}))
        except (OSError, recorded.RecordedError) as err:
            return cli.fail(f"cannot write {path}: {err}")
    print(f"wall time {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
