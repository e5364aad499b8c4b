"""The CUDA-graphs lab: a decode step and a prefill, eager against captured; fused against unfused.

For each variant: launches per step (CPU-side launch calls counted by torch.profiler),
kernels per step, wall time per step (synchronised, mean over --reps steps), and the
GPU-busy fraction (kernel time per step from the profiler over wall time per step).
The fused pair is the residual add + RMSNorm alone, at a decode row count and a
prefill row count. Everything here but `run` and the profiler call is plain Python:
the CPU tests feed it fake events and timings.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass

EXPERIMENTS = ("step", "fusion")
MODEL = "qwen3-4b"  # shapes from labs/data/models.yaml
LAYERS = 8
DECODE_BATCH = 1
DECODE_CONTEXT = 1024
PREFILL_TOKENS = 4096
FUSION_ROWS = (1, 16384)
# Attention and matmuls in bf16 accumulate in fp32; the graph replays the same kernels, so
# captured and eager outputs agree to the last bit in practice. The bound allows reordering.
MATCH_REL_ERR = 1e-2

# Names of the CUDA runtime / driver calls that put work on the GPU: what "a launch" counts.
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")


@dataclass(frozen=True)
class Event:
    name: str
    on_device: bool  # a kernel (or memcpy/memset) as the GPU ran it
    duration_us: float


def profile_summary(events: list[Event], steps: int) -> dict:
    """Launch calls, kernels and kernel time per step from a profile of `steps` steps."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    launches = sum(1 for e in events if not e.on_device and e.name.startswith(LAUNCH_CALLS))
    graph_launches = sum(1 for e in events if not e.on_device and e.name.startswith("cudaGraphLaunch"))
    kernels = [e for e in events if e.on_device]
    return {"launches": launches / steps, "graph_launches": graph_launches / steps,
            "kernels": len(kernels) / steps, "kernel_us": sum(e.duration_us for e in kernels) / steps}


def row(variant: str, phase: str, tokens: int, step_us: float, prof: dict) -> dict:
    busy = prof["kernel_us"] / step_us if prof["kernels"] else None
    return {"variant": variant, "phase": phase, "tokens": tokens, "step_us": round(step_us, 1),
            "launches": round(prof["launches"], 1), "kernels": round(prof["kernels"], 1),
            "kernel_us": round(prof["kernel_us"], 1),
            "gpu_busy": None if busy is None else round(min(busy, 1.0), 3)}


def with_speedup(rows: list[dict]) -> list[dict]:
    """Each row's eager time over its own time, against the eager row of the same phase."""
    base = {r["phase"]: r["step_us"] for r in rows if r["variant"] == "eager"}
    return [{**r, "vs_eager": round(base[r["phase"]] / r["step_us"], 2) if r["phase"] in base else None}
            for r in rows]


HEADER = (f"{'phase':<8} {'variant':<14} {'tokens':>6} {'step us':>9} {'vs eager':>8} {'launches':>8} "
          f"{'kernels':>7} {'kernel us':>9} {'GPU busy':>8}")


def format_row(r: dict) -> str:
    busy = "—" if r["gpu_busy"] is None else f"{r['gpu_busy']:.2f}"
    vs = "—" if r.get("vs_eager") is None else f"{r['vs_eager']:.2f}"
    return (f"{r['phase']:<8} {r['variant']:<14} {r['tokens']:>6} {r['step_us']:>9.1f} {vs:>8} "
            f"{r['launches']:>8.1f} {r['kernels']:>7.1f} {r['kernel_us']:>9.1f} {busy:>8}")


FUSION_HEADER = f"{'rows':>6} {'hidden':>6} {'unfused us':>10} {'fused us':>9} {'speedup':>7} {'fused GB/s':>10} {'kernels':>9}"


def fusion_row(rows: int, hidden: int, unfused_us: float, fused_us: float, nbytes: int, unfused_kernels: float,
               fused_kernels: float) -> dict:
    return {"rows": rows, "hidden": hidden, "unfused_us": round(unfused_us, 2), "fused_us": round(fused_us, 2),
            "speedup": round(unfused_us / fused_us, 2), "fused_gb_s": round(nbytes / fused_us / 1e3, 1),
            "unfused_kernels": round(unfused_kernels, 1), "fused_kernels": round(fused_kernels, 1)}


def format_fusion_row(r: dict) -> str:
    return (f"{r['rows']:>6} {r['hidden']:>6} {r['unfused_us']:>10.1f} {r['fused_us']:>9.1f} {r['speedup']:>7.2f} "
            f"{r['fused_gb_s']:>10.1f} {r['unfused_kernels']:>4.0f} → {r['fused_kernels']:.0f}")


def config_name(experiment: str, r: dict) -> str:
    return f"{r['phase']}-{r['variant']}" if experiment == "step" else f"rows-{r['rows']}"


def printed(sections: dict) -> dict[str, str]:
    out = {}
    if sections.get("step"):
        out["step"] = "\n".join([HEADER, *map(format_row, sections["step"])])
    if sections.get("fusion"):
        out["fusion"] = "\n".join([FUSION_HEADER, *map(format_fusion_row, sections["fusion"])])
    return out


