"""Run every GPU test and lab benchmark on this machine, with all logs in one folder.

    python -m labs.run_all --out results/h200-2026-11-29
    python -m labs.run_all --list                      # what would run; needs no GPU
    python -m labs.run_all --out DIR --only gpu-tests  # one step

Why one command: a GPU box is rented by the hour, and a result is only worth
recording with the hardware, versions and date beside it. This runs the steps
in STEPS one after another, each in its own process with its output in
`DIR/logs/<step>.log`, the benchmarks writing their files under `DIR/<step>/`,
and writes `DIR/summary.json` (machine, versions, date, and per step its
command, exit code and duration).

The steps are the GPU test suite (`pytest -m gpu` with LABS_REQUIRE_GPU=1, so a
GPU test that skips counts as a failure) and each lab's benchmark or check CLI.
A lab still being written is listed as "not present" instead of failing the run.

Exit codes: 0 when every step that ran passed, 1 when one failed or timed out,
2 on bad input or when no CUDA GPU is visible.

Only the standard library is imported here: the CUDA probe runs torch in a
child process, so this process never holds GPU memory that the benchmarks need.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labs import cli

ROOT = Path(__file__).resolve().parent.parent

# Exit codes (module docstring).
OK, FAILED, BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class Step:
    """One command of the run. `{out}` in args becomes this step's output folder."""

    name: str
    module: str  # run as `python -m <module>`; its absence means "not present"
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""


# The run, in order. Tests first: a failing kernel makes its benchmark numbers meaningless.
# --8<-- [start:steps]
STEPS: tuple[Step, ...] = (
    Step("gpu-tests", "pytest",
         ("-m", "gpu", "-ra", "--junitxml", "{out}/junit.xml"),
         env={"LABS_REQUIRE_GPU": "1"},
         what="every test marked gpu; a skipped GPU test fails"),
    Step("paged-attention-bench", "labs.paged_attention.bench",
         ("--out", "{out}"),
         what="Triton PagedAttention decode kernel vs a contiguous-cache baseline"),
    Step("kv-sizing-check", "labs.kv_sizing.check",
         ("--out", "{out}"),
         what="allocates the KV pool the calculator predicts and compares bytes"),
    Step("oom-scenarios", "labs.oom",
         ("--scenario", "all", "--out", "{out}"),
         what="reproduces and diagnoses the out-of-memory scenarios"),
    Step("engine-smoke", "labs.engine",
         ("--model", "llama-3.1-8b", "--num-prompts", "32", "--prompt-len", "256", "--max-tokens", "64",
          "--max-model-len", "1024", "--json"),
         what="the serving engine at Llama-3.1-8B shapes (random weights): runs, and its decode step time"),
    Step("cuda-execution-bench", "labs.cuda_execution",
         ("--out", "{out}"),
         what="SIMT divergence and occupancy (registers, block size, shared memory), CUDA via load_inline"),
    Step("cuda-memory-bench", "labs.cuda_memory",
         ("--out", "{out}"),
         what="coalesced, strided and scattered reads; tiled transpose; shared-memory bank conflicts"),
    Step("triton-tutorial-bench", "labs.triton_tutorial",
         ("--out", "{out}"),
         what="Triton vector add, fused softmax and tiled matmul against torch"),
    Step("parallel-gemm-shards", "labs.parallel.gemm_shards",
         ("--out", "{out}"),
         what="per-rank GEMMs at TP = 1, 2, 4, 8 shard shapes and the TP speedup they predict"),
    Step("roofline-lab", "labs.roofline_lab",
         ("--out", "{out}"),
         what="bf16 and fp8 GEMM against M, the measured ridge, paged decode attention's intensity"),
    Step("flash-attention-bench", "labs.flash_attention",
         ("--out", "{out}"),
         what="naive attention vs a Triton FlashAttention kernel vs torch SDPA over sequence lengths"),
    Step("cuda-graphs-bench", "labs.cuda_graphs",
         ("--out", "{out}"),
         what="a decode step and a prefill eager vs CUDA graph; a fused add + RMSNorm"),
    Step("long-context-decode", "labs.long_context.decode_bench",
         ("--out", "{out}"),
         what="paged decode attention time against context, 4K to 128K, bf16 and fp8 KV"),
    Step("lora-bench", "labs.lora.bench",
         ("--out", "{out}"),
         what="many LoRA adapters in one batch: per-adapter loop vs segmented shrink/expand Triton kernels"),
    Step("observe-tune", "labs.observe.tune",
         ("--model", "llama-3.1-8b", "--requests", "48", "--rate-scale", "4", "--length-scale", "0.25",
          "--slo", "ttft:200", "tpot:30", "--max-run-s", "6", "--budget-s", "120", "--out", "{out}"),
         what="the stored trace at one knob per setting against a TTFT and TPOT SLO: goodput, binding constraint"),
)
# --8<-- [end:steps]
STEP_NAMES = tuple(step.name for step in STEPS)


# ---------------------------------------------------------------------------
# Helper functions
# ---------------------------------------------------------------------------


