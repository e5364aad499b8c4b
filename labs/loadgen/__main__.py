"""Sweep load against an OpenAI-compatible endpoint: `python -m labs.loadgen`.

    python -m labs.loadgen --base-url http://127.0.0.1:8000 --concurrency 1,4,16,64 --out out/lg
    python -m labs.loadgen --base-url http://127.0.0.1:8000 --request-rate 2,8,32 --num-prompts 200 --out out/lg
    python -m labs.loadgen ... --record --machine "NVIDIA H200" --system "labs.server llama-3.1-8b"

Closed loop (--concurrency C): C clients, each sends its next request when the last one
finished, so the load adapts to the server. Open loop (--request-rate R): requests arrive
as a Poisson process of R per second whatever the server does, as `vllm bench serve
--request-rate` sends them. Each point is bounded by --num-prompts and by --max-duration
(no new request after it; the ones in flight get --timeout to finish). Prompts are
--input-len random token ids (text for the chat endpoint), the same for every point.

Prints one line per point and the knee; writes loadgen.json and loadgen.csv to --out
after every point, so a cut-off run keeps what it measured; --record merges the rows
into labs/results/server_sweep.json through labs/recorded.py. Targets any server: ours
(labs.server) or `vllm serve`.
"""

from __future__ import annotations

import asyncio
import csv
import datetime
import io
import json
import os
import random
import sys
import time
from pathlib import Path

from labs import cli
from labs.loadgen import client, stats
from labs.recorded import RESULTS_DIR, Machine, RecordedError, record_rows, write_atomic

RESULTS_FILE = RESULTS_DIR / "server_sweep.json"
KEY = ("system", "mode", "load")
SLO_KEYS = ("ttft", "tpot", "e2el")
CSV_FIELDS = ("system", "mode", "load", "completed", "failed", "duration_s", "request_throughput",
              "request_goodput", "output_throughput", "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_itl_ms", "p99_itl_ms", "p50_e2el_ms",
              "p99_e2el_ms", "little_L", "little_lambda_W", "little_ratio", "server_L", "slope", "knee")


def slo(text: str) -> tuple[str, float]:
    """One SLO pair, `ttft:500` (ms), as `vllm bench serve --goodput` takes them."""
    import argparse

    name, sep, value = text.partition(":")
    if not sep or name not in SLO_KEYS:
        raise argparse.ArgumentTypeError(f"expected NAME:MS with NAME one of {', '.join(SLO_KEYS)}, got {text!r}")
    return name, cli.finite_float(0, 3.6e6, lo_open=True, unit="ms")(value)


def parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.loadgen", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    p.add_argument("--endpoint", choices=("/v1/completions", "/v1/chat/completions"), default="/v1/completions")
    p.add_argument("--model", help="model name to send (default: the first of the server's /v1/models)")
    p.add_argument("--api-key", help="Bearer token (default: $OPENAI_API_KEY, as vllm bench serve reads it)")
    p.add_argument("--concurrency", type=cli.number_list(cli.bounded_int(1, 4096), 32),
                   help="closed-loop sweep: clients in flight, e.g. 1,4,16,64")
    p.add_argument("--request-rate", type=cli.number_list(cli.finite_float(0, 1e4, lo_open=True), 32),
                   help="open-loop sweep: Poisson arrivals per second, e.g. 2,8,32")
    p.add_argument("--num-prompts", type=cli.count(100_000), default=100, help="requests per point (default: %(default)s)")
    p.add_argument("--max-duration", type=cli.finite_float(0.1, 3600), default=60.0,
                   help="seconds per point after which no request is sent (default: %(default)s)")
    p.add_argument("--timeout", type=cli.finite_float(0.1, 3600), default=120.0,
                   help="seconds a request may take (default: %(default)s)")
    p.add_argument("--input-len", type=cli.count(131_072, "tokens"), default=128)
    p.add_argument("--output-len", type=cli.count(131_072, "tokens"), default=64)
    p.add_argument("--ignore-eos", action="store_true", help="ask the server to run every request to --output-len")
    p.add_argument("--warmup", type=cli.bounded_int(0, 1024), default=4,
                   help="untimed requests sent together before the sweep (default: %(default)s)")
    p.add_argument("--percentiles", type=cli.number_list(cli.finite_float(0, 100), 16), default=(50.0, 90.0, 99.0),
                   help="comma-separated (default: 50,90,99)")
    p.add_argument("--goodput", type=slo, nargs="+", metavar="NAME:MS", default=[],
                   help="SLOs a request must meet to count as good, e.g. ttft:500 tpot:50")
    p.add_argument("--seed", type=cli.bounded_int(0, 2**32 - 1), default=0)
    p.add_argument("--out", type=cli.output_dir, required=True, help="folder for loadgen.json and loadgen.csv")
    p.add_argument("--system", default="server", help="a label for what was measured (a row key when recorded)")
    p.add_argument("--record", action="store_true", help="merge the rows into labs/results/server_sweep.json")
    p.add_argument("--replace", action="store_true", help="with --record: let a failing row replace a passing one")
    p.add_argument("--machine", help="with --record: the server's GPU as CUDA names it, e.g. 'NVIDIA H200'")
    p.add_argument("--progress", choices=("auto", "bar", "lines", "off"), default="auto",
                   help="auto: a bar on a terminal, a line per point otherwise")
    return p


