"""Benchmark the paged decode kernel against the bytes floor and against SDPA.

Run:

    python -m labs.paged_attention.bench                      # check, then time every shape
    python -m labs.paged_attention.bench --out out/pa         # ... and write out/pa/paged_attention.json
    python -m labs.paged_attention.bench --out out/pa --record  # ... and record into labs/results/
    python -m labs.paged_attention.bench --sweep --out out/pa # time tile/warps/stages/split variants
    python -m labs.paged_attention.bench --shape b32-l4k --tile-n 128 --num-warps 8  # one variant

Order of work: environment report -> build every shape -> check the kernel against the
fp32 reference (prints "all results match", or exits 1 before any timing) -> measure
the device-to-device copy bandwidth -> time each shape.

Timing: each call (kernel + reduction, or SDPA) is captured in a CUDA graph and its
replay is timed by `triton.testing.do_bench`, which clears the L2 cache before every
replay; the median is reported. The kernel is timed twice and the spread between the
two medians is kept, so a difference between versions smaller than it reads as noise.

The decode is bound by memory: per (sequence, KV head) it reads L * d * 2 (K and V)
elements and does about 4 * L * d FLOPs per query head, so ~G FLOP per byte for a group
of G query heads. The floor is KV bytes / copy bandwidth, both measured in this run.

JSON written by --out (DIR/paged_attention.json, this run only):

    {
      "schema": 1,
      "lab": "paged_attention",
      "gpus": {
        "<GPU name>": {
          "gpu": str, "compute_capability": "9.0", "sm_count": int, "driver": str,
          "torch": str, "cuda": str, "triton": str, "date": "YYYY-MM-DD",
          "copy_tb_s": float,                    # device-to-device copy_, (read + written bytes) / time, eager
          "copy_graph_tb_s": float,              # the same copy replayed from a CUDA graph (not used)
          "sdpa_backend": str,                   # which SDPA backend the default call ran
          "sdpa_kernels": [str],                 # its CUDA kernel names, from the profiler
          "max_memory_reserved_gib": float,
          "table": str,                          # the timing table main() printed: format_table(rows)
          "rows": [{
            "shape": str,                        # name in SHAPES
            "batch": int, "context_len": int, "q_heads": int, "kv_heads": int, "head_dim": int,
            "block_size": int, "dtype": "bfloat16",
            "num_splits": int, "tile_n": int, "num_warps": int, "num_stages": int,
            "kv_bytes": int,                     # K + V bytes the kernel must read
            "floor_us": float,                   # kv_bytes / copy bandwidth
            "time_us": float,                    # median, kernel + reduction
            "rerun_spread": float,               # |median2 - median1| / median1
            "tb_s": float,                       # kv_bytes / time_us
            "copy_fraction": float,              # tb_s / copy_tb_s
            "sdpa_time_us": float,               # default SDPA, same KV stored contiguously
            "ratio_to_sdpa": float,              # time_us / sdpa_time_us (< 1: faster)
            "sdpa_us_by_backend": {str: float},  # each backend that accepted the call, forced
            "rel_err": float, "sdpa_rel_err": float  # ||out - ref|| / ||ref||, fp32 reference
          }]
        }
      }
    }

--record merges the rows into labs/results/paged_attention.json through
labs/recorded.py (the format its docstring gives): one machine per GPU, one row
per shape (key "shape"), each row with `"ok": true` (a run whose check fails
records nothing) and the GPU entry above, less its rows and table, as its
`"run"`; the machine's `derived.table` is `format_table` of all its rows. A run
of some shapes replaces those rows and keeps the others. Only the kernel's
default configuration is recorded, so a row always means the same kernel.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from labs import cli

RESULTS_PATH = Path(__file__).resolve().parents[1] / "results" / "paged_attention.json"
SCHEMA_VERSION = 1
# bf16's band for a relative error against fp32 (METHOD: bf16 operands land 1e-3..1e-2).
MATCH_REL_ERR = 1e-2


@dataclass(frozen=True)
class Shape:
    batch: int
    context_len: int
    q_heads: int
    kv_heads: int
    head_dim: int = 128
    block_size: int = 16

    def __post_init__(self):
        assert self.q_heads % self.kv_heads == 0, "q_heads must be a multiple of kv_heads"
        assert self.context_len >= 1 and self.batch >= 1, "need at least one sequence of one token"


# Llama-3-8B-like attention (32 query heads, 8 KV heads, d=128) at batch and context
# sizes that serving meets, plus one multi-head (no GQA) shape.
SHAPES = {
    "b1-l4k": Shape(1, 4096, 32, 8),
    "b32-l4k": Shape(32, 4096, 32, 8),
    "b64-l4k": Shape(64, 4096, 32, 8),
    "b128-l2k": Shape(128, 2048, 32, 8),
    "b16-l32k": Shape(16, 32768, 32, 8),
    "b32-l4k-mha": Shape(32, 4096, 32, 32),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.Parser(
        prog="python -m labs.paged_attention.bench",
        description="Check the paged decode kernel against an fp32 reference, then time it "
        "against the copy-bandwidth floor and against SDPA on a contiguous cache.",
    )
    p.add_argument("--out", type=cli.output_dir, metavar="DIR", help="folder to write paged_attention.json (and sweep.json) into")
    p.add_argument("--record", action="store_true",
                   help=f"also merge this run's rows into {RESULTS_PATH.relative_to(RESULTS_PATH.parents[2])}: "
                   "the shapes timed replace their rows for this GPU, every other row stays")
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), metavar="NAME",
                   help=f"time only this shape (repeatable); one of {', '.join(SHAPES)}")
    # Triton needs power-of-2 tiles and warp counts; tl.dot needs a tile of at least 16.
    p.add_argument("--tile-n", type=cli.power_of_two(16, 1024),
                   help="tokens per loop step (power of 2, 16..1024); default: kernel's")
    p.add_argument("--num-warps", type=cli.power_of_two(1, 32), help="warps per program (power of 2, 1..32); default: kernel's")
    p.add_argument("--num-stages", type=cli.bounded_int(1, 8), help="software-pipeline depth (1..8); default: kernel's")
    p.add_argument("--programs-per-sm", type=cli.bounded_int(1, 64),
                   help="programs that fit on one SM at once, for the split heuristic (1..64); default: kernel's")
    p.add_argument("--num-splits", type=cli.bounded_int(1, 1024),
                   help="force this split count for every shape (1: no split-K; at most 1024)")
    # Bounded: a sweep times ~100 configurations per shape, each for this long.
    p.add_argument("--rep-ms", type=cli.bounded_int(1, 10_000), default=100,
                   help="do_bench repetition time per measurement, ms, 1..10000 (default 100)")
    p.add_argument("--sweep", action="store_true",
                   help="time every tile/warps/stages configuration in SWEEP_CONFIGS at every useful "
                   "split count, per shape; prints the best per shape and writes sweep.json to --out; "
                   "records nothing")
    p.add_argument("--profile", action="store_true",
                   help="only run the kernel 3 times per shape, no checks or timing (for ncu)")
    args = p.parse_args(argv)
    if args.record and args.sweep:
        p.error("--record writes the default configuration's rows; run it without --sweep")
    if args.record:
        variant = [f"--{n.replace('_', '-')}" for n in ("tile_n", "num_warps", "num_stages", "programs_per_sm",
                                                         "num_splits") if getattr(args, n) is not None]
        if variant:
            p.error(f"--record stores the kernel's default configuration; drop {', '.join(variant)} "
                    "(use --out to keep a variant's rows)")
    return args


def environment(torch, triton) -> dict:
    """GPU, compute capability, SM count, driver and versions; refuses without CUDA or bf16."""
    # Exit 2, as the other labs do on a machine that cannot run them.
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible (torch.cuda.is_available() is False); this benchmark needs one",
              file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_bf16_supported():
        print(f"error: {torch.cuda.get_device_name()} has no bf16 support; the shapes are bf16", file=sys.stderr)
        sys.exit(2)
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }


def graph_timer(torch, triton, rep_ms: int):
    """Returns time_us(fn, graph=True): median time of fn with L2 cleared before each call.

    With graph=True, fn is captured in a CUDA graph and its replay is timed, so Python and
    launch overhead stay out of the number (as in a serving engine's decode step).
    """

    def time_us(fn, graph: bool = True) -> float:
        fn()  # compile / pick algorithms outside the capture
        torch.cuda.synchronize()
        run = fn
        if graph:
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g):
                    fn()
                run = g.replay
            except RuntimeError as e:  # a library that refuses capture is timed eagerly, and says so
                print(f"  note: CUDA-graph capture failed ({str(e).splitlines()[0]}); timing eagerly")
                torch.cuda.synchronize()
        return 1e3 * triton.testing.do_bench(run, warmup=25, rep=rep_ms, return_mode="median")

    return time_us


def copy_bandwidth(torch, time_us) -> tuple[float, float]:
    """Device-to-device copy of 2 GiB, TB/s counting bytes read plus bytes written.

    Returns (eager, graph). Eager `copy_` is the ceiling used for the fractions: 4.24 TB/s
    on the H200 (2026-11-29). The same copy replayed from a CUDA graph (a memcpy node)
    read only 2.71 TB/s there, below what the decode kernel itself reads, so it is
    reported but not used; why the graph's copy is slower was not established.
    """
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)  # random: zeros can time faster
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * src.element_size()
    eager = nbytes / time_us(lambda: dst.copy_(src), graph=False) / 1e6
    graph = nbytes / time_us(lambda: dst.copy_(src), graph=True) / 1e6
    del src, dst
    return eager, graph


def sdpa_backends(torch):
    from torch.nn.attention import SDPBackend

    return {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }


def classify_kernels(names: list[str]) -> str:
    joined = " ".join(names).lower()
    for key, label in (("cudnn", "cudnn"), ("flash", "flash"), ("fmha", "efficient"), ("efficient", "efficient")):
        if key in joined:
            return label
    return "math" if names else "unknown"


def sdpa_kernel_names(torch, fn) -> list[str]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == DeviceType.CUDA and "Memcpy" not in e.name})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import triton
    from torch.nn.attention import sdpa_kernel

    from labs.paged_attention import kernel
    from labs.paged_attention.reference import gather_kv, paged_decode_ref
    from labs.paged_attention.workload import make_problem

    env = environment(torch, triton)
    print("environment:")
    for k, v in env.items():
        print(f"  {k:<20} {v}")

    names = args.shape or list(SHAPES)
    knobs = {
        "tile_n": args.tile_n or kernel.DEFAULT_TILE_N,
        "num_warps": args.num_warps or kernel.DEFAULT_NUM_WARPS,
        "num_stages": args.num_stages or kernel.DEFAULT_NUM_STAGES,
        "programs_per_sm": args.programs_per_sm or kernel.RESIDENT_PROGRAMS,
    }

    def splits_for(shape: Shape, tile_n: int, programs_per_sm: int) -> int:
        if args.num_splits:
            return args.num_splits
        return kernel.choose_num_splits(shape.batch, shape.kv_heads, shape.context_len, env["sm_count"], tile_n, programs_per_sm)

    def decode_fn(problem, shape: Shape, tile_n, num_warps, num_stages, programs_per_sm):
        ns = splits_for(shape, tile_n, programs_per_sm)
        return ns, lambda: kernel.paged_decode(
            problem.q, problem.k_cache, problem.v_cache, problem.block_tables, problem.seq_lens,
            max_seq_len=problem.max_seq_len, num_splits=ns, tile_n=tile_n,
            num_warps=num_warps, num_stages=num_stages,
        )

    # Build every shape: paged cache in random block order, and the same KV contiguous for SDPA.
    problems, dense = {}, {}
    for name in names:
        s = SHAPES[name]
        p = make_problem([s.context_len] * s.batch, s.q_heads, s.kv_heads, s.head_dim, s.block_size,
                         torch.bfloat16, "cuda", spare_blocks=64, seed=1)
        problems[name] = p
        if args.profile:
            continue
        k = torch.stack([gather_kv(p.k_cache, p.block_tables[b], s.context_len) for b in range(s.batch)])
        v = torch.stack([gather_kv(p.v_cache, p.block_tables[b], s.context_len) for b in range(s.batch)])
        # (B, L, Hkv, d) -> (B, Hkv, L, d), contiguous: a dense decode cache.
        dense[name] = (p.q.unsqueeze(2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
        del k, v

    if args.profile:
        for name in names:
            _, fn = decode_fn(problems[name], SHAPES[name], **knobs)
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        print("profile runs done")
        return 0

    def sdpa(name):
        q, k, v = dense[name]
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True)

    def rel_err(x, ref):
        return ((x.float() - ref).norm() / ref.norm()).item()

    # Check before any timing.
    errors, ok = {}, True
    for name in names:
        p = problems[name]
        ref = paged_decode_ref(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
        _, fn = decode_fn(p, SHAPES[name], **knobs)
        out = fn()
        e_ours, e_sdpa = rel_err(out, ref), rel_err(sdpa(name)().squeeze(2), ref)
        errors[name] = (e_ours, e_sdpa)
        good = bool(torch.isfinite(out).all()) and e_ours <= MATCH_REL_ERR
        ok &= good
        print(f"  check {name:<12} rel_err {e_ours:.2e} (SDPA {e_sdpa:.2e}) {'ok' if good else 'MISMATCH'}")
        del ref, out
    if not ok:
        print(f"error: kernel output differs from the fp32 reference by more than {MATCH_REL_ERR} (relative)")
        return 1
    print("all results match")

    time_us = graph_timer(torch, triton, args.rep_ms)
    copy_tb_s, copy_graph_tb_s = copy_bandwidth(torch, time_us)
    print(f"copy bandwidth: {copy_tb_s:.3f} TB/s (read + write; eager copy_), {copy_graph_tb_s:.3f} from a CUDA graph")

    if args.sweep:
        return sweep(args, names, problems, SHAPES, decode_fn, time_us, copy_tb_s, env)

    first = names[0]
    sdpa_names = sdpa_kernel_names(torch, sdpa(first))
    backend = classify_kernels(sdpa_names)
    print(f"SDPA default backend: {backend} ({', '.join(sdpa_names) or 'no kernels seen'})")

    rows = []
    print(TABLE_HEADER)
    for name in names:
        s, p = SHAPES[name], problems[name]
        ns, fn = decode_fn(p, s, **knobs)
        t1, t2 = time_us(fn), time_us(fn)
        t_sdpa = time_us(sdpa(name))
        by_backend = {}
        for label, be in sdpa_backends(torch).items():

            def forced(be=be, f=sdpa(name)):
                with sdpa_kernel([be]):
                    return f()

            try:
                with warnings.catch_warnings():  # a refusing backend warns, then raises
                    warnings.simplefilter("ignore")
                    forced()
            except RuntimeError:
                continue  # this backend does not take the call (e.g. GQA or head size)
            by_backend[label] = round(time_us(forced), 2)
        kv_bytes = p.kv_bytes()
        tb_s = kv_bytes / t1 / 1e6
        row = {
            "shape": name, **asdict(s), "dtype": str(p.q.dtype).removeprefix("torch."),
            "num_splits": ns, "tile_n": knobs["tile_n"], "num_warps": knobs["num_warps"], "num_stages": knobs["num_stages"],
            "kv_bytes": kv_bytes,
            "floor_us": round(kv_bytes / copy_tb_s / 1e6, 2),
            "time_us": round(t1, 2),
            "rerun_spread": round(abs(t2 - t1) / t1, 4),
            "tb_s": round(tb_s, 3),
            "copy_fraction": round(tb_s / copy_tb_s, 3),
            "sdpa_time_us": round(t_sdpa, 2),
            "ratio_to_sdpa": round(t1 / t_sdpa, 3),
            "sdpa_us_by_backend": by_backend,
            "rel_err": float(f"{errors[name][0]:.3g}"),
            "sdpa_rel_err": float(f"{errors[name][1]:.3g}"),
        }
        rows.append(row)
        print(format_row(row))

    entry = {
        **env,
        "copy_tb_s": round(copy_tb_s, 3),
        "copy_graph_tb_s": round(copy_graph_tb_s, 3),
        "sdpa_backend": backend,
        "sdpa_kernels": sdpa_names,
        "max_memory_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
        "table": format_table(rows),
        "rows": rows,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "paged_attention.json", {env["gpu"]: entry})
        print(f"wrote {args.out / 'paged_attention.json'}")
    if args.record:
        from labs.recorded import RecordedError

        try:
            print(record(entry))
        except RecordedError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if args.out:  # the device machine sends back only --out: keep a copy of the whole file there
            shutil.copyfile(RESULTS_PATH, args.out / "recorded_paged_attention.json")
    return 0


# The timing table as main() prints it. The same text is stored in each GPU's entry
# ("table"), so a page can show what the command printed without anyone retyping it.
TABLE_HEADER = (f"{'shape':<12} {'splits':>6} {'time us':>9} {'floor us':>9} {'TB/s':>6} {'of copy':>8} "
                f"{'SDPA us':>8} {'vs SDPA':>8} {'spread':>7}")


def format_row(row: dict) -> str:
    """One line of the timing table, from a row of the JSON entry (torch-free)."""
    return (f"{row['shape']:<12} {row['num_splits']:>6} {row['time_us']:>9.1f} {row['floor_us']:>9.1f} "
            f"{row['tb_s']:>6.2f} {row['copy_fraction']:>8.3f} {row['sdpa_time_us']:>8.1f} "
            f"{row['ratio_to_sdpa']:>8.3f} {row['rerun_spread']:>7.3f}   SDPA forced: {row['sdpa_us_by_backend']}")


def format_table(rows: list[dict]) -> str:
    """The header and one line per row, as printed; stored as the entry's "table"."""
    return "\n".join([TABLE_HEADER, *(format_row(r) for r in rows)])


def record(entry: dict, path: Path | None = None):
    """Merge one run's entry (as --out writes it) into the recorded file; returns what was kept and replaced."""
    from labs import recorded

    run = {k: v for k, v in entry.items() if k not in ("gpu", "rows", "table")}
    return recorded.record_rows(path or RESULTS_PATH, "paged_attention", recorded.Machine(entry["gpu"]),
                                [{**r, "ok": True} for r in entry["rows"]], ["shape"], run,
                                derive=lambda rows: {"table": format_table(rows)})


def write_json(path: Path, gpus: dict) -> None:
    """This run's document for --out (the recorded file goes through labs/recorded.py)."""
    doc = {"schema": SCHEMA_VERSION, "lab": "paged_attention", "gpus": dict(sorted(gpus.items()))}
    path.write_text(json.dumps(doc, indent=2) + "\n")


# Sweep space: (tile_n, num_warps, num_stages). Split counts are a runtime argument, so
# each configuration compiles twice (with and without the split path) whatever the splits.
SWEEP_CONFIGS = [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 2)]
SWEEP_SPLITS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64]


