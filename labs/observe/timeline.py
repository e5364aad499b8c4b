"""A torch profiler trace (Chrome trace JSON) boiled down to what a reader of the kernel timeline looks for.

For each profiled engine step (a `record_function("engine_step_N")` range): how long the
step took on the host's clock, how much of it the GPU was busy, where the idle time sits
(before the first kernel: scheduling and input building; between kernels: launch gaps;
after the last: the host waiting, sampling and updating), and which kernels the busy time
went to. A trace of a few steps of an 8B model is megabytes; this summary is a few hundred
bytes and is what gets recorded. Standard library only.
"""

from __future__ import annotations

import re
from collections import defaultdict

STEP = re.compile(r"^engine_step_(\d+)$")
GAP_US = 2.0  # idle stretches shorter than this between kernels are not counted as gaps


class TraceError(ValueError):
    """The trace lacks what the summary needs (no step ranges)."""


def short_name(name: str, limit: int = 48) -> str:
    """A kernel's name without template arguments or a signature, cut to `limit` characters."""
    base = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    base = base.replace("void ", "")
    return base if len(base) <= limit else base[: limit - 1] + "…"


def _merge(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def self_times(ops) -> dict[str, float]:
    """Self time (µs) per op name: its duration minus its children's, nesting found per thread."""
    by_tid = defaultdict(list)
    for e in ops:
        by_tid[e.get("tid")].append(e)
    out: dict[str, float] = defaultdict(float)
    for evs in by_tid.values():
        stack: list[list] = []  # [end, name, child_total]
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1][0]:
                end, name, kids, dur = stack.pop()
                out[name] += dur - kids
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], 0.0, e["dur"]])
        while stack:
            end, name, kids, dur = stack.pop()
            out[name] += dur - kids
    return dict(out)


def summarise(trace: dict, top: int = 6) -> dict:
    """The summary of every step range in the trace, averaged over steps; see the module docstring."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    steps = sorted((e for e in events if STEP.match(str(e.get("name", ""))) and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    if not steps:
        raise TraceError("no engine_step_N ranges (record_function) in the trace")
    kernels = [e for e in events if e.get("cat") == "kernel"]
    # Kernels launch through the runtime API (cudaLaunchKernel, cudaGraphLaunch) or the driver API
    # (cuLaunchKernel: Triton's launcher); the profiler files them under two categories, counted apart.
    launches = [e for e in events if e.get("cat") == "cuda_runtime"]
    driver_launches = [e for e in events if e.get("cat") == "cuda_driver" and str(e.get("name", "")).startswith("cuLaunch")]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    n = len(steps)
    wall = busy = head = inside = tail = 0.0
    n_kernels = n_gaps = 0
    largest = (0.0, None, None)
    names: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for i, st in enumerate(steps):
        s0, s1 = st["ts"], st["ts"] + st["dur"]
        # a kernel belongs to the step whose host range launched it: it starts after the step began and
        # before the next one began (the GPU runs behind the host)
        nxt = steps[i + 1]["ts"] if i + 1 < n else float("inf")
        ks = sorted((k for k in kernels if s0 <= k["ts"] < nxt), key=lambda k: k["ts"])
        wall += st["dur"]
        if not ks:
            head += st["dur"]
            continue
        merged = _merge([(k["ts"], k["ts"] + k["dur"]) for k in ks])
        b = sum(e - s for s, e in merged)
        busy += b
        n_kernels += len(ks)
        head += max(0.0, merged[0][0] - s0)
        tail += max(0.0, s1 - merged[-1][1])
        for (a0, a1), (b0, _) in zip(merged, merged[1:]):
            gap = b0 - a1
            inside += gap
            if gap >= GAP_US:
                n_gaps += 1
            if gap > largest[0]:
                before = max((k for k in ks if k["ts"] + k["dur"] <= b0), key=lambda k: k["ts"] + k["dur"])
                after = min((k for k in ks if k["ts"] >= b0), key=lambda k: k["ts"])
                largest = (gap, short_name(before["name"]), short_name(after["name"]))
        for k in ks:
            c = names[short_name(k["name"])]
            c[0] += 1
            c[1] += k["dur"]
    total_k = sum(v[1] for v in names.values()) or 1.0
    if kernels:
        ranked = sorted(names.items(), key=lambda kv: -kv[1][1])[:top]
        top_rows = [{"name": k, "calls_per_step": round(v[0] / n, 1), "us_per_step": round(v[1] / n, 1),
                     "share": round(v[1] / total_k, 3)} for k, v in ranked]
    else:  # a CPU run: the ops' self time is what there is
        st_ops = self_times([o for o in ops if any(s["ts"] <= o["ts"] < s["ts"] + s["dur"] for s in steps)])
        total = sum(st_ops.values()) or 1.0
        ranked = sorted(st_ops.items(), key=lambda kv: -kv[1])[:top]
        top_rows = [{"name": short_name(k), "calls_per_step": None, "us_per_step": round(v / n, 1),
                     "share": round(v / total, 3)} for k, v in ranked]
    launch_us = sum(e["dur"] for e in launches if str(e.get("name", "")).startswith(("cudaLaunchKernel",
                                                                                     "cudaGraphLaunch", "cuLaunch")))
    return {
        "steps": n, "step_us": round(wall / n, 1), "gpu_busy_us": round(busy / n, 1),
        "gpu_busy_share": round(busy / wall, 3) if wall else None,
        "idle_before_first_kernel_us": round(head / n, 1), "idle_between_kernels_us": round(inside / n, 1),
        "idle_after_last_kernel_us": round(tail / n, 1),
        "kernels_per_step": round(n_kernels / n, 1), "gaps_per_step": round(n_gaps / n, 1),
        "largest_gap_us": round(largest[0], 1), "largest_gap_between": [largest[1], largest[2]],
        "launch_calls_per_step": round(sum(1 for e in launches if str(e.get("name", "")).startswith(
            ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunch"))) / n, 1),
        "launch_us_per_step": round(launch_us / n, 1),
        "driver_launch_calls_per_step": round(len(driver_launches) / n, 1), "top": top_rows,
    }