class Progress:
    """A one-line bar on stderr, redrawn at most 10 times a second."""

    def __init__(self, mode: str, label: str, total: int):
        self.on = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.label, self.total, self.done, self.failed = label, total, 0, 0
        self.t0 = self.last = time.perf_counter()

    def update(self, ok: bool) -> None:
        self.done += 1
        self.failed += not ok
        now = time.perf_counter()
        if self.on and (now - self.last > 0.1 or self.done == self.total):
            self.last = now
            width = 30
            fill = int(width * self.done / max(1, self.total))
            sys.stderr.write(f"\r{self.label:>16} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total}"
                             f" failed {self.failed} {now - self.t0:6.1f} s")
            sys.stderr.flush()

    def close(self) -> None:
        if self.on:
            sys.stderr.write("\n")


def prompts(args, n: int) -> list:
    """Seeded prompts: token ids 0..255 (plain byte-level ids in any Llama-family vocabulary)."""
    rng = random.Random(args.seed)
    if args.endpoint.endswith("/chat/completions"):
        letters = "abcdefghijklmnopqrstuvwxyz"
        return ["".join(rng.choice(letters) for _ in range(args.input_len)) for _ in range(n)]
    return [[rng.randrange(256) for _ in range(args.input_len)] for _ in range(n)]


async def _scrape(session, url: str, headers: dict, box: list, stop: asyncio.Event) -> None:
    """Sample the server's running + waiting gauges (vLLM's names) twice a second, if it has /metrics."""
    from labs.server.metrics import parse  # stdlib only

    while not stop.is_set():
        try:
            async with session.get(url, headers=headers) as r:
                if r.status != 200:
                    return
                m = parse(await r.text())
            n = sum(v for k, v in m.items() if k.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
                    and "by_reason" not in k)
            box.append(n)
        except Exception:
            return
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass


async def run_point(session, args, model: str, headers: dict, mode: str, load: float, reqs: list) -> dict:
    url = args.base_url.rstrip("/") + args.endpoint
    label = f"{mode}={load:g}"
    bar = Progress(args.progress, label, len(reqs))
    results: list[client.Result] = []
    stop = asyncio.Event()
    server_samples: list[float] = []
    # L, the time-averaged number of requests in flight, integrated exactly: at every send
    # and every finish, add (requests in flight) x (time since the last change).
    flight = {"n": 0, "area": 0.0, "since": time.perf_counter()}

    def change(by: int) -> None:
        now = time.perf_counter()
        flight["area"] += flight["n"] * (now - flight["since"])
        flight["n"] += by
        flight["since"] = now

    async def one(prompt) -> None:
        body = client.payload(args.endpoint, model, prompt, args.output_len, args.ignore_eos)
        change(+1)
        try:
            r = await client.send(session, url, body, len(prompt) if isinstance(prompt, list) else 0, headers,
                                  args.timeout)
        finally:
            change(-1)
        results.append(r)
        bar.update(r.success)

    t0 = flight["since"] = time.perf_counter()
    deadline = t0 + args.max_duration
    scraping = asyncio.ensure_future(_scrape(session, args.base_url.rstrip("/") + "/metrics", headers,
                                             server_samples, stop))
    if mode == "concurrency":
        queue = list(reversed(reqs))

        async def worker() -> None:
            while queue and time.perf_counter() < deadline:
                await one(queue.pop())

        await asyncio.gather(*(worker() for _ in range(int(load))))
    else:
        rng = random.Random(args.seed + 1)
        tasks = []
        next_at = t0
        for prompt in reqs:
            next_at += rng.expovariate(load)
            if next_at > deadline:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(prompt)))
        await asyncio.gather(*tasks)
    change(0)
    dur = time.perf_counter() - t0
    stop.set()
    await scraping
    bar.close()
    mean_in_flight = flight["area"] / dur if dur > 0 else 0.0
    row = {"system": args.system, "mode": mode, "load": load}
    row.update(stats.summarize(results, dur, tuple(args.percentiles), dict(args.goodput), mean_in_flight))
    row["server_L"] = sum(server_samples) / len(server_samples) if server_samples else None
    row["ok"] = row["completed"] > 0 and row["failed"] == 0
    return row