def resource_report(kernel_module) -> list[dict]:
    """Registers, spills and shared memory of every compiled variant (Triton 3.x internals)."""
    report = []
    for fn in (kernel_module.paged_decode_kernel, kernel_module.split_reduce_kernel):
        try:
            caches = fn.device_caches.values()
        except AttributeError:
            return report
        for cache in caches:
            for compiled in cache[0].values():
                md = compiled.metadata
                report.append({
                    "kernel": fn.__name__, "num_warps": md.num_warps, "num_stages": md.num_stages,
                    "shared_bytes": md.shared, "regs": getattr(compiled, "n_regs", None),
                    "spills": getattr(compiled, "n_spills", None),
                })
    return report


def sweep(args, names, problems, shapes, decode_fn, time_us, copy_tb_s, env) -> int:
    """Time every (tile_n, warps, stages) config at every useful split count, per shape."""
    from labs.paged_attention import kernel

    results = []
    for tile_n, num_warps, num_stages in SWEEP_CONFIGS:
        for name in names:
            s, p = shapes[name], problems[name]
            pairs = s.batch * s.kv_heads
            tiles = -(-s.context_len // tile_n)
            line = []
            for ns in SWEEP_SPLITS:
                if ns > tiles or pairs * ns > 16 * env["sm_count"]:
                    continue
                fn = lambda ns=ns: kernel.paged_decode(  # noqa: E731
                    p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, max_seq_len=p.max_seq_len,
                    num_splits=ns, tile_n=tile_n, num_warps=num_warps, num_stages=num_stages)
                try:
                    t = time_us(fn)
                except Exception as e:  # e.g. out of shared memory for a large tile and deep pipeline
                    print(f"  {name} tile {tile_n} w{num_warps} s{num_stages} splits {ns}: failed ({type(e).__name__})")
                    break
                frac = p.kv_bytes() / t / 1e6 / copy_tb_s
                results.append({"shape": name, "tile_n": tile_n, "num_warps": num_warps, "num_stages": num_stages,
                                "num_splits": ns, "programs": pairs * ns, "time_us": round(t, 2),
                                "copy_fraction": round(frac, 3)})
                line.append(f"{ns}:{t:.1f}")
            print(f"  tile {tile_n:>3} w{num_warps} s{num_stages} {name:<12} " + " ".join(line))
    resources = resource_report(kernel)
    for r in resources:
        print(f"  resources: {r}")
    print("best per shape:")
    for name in names:
        rows = [r for r in results if r["shape"] == name]
        if rows:
            best = min(rows, key=lambda r: r["time_us"])
            print(f"  {name:<12} {best}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps(
            {"env": env, "copy_tb_s": copy_tb_s, "resources": resources, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
