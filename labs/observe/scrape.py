"""Poll a server's /metrics while load runs and keep what an on-call reads: `python -m labs.observe.scrape`.

    python -m labs.observe.scrape --base-url http://127.0.0.1:8000 --interval 0.5 --duration 20 --out out/scrape

Every --interval seconds for --duration seconds it reads the waiting, running and KV-usage
gauges, the preemption and token counters and the TTFT histogram's buckets, and works out
the TTFT p99 of the last --window seconds from the bucket deltas, as a Grafana panel on
`histogram_quantile(0.99, rate(..._bucket[w]))` would. Works against labs.server or a real
`vllm serve`. A scrape that fails is a row with "ok": false and the reason; the run goes on.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

from labs import cli
from labs.observe import common, series

KEY = ("series", "t_s")


def parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.observe.scrape", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    p.add_argument("--interval", type=cli.finite_float(0.05, 60), default=0.5, help="seconds between scrapes")
    p.add_argument("--duration", type=cli.finite_float(0.1, 3600), default=20.0, help="seconds to keep scraping")
    p.add_argument("--window", type=cli.finite_float(0.1, 600), default=2.0,
                   help="seconds of observations each TTFT p99 covers (default: %(default)s)")
    p.add_argument("--stop-when-idle", type=cli.finite_float(0.1, 600), metavar="S",
                   help="stop once no request has been waiting or running for S seconds after load was seen")
    p.add_argument("--series", default="server", help="a label for this run (a row key when recorded)")
    common.add_output_flags(p, common.SCRAPE_FILE)
    return p


def fetch(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def poll(url: str, interval: float, duration: float, window: float, label: str, idle_s: float | None = None,
         get=fetch, clock=time.monotonic, sleep=time.sleep) -> list[dict]:
    """Rows, one per scrape; `get`, `clock`, `sleep` are replaceable so a test drives it without a server."""
    rows, history = [], []
    busy_seen, idle_since = False, None
    t0 = clock()
    while True:
        t = clock() - t0
        if t > duration:
            break
        row = {"series": label, "t_s": round(t, 3)}
        try:
            r = series.reading(get(url))
        except (OSError, urllib.error.URLError, series.ExpositionError) as exc:
            rows.append({**row, "ok": False, "error": cli._one_line(str(exc))})
        else:
            history.append((t, r))
            old = next((h for h in history if h[0] >= t - window), history[-1])
            p99 = series.window_quantile(0.99, old[1], r) if old[1] is not r else None
            rows.append({**row, "ok": True, **r, "ttft_p99_window_ms": None if p99 is None else round(p99 * 1e3, 1)})
            if r["num_requests_waiting"] + r["num_requests_running"] > 0:
                busy_seen, idle_since = True, None
            elif busy_seen and idle_since is None:
                idle_since = t
            if idle_s is not None and idle_since is not None and t - idle_since >= idle_s:
                break
        sleep(max(0.0, interval - (clock() - t0 - t)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    common.check_output_flags(p, a)
    if a.record and not a.machine:
        cli.reject(p, "--machine", "--record needs the server's GPU name, e.g. --machine 'NVIDIA H200'")
    if not a.series.strip():
        cli.reject(p, "--series", "expected a label, got an empty string")
    url = a.base_url.rstrip("/") + "/metrics"
    if not url.startswith(("http://", "https://")):
        cli.reject(p, "--base-url", f"expected http://host:port, got {a.base_url!r}")
    rows = poll(url, a.interval, a.duration, a.window, a.series.strip(), a.stop_when_idle)
    good = [r for r in rows if r["ok"]]
    print(f"{len(good)}/{len(rows)} scrapes of {url} read", file=sys.stderr)
    if good:
        last = good[-1]
        print(f"last: waiting {last['num_requests_waiting']:g}, running {last['num_requests_running']:g}, "
              f"KV {last['kv_cache_usage_perc']:.1%}, TTFT p99 (last {a.window:g} s) {last['ttft_p99_window_ms']} ms")
    run = {"date": common.today(), "interval_s": a.interval, "window_s": a.window, "url_path": "/metrics"}
    if a.record and not good:
        return cli.fail(f"no scrape of {url} succeeded; nothing recorded")
    return common.write(a, "scrape", rows, common.SCRAPE_FILE, "observe_scrape", KEY, run, common.machine_name(a, "cpu"))


if __name__ == "__main__":
    sys.exit(main())