def is_present(step: Step) -> bool:
    """Whether `python -m <module>` can run: the module exists, or the package has a __main__.

    An empty folder is a namespace package to Python, so a lab whose folder exists
    but whose CLI is not written yet counts as not present.
    """
    try:
        spec = importlib.util.find_spec(step.module)
        if spec is None:
            return False
        if spec.submodule_search_locations is not None:  # a package: needs __main__.py
            return importlib.util.find_spec(step.module + ".__main__") is not None
        return True
    except ModuleNotFoundError:  # a parent package is missing
        return False


# Run in a child so that this process never initialises CUDA.
_PROBE = """
import json, platform
out = {"python": platform.python_version()}
try:
    import torch
except ImportError:
    out["error"] = "torch is not installed: pip install -e '.[test,labs]'"
else:
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    if not torch.cuda.is_available():
        out["error"] = (
            "no CUDA GPU visible: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}). "
            "The GPU tests and benchmarks need one; on a CPU-only machine run "
            "`python -m pytest` instead (Triton kernels run in the interpreter)."
        )
    else:
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            import triton
            out["triton"] = triton.__version__
        except ImportError:
            out["triton"] = None
print(json.dumps(out))
"""


def probe_machine() -> dict:
    """Python, torch, CUDA and GPU names, or {'error': ...} when the run cannot happen."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": f"the CUDA probe failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"}
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if "error" not in info:
        info["driver"] = _nvidia_smi_driver()
    return info


def _nvidia_smi_driver() -> str | None:
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else None


def command_of(step: Step, step_out: Path) -> list[str]:
    return [sys.executable, "-m", step.module, *(a.replace("{out}", str(step_out)) for a in step.args)]


def run_step(step: Step, out: Path, timeout_s: float) -> dict:
    """Run one step with its output in logs/<name>.log; return what summary.json records."""
    step_out = out / step.name
    step_out.mkdir(parents=True, exist_ok=True)
    log_path = out / "logs" / f"{step.name}.log"
    cmd = command_of(step, step_out)
    env = dict(os.environ, **step.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    record = {"step": step.name, "command": cmd, "env": step.env, "log": str(log_path.relative_to(out)),
              "output_dir": str(step_out.relative_to(out))}
    start = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
            record["exit_code"] = proc.returncode
            record["status"] = "passed" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            record["exit_code"] = None
            record["status"] = "timed out"
            log.write(f"\n[run_all] killed after {timeout_s:.0f} s (--timeout)\n")
    record["seconds"] = round(time.monotonic() - start, 1)
    return record


def _table(records: list[dict]) -> str:
    lines = [f"{'step':<24} {'status':<12} {'seconds':>8}  log"]
    for r in records:
        seconds = f"{r['seconds']:.1f}" if "seconds" in r else "-"
        lines.append(f"{r['step']:<24} {r['status']:<12} {seconds:>8}  {r.get('log', '-')}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m labs.run_all",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Steps, in order:\n" + "\n".join(f"  {s.name:<24} {s.what}" for s in STEPS),
    )
    p.add_argument("--out", type=cli.output_dir, metavar="DIR",
                   help="folder for logs, benchmark files and summary.json; created if missing (required unless --list)")
    p.add_argument("--only", action="append", choices=STEP_NAMES, metavar="STEP",
                   help=f"run only this step; repeat for several (one of: {', '.join(STEP_NAMES)})")
    p.add_argument("--timeout", type=cli.finite_float(0.0, 86400.0, lo_open=True, unit="seconds"),
                   default=1800.0, metavar="SECONDS",
                   help="wall-clock limit per step, at most a day; a step past it is killed and counted as failed "
                        "(default: %(default)s)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow --out to be a folder that already has files in it (they are overwritten)")
    p.add_argument("--list", action="store_true",
                   help="print the steps, whether each lab is present, and their commands; run nothing")
    return p


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    steps = [s for s in STEPS if not args.only or s.name in args.only]

    if args.list:
        out = args.out or Path("DIR")
        for s in steps:
            state = "present" if is_present(s) else "not present"
            print(f"{s.name:<24} {state:<12} {' '.join(command_of(s, out / s.name)[1:])}")
        return OK

    if args.out is None:
        return _fail("--out DIR is required (the folder the logs and results go to)")
    out: Path = args.out.resolve()
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        return _fail(f"--out {args.out} is not empty; pass --overwrite or choose a new folder")

    machine = probe_machine()
    if "error" in machine:
        return _fail(machine["error"])

    (out / "logs").mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"GPU: {', '.join(machine['gpus'])} | torch {machine['torch']} (CUDA {machine['torch_cuda']}) "
          f"| triton {machine['triton']} | driver {machine['driver']}")
    records = []
    for s in steps:
        if not is_present(s):
            records.append({"step": s.name, "status": "not present", "module": s.module})
            print(f"[{s.name}] not present: no module {s.module}; skipped")
            continue
        print(f"[{s.name}] running: {s.what}", flush=True)
        record = run_step(s, out, args.timeout)
        records.append(record)
        print(f"[{s.name}] {record['status']} in {record['seconds']:.1f} s (log: {out / record['log']})", flush=True)

    summary = {
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "steps": records,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print()
    print(_table(records))
    print(f"\nsummary: {out / 'summary.json'}")
    ran = [r for r in records if r["status"] != "not present"]
    if not ran:
        return _fail("none of the selected steps is present in labs/")
    return OK if all(r["status"] == "passed" for r in ran) else FAILED


if __name__ == "__main__":
    sys.exit(main())
