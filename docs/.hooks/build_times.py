"""How long the strict site build takes, cold and warm: `python docs/.hooks/build_times.py`.

Cold: the build's caches of plots and lab output are empty (the pinned KaTeX
and Mermaid tarballs stay: fetching them is the network's time, not the
build's). Warm: the same build again, with those caches filled by the cold one.
Both run `mkdocs build --strict` in a subprocess into a temporary folder, with
a temporary cache folder (LLM_BANK_CACHE_DIR), so your own cache and site are
left alone. Prints one line per build and exits 1 if the warm build is not
under the target (10 s by default).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import assets  # noqa: E402  (the build's cache folder)

BUILT_CACHES = ("plots", "lab-output")  # what the build itself caches; the rest is downloaded once


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build(site: Path, cache: Path) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one strict build (the build is single-threaded: on an idle
    machine the two agree; on a busy one the CPU time is the figure to compare)."""
    env = {**os.environ, "LLM_BANK_CACHE_DIR": str(cache), "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("SITE_URL", None)
    start, cpu = time.perf_counter(), _child_cpu()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - start, _child_cpu() - cpu
    if proc.returncode != 0:
        sys.exit(f"mkdocs build --strict failed:\n{proc.stderr[-3000:]}")
    return seconds, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=float, default=10.0, help="warm-build target in seconds (default 10)")
    parser.add_argument("--warm-runs", type=int, default=2, help="warm builds to time; the fastest counts")
    args = parser.parse_args(argv)
    if args.warm_runs < 1:
        parser.error("--warm-runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="build-times-") as tmp:
        cache = Path(tmp) / "cache"
        source = assets.cache_dir()
        if source.is_dir():
            shutil.copytree(source, cache, ignore=lambda d, names: [n for n in names if
                                                                 Path(d) == source and n in BUILT_CACHES])
        site = Path(tmp) / "site"
        load = os.getloadavg()[0]
        cold, cold_cpu = build(site, cache)
        print(f"cold build (no cached plots or lab output): {cold:5.1f} s wall, {cold_cpu:5.1f} s CPU")
        warm, warm_cpu = min(build(site, cache) for _ in range(args.warm_runs))
        print(f"warm build (caches filled, best of {args.warm_runs}):    {warm:5.1f} s wall, {warm_cpu:5.1f} s CPU "
              f"(target under {args.target:g} s)")
    print(f"{os.cpu_count()} CPU cores; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    return 0 if warm < args.target else 1


if __name__ == "__main__":
    raise SystemExit(main())
