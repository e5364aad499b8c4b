"""A torch profiler trace of a few engine steps, recorded as a small summary: `python -m labs.observe.profile`.

    python -m labs.observe.profile --model llama-3.1-8b --batch 32 --context 1024 --out out/profile
    python -m labs.observe.profile --tiny --device cpu --batch 4 --context 64 --out out/profile   # a smoke run

Three cases, each profiled for --steps steps after two untimed ones: decode with CUDA
graphs, decode eager (the same batch, every kernel launched from Python), and a mixed step
(a --chunk-token prefill chunk beside the decodes). The profiler records CPU and CUDA
activity without stacks or shapes; the eager case is profiled a second time with
`with_stack=True, record_shapes=True` only to measure what those options cost in trace
size. Each trace is summarised (labs/observe/timeline.py) and deleted; --keep-traces keeps
the gzipped files in --out.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from labs import cli
from labs.observe import common, timeline

KEY = ("case",)
CASES = ("decode, CUDA graphs", "decode, eager", "mixed: prefill chunk + decodes")


def parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.observe.profile", description=__doc__.split("\n\n")[0])
    common.add_engine_flags(p)
    p.add_argument("--batch", type=cli.bounded_int(1, 1024), default=32, help="decoding sequences (default: 32)")
    p.add_argument("--context", type=cli.bounded_int(8, 32768, "tokens"), default=1024,
                   help="their prompt length (default: 1024)")
    p.add_argument("--chunk", type=cli.bounded_int(16, 32768, "tokens"), default=2048,
                   help="max_num_batched_tokens of the mixed case (default: 2048)")
    p.add_argument("--steps", type=cli.bounded_int(1, 20), default=3, help="profiled steps per case (default: 3)")
    p.add_argument("--keep-traces", action="store_true", help="keep the gzipped Chrome traces in --out")
    common.add_output_flags(p, common.PROFILE_FILE)
    return p


def _start(llm, batch: int, context: int, max_tokens: int) -> None:
    """`batch` requests of `context` prompt tokens, prefilled, so the next steps decode them."""
    from labs.engine.sequence import SamplingParams

    for i in range(batch):
        llm.add_request([(7 * i + j) % 256 for j in range(context)], SamplingParams(max_tokens=max_tokens,
                                                                                    ignore_eos=True))
    while any(s.num_computed < s.num_prompt_tokens for s in llm.scheduler.running) or llm.scheduler.waiting:
        llm.step()


def _profile(torch, llm, steps: int, out_dir: Path, name: str, detailed: bool = False) -> tuple[dict, int]:
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if llm.device.type == "cuda" else [])
    for _ in range(2):
        llm.step()
    with profile(activities=acts, record_shapes=detailed, with_stack=detailed) as prof:
        for i in range(steps):
            with record_function(f"engine_step_{i}"):
                llm.step()
        if llm.device.type == "cuda":
            torch.cuda.synchronize()
    path = out_dir / f"{name}.json"
    prof.export_chrome_trace(str(path))
    size = path.stat().st_size
    summary = timeline.summarise(json.loads(path.read_text()))
    return summary, size, path


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    common.check_output_flags(p, a)
    import torch

    device = common.pick_device(p, a)
    from labs.engine.config import ConfigError

    long_prompt = (a.steps + 3) * a.chunk  # every warm and profiled step of the mixed case gets a full chunk
    max_len = max(a.context + 80, long_prompt + 8)
    blocks = a.batch * -(-(a.context + 80) // 16) + -(-(long_prompt + 8) // 16) + 8
    engine = dict(max_model_len=max_len, max_num_seqs=a.batch + 1, max_num_batched_tokens=a.chunk,
                  enable_prefix_caching=False, num_blocks=blocks)
    try:
        llm = common.open_engine(a, device, **engine)
    except ConfigError as exc:
        return cli.fail(str(exc))
    cases = CASES if device == "cuda" else CASES[1:]
    rows = []
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            t = time.perf_counter()
            llm._cuda_graphs = device == "cuda" and case != "decode, eager"
            llm.reconfigure(**engine)
            _start(llm, a.batch, a.context, max_tokens=64)
            if case.startswith("mixed"):
                from labs.engine.sequence import SamplingParams

                seq, out = llm.add_request([5] * long_prompt, SamplingParams(max_tokens=2, ignore_eos=True))
                if seq is None:
                    return cli.fail(f"the mixed case's prompt was refused: {out.error}")
            summary, size, path = _profile(torch, llm, a.steps, Path(tmp), f"case{len(rows)}")
            row = {"case": case, "ok": True, "batch": a.batch, "context": a.context,
                   "chunk": a.chunk if case.startswith("mixed") else None, "trace_bytes": size,
                   "trace_bytes_per_step": size // a.steps, **summary}
            if case == "decode, eager":
                _, big, _ = _profile(torch, llm, a.steps, Path(tmp), "detailed", detailed=True)
                row["trace_bytes_with_stack_and_shapes"] = big
            if a.keep_traces:
                with open(path, "rb") as src, gzip.open(Path(a.out) / f"{path.stem}.json.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
            rows.append(row)
            print(f"{case:>32}: step {row['step_us'] / 1e3:.2f} ms, GPU busy {row['gpu_busy_share'] or 0:.0%}, "
                  f"{row['kernels_per_step']:g} kernels, {row['gaps_per_step']:g} gaps >= {timeline.GAP_US:g} us, "
                  f"largest {row['largest_gap_us']:g} us; trace {size / 2**20:.1f} MiB "
                  f"({time.perf_counter() - t:.1f} s)", flush=True)
            for k in row["top"]:
                print(f"{'':>34}{k['share']:6.1%}  {k['us_per_step']:9.1f} us  {k['name']}")
    run = {"date": common.today(), "model": common.model_label(a), "device": device,
           "torch": torch.__version__, "steps": a.steps, "profiler": "torch.profiler, CPU+CUDA, no stacks or shapes"}
    return common.write(a, "profile", rows, common.PROFILE_FILE, "observe_profile", KEY, run,
                        common.machine_name(a, device))


if __name__ == "__main__":
    sys.exit(main())