def _mark_knees(rows: list[dict]) -> dict:
    knees = {}
    for mode in ("concurrency", "rate"):
        sel = [r for r in rows if r["mode"] == mode and r["ok"]]
        sel.sort(key=lambda r: r["load"])
        loads = [r["load"] for r in sel]
        ys = [r["output_throughput"] if mode == "concurrency" else r["request_throughput"] for r in sel]
        for r, s in zip(sel, stats.slopes(loads, ys)):
            r["slope"] = s
        k = stats.knee(loads, ys)
        for r in rows:
            if r["mode"] == mode:
                r["knee"] = bool(k is not None and r is sel[k])
        if sel:
            knees[mode] = loads[k] if k is not None else None
    return knees


def _write(out: Path, doc: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "loadgen.json", json.dumps(doc, indent=2, allow_nan=False) + "\n")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in doc["points"]:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    write_atomic(out / "loadgen.csv", buf.getvalue())


def _line(r: dict) -> str:
    little = f"{r['little_ratio']:.2f}" if r["little_ratio"] is not None else "-"
    return (f"{r['mode']:>11} {r['load']:>7g}  done {r['completed']:>5} fail {r['failed']:>3}  "
            f"{r['request_throughput']:7.2f} req/s {r['output_throughput']:9.1f} tok/s  "
            f"TTFT p50 {r['p50_ttft_ms']:8.1f} p99 {r['p99_ttft_ms']:8.1f} ms  "
            f"TPOT p50 {r['p50_tpot_ms']:7.2f} p99 {r['p99_tpot_ms']:7.2f} ms  "
            f"goodput {r['request_goodput']:6.2f} req/s  L {r['little_L']:6.2f} lambda*W {r['little_lambda_W']:6.2f}"
            f" ({little})")


async def _model(session, args, headers) -> str:
    async with session.get(args.base_url.rstrip("/") + "/v1/models", headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"GET /v1/models answered {r.status}; pass --model")
        return (await r.json())["data"][0]["id"]


async def sweep(args) -> dict:
    import aiohttp

    key = args.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    doc = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                      if k not in ("api_key",)},
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "points": []}
    async with aiohttp.ClientSession(connector=conn) as session:
        model = args.model or await _model(session, args, headers)
        doc["config"]["model"] = model
        reqs = prompts(args, args.num_prompts)
        if args.warmup:
            warm = prompts(args, args.warmup)
            url = args.base_url.rstrip("/") + args.endpoint
            await asyncio.gather(*(client.send(session, url, client.payload(args.endpoint, model, w, min(
                args.output_len, 8), args.ignore_eos), 0, headers, args.timeout) for w in warm))
        plan = [("concurrency", float(c)) for c in (args.concurrency or ())]
        plan += [("rate", r) for r in (args.request_rate or ())]
        for mode, load in plan:
            row = await run_point(session, args, model, headers, mode, load, reqs)
            doc["points"].append(row)
            doc["knees"] = _mark_knees(doc["points"])
            _write(args.out, doc)
            print(_line(row), flush=True)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not args.concurrency and not args.request_rate:
        cli.reject(p, "--concurrency", "give --concurrency, --request-rate or both")
    if not args.base_url.startswith(("http://", "https://")):
        cli.reject(p, "--base-url", f"expected an http:// or https:// URL, got {args.base_url!r}")
    if args.record and not (args.machine and args.machine.strip()):
        cli.reject(p, "--machine", "--record needs the server's GPU name, e.g. --machine 'NVIDIA H200'")
    if args.replace and not args.record:
        cli.reject(p, "--replace", "only with --record")
    for name, values in (("--concurrency", args.concurrency), ("--request-rate", args.request_rate)):
        if values and len(set(values)) != len(values):
            cli.reject(p, name, "a value is repeated")
    try:
        doc = asyncio.run(sweep(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the server is not there, or answers nonsense: one line, no traceback
        return cli.fail(f"{args.base_url}: {type(exc).__name__}: {exc}")
    for mode, k in doc.get("knees", {}).items():
        print(f"knee ({mode}): {k:g}" if k is not None else f"knee ({mode}): not reached in this sweep")
    if args.record:
        rows = [{k: v for k, v in r.items()} for r in doc["points"]]
        run = {"date": datetime.date.today().isoformat(), "endpoint": args.endpoint, "input_len": args.input_len,
               "output_len": args.output_len, "num_prompts": args.num_prompts, "max_duration_s": args.max_duration,
               "ignore_eos": args.ignore_eos, "goodput_slo_ms": dict(args.goodput), "model": doc["config"]["model"]}
        try:
            report = record_rows(RESULTS_FILE, "loadgen", Machine(args.machine.strip()), rows, KEY, run,
                                 replace=args.replace)
        except RecordedError as exc:
            return cli.fail(str(exc))
        print(report)
    return 0 if all(r["ok"] for r in doc["points"]) else 1


if __name__ == "__main__":
    sys.exit(main())