# ---------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------


def wall_us(torch, fn, reps: int, warmup: int = 3) -> float:
    """Mean wall time of one call over `reps` back-to-back calls, synchronised at both ends."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = _time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (_time.perf_counter() - t0) / reps * 1e6


def profiled(torch, fn, steps: int) -> dict:
    """profile_summary of `steps` calls of fn, from torch.profiler's CPU and CUDA events."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = [Event(e.name, e.device_type == DeviceType.CUDA, e.time_range.elapsed_us()) for e in prof.events()]
    return profile_summary(events, steps)


def _rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_step(torch, reps: int, log=print) -> tuple[list[dict], list[dict]]:
    """Decode at B = DECODE_BATCH and one prefill, eager and captured, unfused and fused norms."""
    from labs.cuda_graphs.stack import Captured, Shapes, Stack
    from labs.specs import get_model

    shapes = Shapes.of(get_model(MODEL), LAYERS)
    rows, failed = [], []
    g = torch.Generator(device="cuda").manual_seed(1)
    for phase, tokens in (("decode", DECODE_BATCH), ("prefill", PREFILL_TOKENS)):
        decode = phase == "decode"
        x = torch.randn(tokens, shapes.hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        for fused in (False, True):
            stack = Stack(shapes, DECODE_CONTEXT, DECODE_BATCH, fused=fused)
            eager = stack.forward(x, decode)
            for captured in (False, True):
                variant = ("graph" if captured else "eager") + ("+fused" if fused else "")
                try:
                    if captured:
                        cap = Captured(lambda inp: stack.forward(inp, decode), x.clone())
                        err = _rel_err(cap.replay(), eager)
                        if not err <= MATCH_REL_ERR:
                            raise AssertionError(f"{phase} {variant}: graph replay differs from eager by "
                                                 f"{err:.3g} (bound {MATCH_REL_ERR})")
                        fn = cap.replay
                    else:
                        fn = lambda: stack.forward(x, decode)  # noqa: E731
                    step = wall_us(torch, fn, reps)
                    prof = profiled(torch, fn, min(reps, 5))
                except AssertionError:
                    raise
                except Exception as e:  # a variant that cannot run is reported, the rest recorded
                    failed.append({"experiment": "step", "variant": f"{phase}-{variant}", "error": f"{type(e).__name__}: {e}"[:300]})
                    log(f"{phase:<8} {variant:<14} failed: {type(e).__name__}: {e}")
                    continue
                r = row(variant, phase, tokens, step, prof)
                rows.append(r)
            del stack
    rows = with_speedup(rows)
    for r in rows:
        log(format_row(r))
    return rows, failed


def run_fusion(torch, reps: int, log=print) -> tuple[list[dict], list[dict]]:
    from labs.cuda_graphs.fused import fused_add_rmsnorm, rmsnorm_bytes, unfused_add_rmsnorm
    from labs.specs import get_model

    hidden = get_model(MODEL).hidden_size
    out, failed = [], []
    g = torch.Generator(device="cuda").manual_seed(2)
    log(FUSION_HEADER)
    for n in FUSION_ROWS:
        x, res = (torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        try:
            (y1, h1), (y0, h0) = fused_add_rmsnorm(x, res, w), unfused_add_rmsnorm(x, res, w)
            err = max(_rel_err(y1, y0), _rel_err(h1, h0))
            if not err <= MATCH_REL_ERR:
                raise AssertionError(f"fused add+RMSNorm at {n} rows differs from torch by {err:.3g}")
            t_un = wall_us(torch, lambda: unfused_add_rmsnorm(x, res, w), reps * 5)
            t_fu = wall_us(torch, lambda: fused_add_rmsnorm(x, res, w), reps * 5)
            k_un = profiled(torch, lambda: unfused_add_rmsnorm(x, res, w), 5)["kernels"]
            k_fu = profiled(torch, lambda: fused_add_rmsnorm(x, res, w), 5)["kernels"]
        except AssertionError:
            raise
        except Exception as e:
            failed.append({"experiment": "fusion", "variant": f"rows-{n}", "error": f"{type(e).__name__}: {e}"[:300]})
            log(f"{n:>6} failed: {type(e).__name__}: {e}")
            continue
        r = fusion_row(n, hidden, t_un, t_fu, rmsnorm_bytes(n, hidden), k_un, k_fu)
        out.append(r)
        log(format_fusion_row(r))
    return out, failed


def run(torch, reps: int, experiments: tuple[str, ...], log=print) -> tuple[dict, list[dict]]:
    """{experiment: rows} and the variants that failed to run; raises AssertionError on a wrong result."""
    sections, failed = {}, []
    if "step" in experiments:
        log(HEADER)
        rows, f = run_step(torch, reps, log)
        sections["step"], failed = rows, failed + f
    if "fusion" in experiments:
        rows, f = run_fusion(torch, reps, log)
        sections["fusion"], failed = rows, failed + f
    return {k: v for k, v in sections.items() if v}, failed
