"""Measure the engine on one GPU, each figure beside the cost model's floor at rates measured in the same run.

    python -m labs.engine.bench --record                  # everything, into labs/results/engine.json
    python -m labs.engine.bench --only decode,offline      # some sections
    python -m labs.engine.bench --device cpu --layers 2 --quick --only decode   # a smoke run

The run starts by measuring the GPU's copy bandwidth and bf16 GEMM rate; every floor below
uses those two numbers (labs/roofline.py with them in place of the datasheet's), and each
row's efficiency is floor / measured (for a throughput, measured / bound).

Sections (--only):
  stages    where a decode step's time goes at B = 1 and 64 (L = 128): the whole step, the
            runner alone, the graph replay alone, the linears alone, unfused elementwise ops
  decode    decode step time vs batch at L = 128, 1,024, 8,192, CUDA graphs on and off
  offline   the stored trace (labs/data/engine_trace.yaml), every request at t = 0, at a stated
            concurrency: output tok/s against the cost model's throughput bound, and the
            serving simulator's prediction of the same run
  hf        Hugging Face generate on the same weights, same trace, same concurrency (eager,
            padded static batches)
  batching  the stored trace with its arrival times: continuous vs static batching
            (TTFT, TPOT, E2E percentiles), measured and simulated
  chunked   a 16K-token prompt arriving among 32 running decodes: worst decode gap and TTFT
            vs max_num_batched_tokens, and with chunking off
  prefix    TTFT with a shared system prompt, miss then hit, and the hit rate the block
            manager reports
  preempt   throughput and p99 latency vs max_num_seqs above what the pool holds

Every section checks the time left (--budget-s) before it starts and is skipped, with a
line saying so, when too little is left; a skipped section records nothing. Progress goes to
stderr, the rows to stdout. Random weights (seeded): timing does not depend on their values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import yaml

from labs import cli
from labs.engine.config import supported_models
from labs.recorded import RESULTS_DIR, Machine, RecordedError, record_rows

SECTIONS = ("stages", "decode", "offline", "hf", "batching", "chunked", "prefix", "preempt")
TRACE_FILE = Path(__file__).resolve().parent.parent / "data" / "engine_trace.yaml"
RESULTS_PATH = RESULTS_DIR / "engine.json"
CONTEXTS = (128, 1024, 8192)
BATCH_CAP = 1024  # the decode ladder stops here where the pool would hold more (L = 128 and 1,024)
CONCURRENCY = 64
BUDGET_TOKENS = 8192  # max_num_batched_tokens of the trace runs with arrivals (vLLM 0.33's server default on an H200)
# ... and of the offline run: vLLM 0.33's default for the LLM class on H100/H200-class GPUs
# (EngineArgs default_max_num_batched_tokens, vllm/engine/arg_utils.py)
OFFLINE_BUDGET_TOKENS = 16384
CHUNK_BUDGETS = (512, 2048, 4096, 8192, 16384)
QUICK_CHUNK_BUDGETS = (32, 64, 256)
SYSTEM_PROMPTS = (512, 2048, 8192)
# Rough seconds a section needs on an H200 (full run): it is skipped when less than this is left.
SECTION_COST_S = {"stages": 8, "decode": 30, "offline": 16, "hf": 25, "batching": 15, "chunked": 12,
                  "prefix": 6, "preempt": 15}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_trace(path: Path = TRACE_FILE) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens) per request, as stored."""
    try:
        doc = yaml.safe_load(path.read_text())
        reqs = [(float(a), int(p), int(o)) for a, p, o in doc["requests"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"error: {path}: not a trace file ({exc})")
    return reqs


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m labs.engine.bench", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", type=cli.number_list(cli.choice(SECTIONS, "section"), max_items=len(SECTIONS)),
                   default=SECTIONS, help=f"comma-separated sections (default: all of {','.join(SECTIONS)})")
    p.add_argument("--out", type=cli.output_dir, help="folder for this run's rows (bench.json), the profile "
                   "tables and, with --record, a copy of the recorded file")
    p.add_argument("--record", action="store_true", help=f"merge the rows into {RESULTS_PATH.relative_to(RESULTS_DIR.parent.parent)}")
    p.add_argument("--model", type=cli.choice(supported_models(), "model"), default="llama-3.1-8b",
                   help="model from labs/data/models.yaml (default: %(default)s)")
    p.add_argument("--layers", type=cli.bounded_int(1, 1000), help="keep only the first N layers (smoke runs)")
    p.add_argument("--device", type=cli.choice(("cuda", "cpu"), "device"), default=None,
                   help="cuda or cpu (default: cuda when available)")
    p.add_argument("--budget-s", type=cli.finite_float(1, 3600), default=150.0,
                   help="stop starting sections after this many seconds (default: %(default)s)")
    p.add_argument("--reps", type=cli.bounded_int(1, 1000), default=10, help="timed steps per point (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="small shapes everywhere (CPU smoke runs)")
    return p


# --- rates measured in this run ------------------------------------------------------


def calibrate(torch, device) -> dict:
    """Copy bandwidth (bytes read + written per s) and bf16 GEMM rate, measured now."""
    if device.type == "cuda":
        import triton

        from labs.paged_attention.bench import copy_bandwidth, graph_timer

        time_us = graph_timer(torch, triton, 200)
        copy_tb_s, _ = copy_bandwidth(torch, time_us)
        n = 8192
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        gemm_tflops = 2 * n ** 3 / time_us(lambda: a @ b, graph=False) / 1e6
        del a, b
    else:
        src = torch.randn(1 << 24)
        dst = torch.empty_like(src)
        t = _median_s(lambda: dst.copy_(src), 5)
        copy_tb_s = 2 * src.numel() * 4 / t / 1e12
        a = torch.randn(512, 512)
        gemm_tflops = 2 * 512 ** 3 / _median_s(lambda: a @ a, 5) / 1e12
    return {"copy_tb_s": float(f"{copy_tb_s:.4g}"), "gemm_tflops": float(f"{gemm_tflops:.4g}")}


def _median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cost_model(model_name: str, gpu_name: str | None, rates: dict, layers: int | None):
    """A Deployment and a simulator Roofline at this run's measured rates."""
    from labs import roofline, specs
    from labs.serving_sim.cost import Roofline

    gpu = next((g for g in specs.all_gpus().values() if gpu_name and g.cuda_name == gpu_name), None)
    if gpu is None:  # a CPU smoke run, or a GPU the data file lacks: only the measured rates matter
        gpu = specs.get_gpu("h200")
    gpu = dataclasses.replace(gpu, hbm_bandwidth_tbps=rates["copy_tb_s"],
                              dense_tflops={**gpu.dense_tflops, "bf16": rates["gemm_tflops"]})
    model = specs.get_model(model_name)
    if layers:
        model = dataclasses.replace(model, n_layers=layers)
    return roofline.Deployment(model, gpu), Roofline(model, gpu)


# --- driving the engine ---------------------------------------------------------------


class Bench:
    def __init__(self, args, torch):
        from labs.engine.llm import LLM

        self.args, self.torch = args, torch
        self.t0 = time.perf_counter()
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(dev)
        self.rows: list[dict] = []
        self.rng = random.Random(0)
        log("measuring copy bandwidth and GEMM rate ...")
        self.rates = calibrate(torch, self.device)
        log(f"copy {self.rates['copy_tb_s']:.3f} TB/s, bf16 GEMM {self.rates['gemm_tflops']:.1f} TFLOP/s")
        gpu_name = torch.cuda.get_device_name(0) if self.device.type == "cuda" else None
        self.dep, self.sim_cost = cost_model(args.model, gpu_name, self.rates, args.layers)
        log(f"building {args.model} (random weights) on {dev} ...")
        self.llm = LLM(args.model, n_layers=args.layers, device=dev, max_model_len=256, max_num_seqs=1, num_blocks=16)
        self.vocab = self.llm.model.cfg.vocab_size
        self.kv_token_bytes = self.dep.kv_bytes_per_token()
        self.pool_tokens = self._pool_tokens()
        log(f"the KV pool can hold {self.pool_tokens:,} tokens")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def _pool_tokens(self) -> int:
        if self.device.type != "cuda":
            return 1 << 16
        self.llm.reconfigure(max_model_len=256, max_num_seqs=1, num_blocks=16)
        free, _ = self.torch.cuda.mem_get_info()
        spare = 12 * 2**30  # activations, logits and graph pools of the largest step
        return max(0, free - spare) // self.kv_token_bytes

    def reconfigure(self, graphs: bool = True, **engine_args) -> None:
        self.llm._cuda_graphs = graphs
        engine_args.setdefault("enable_prefix_caching", False)
        self.llm.reconfigure(**engine_args)

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def add(self, ids, max_tokens: int, arrival: float | None = None):
        from labs.engine.sequence import SamplingParams

        seq, out = self.llm.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        if seq is None:
            raise RuntimeError(f"the engine refused a benchmark request: {out.error}")
        if arrival is not None:
            seq.arrival = arrival
        return seq

    # --8<-- [start:place_decodes]
    def place_decodes(self, batch: int, context: int, max_tokens: int = 1 << 16):
        """`batch` sequences whose next step decodes at context `context`, without running their prefill.

        The prompt's K/V slots are allocated and left as they are: a step's time does not depend
        on the cached values, and an 8K prefill at B = 100 would take longer than the whole sweep.
        """
        sched, blocks = self.llm.scheduler, self.llm.blocks
        seqs = []
        for _ in range(batch):
            seq = self.add([1] * (context - 1), max_tokens)
            sched.waiting.remove(seq)
            sched._admit(seq, [])
            if not blocks.try_grow(seq, context - 1):
                raise RuntimeError(f"the pool does not hold {batch} sequences of {context} tokens")
            seq.num_computed = seq.high_water = context - 1
            seq.append(1, time.perf_counter())
            seqs.append(seq)
        return seqs
    # --8<-- [end:place_decodes]

    def clear(self):
        for seq in list(self.llm.scheduler.running) + list(self.llm.scheduler.waiting):
            self.llm.abort(seq)

    def time_steps(self, reps: int, warm: int = 2) -> list[float]:
        for _ in range(warm):
            self.llm.step()
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            self.llm.step()
            out.append(time.perf_counter() - t)
        return out

    def row(self, name: str, section: str, **fields) -> dict:
        r = {"name": name, "section": section, "ok": True, **fields}
        self.rows.append(r)
        print(format_row(r), flush=True)
        return r

    # --- runs over a trace ---------------------------------------------------------

    def serve(self, trace, honor_arrivals: bool):
        """Feed the trace to the engine (arrivals on the wall clock, or all at once); the finished sequences."""
        sched = self.llm.scheduler
        pending = deque(sorted(trace))
        start = time.perf_counter()
        seqs, last = [], start
        while pending or sched.has_work():
            now = time.perf_counter()
            while pending and (not honor_arrivals or pending[0][0] <= now - start):
                a, p, o = pending.popleft()
                seqs.append(self.add(self.prompt(p), o, start + (a if honor_arrivals else 0.0)))
            if not sched.has_work():
                time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - start)))
                continue
            self.llm.step()
            if time.perf_counter() - last > 5:
                last = time.perf_counter()
                done = sum(s.finish_time is not None for s in seqs)
                log(f"  {done}/{len(trace)} requests done, {len(sched.running)} running")
        return seqs, time.perf_counter() - start


# --- sections ---------------------------------------------------------------------


def section_stages(b: Bench) -> None:
    """Where a decode step's time goes, at L = 128, B = 1 and 64, CUDA graphs on."""
    torch, llm = b.torch, b.llm
    from labs.engine.sampler import sample

    ctx, reps = 128, b.args.reps * 3
    for batch in (1, 4) if b.args.quick else (1, 64):
        for fused in (True, False):
            llm.model.fused = fused
            b.reconfigure(max_model_len=ctx + 4 * reps + 16, max_num_seqs=batch)
            b.place_decodes(batch, ctx)
            step = statistics.median(b.time_steps(reps))
            out = llm.scheduler.schedule()  # one decode step, executed again and again below
            runner = llm.runner
            execute = _median_s(lambda: runner.execute(out), reps)
            forward = _median_s(lambda: (runner._replay(out) if runner.cuda_graphs else runner._eager(out, list(range(batch)))).sum().item(), reps)
            logits = runner.last_logits
            params = [c.seq.params for c in out.chunks]
            sampling = _median_s(lambda: sample(logits, params, [None] * batch).tolist(), reps)
            fields = {"batch": batch, "context": ctx, "fused": fused, "step_ms": _ms(step), "execute_ms": _ms(execute),
                      "forward_ms": _ms(forward), "sample_ms": _ms(sampling)}
            if runner.graphs:
                bucket = next(iter(runner.graphs))
                graph = runner.graphs[bucket][0]
                if graph is not None:
                    fields["replay_ms"] = _ms(_median_s(lambda: (graph.replay(), b.sync()), reps))
                    if fused and b.args.out:
                        _profile_replay(b, graph, batch)
            if fused:
                fields["linears_ms"] = _ms(_linears_s(b, batch, reps))
                fields["kernels_per_step"] = _kernel_count(b, out)
            floor = b.dep.decode(batch, ctx).floor_s
            fields.update(floor_ms=_ms(floor), efficiency=round(floor / step, 3))
            b.row(f"stages/B{batch}/{'fused' if fused else 'unfused'}", "stages", **fields)
            b.llm.scheduler.update(out, [1] * len(out.chunks))
            b.clear()
    llm.model.fused = True


def _linears_s(b: Bench, batch: int, reps: int) -> float:
    """The step's matmuls alone (every layer's four and the LM head), replayed from a CUDA graph."""
    torch, m = b.torch, b.llm.model
    x = torch.randn(batch, m.cfg.hidden_size, device=b.device, dtype=next(m.parameters()).dtype)
    mid = torch.randn(batch, m.cfg.intermediate_size, device=b.device, dtype=x.dtype)
    att = torch.randn(batch, m.layers[0].q_size, device=b.device, dtype=x.dtype)

    def run():
        for layer in m.layers:
            layer.qkv(x)
            layer.o(att)
            layer.gate_up(x)
            layer.down(mid)
        m.lm_head(x)

    if b.device.type != "cuda":
        return _median_s(run, reps)
    run()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    return _median_s(lambda: (g.replay(), b.sync()), reps)


def _profile_replay(b: Bench, graph, batch: int) -> None:
    """The kernels of one captured decode step, by GPU time, into --out (profile_graph_B<batch>.txt)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graph.replay()
        b.sync()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
    (b.args.out / f"profile_graph_B{batch}.txt").write_text(f"5 replays of the B = {batch} graph\n{table}\n")


def _kernel_count(b: Bench, out) -> int | None:
    """GPU kernels one eager forward of this step launches (what a CUDA graph replays)."""
    if b.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    runner = b.llm.runner
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner._eager(out, list(range(len(out.chunks))))
        b.sync()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    if b.args.out:
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
        (b.args.out / f"profile_B{len(out.chunks)}.txt").write_text(table)
    return len(events)


def _ladder(top: int) -> list[int]:
    out, v = [], 1
    while v < top:
        out.append(v)
        v *= 4
    return out + [top]


def section_decode(b: Bench) -> None:
    contexts = (32, 64) if b.args.quick else CONTEXTS
    for ctx in contexts:
        reps = b.args.reps
        max_len = ctx + reps + 8
        pool_batch = b.pool_tokens // (-(-max_len // 16) * 16)
        top = min(pool_batch, 8 if b.args.quick else BATCH_CAP)
        ladder = _ladder(top)
        for graphs in (True, False):
            if b.elapsed() > b.args.budget_s:
                log(f"decode: budget spent, skipping L = {ctx}")
                return
            b.reconfigure(graphs, max_model_len=max_len, max_num_seqs=top)
            for batch in ladder:
                b.place_decodes(batch, ctx)
                step = statistics.median(b.time_steps(reps))
                b.clear()
                cost = b.dep.decode(batch, ctx)
                b.row(f"decode/L{ctx}/B{batch}/{'graphs' if graphs else 'eager'}", "decode", context=ctx, batch=batch,
                      cuda_graphs=graphs, step_ms=_ms(step), floor_ms=_ms(cost.floor_s),
                      weight_floor_ms=_ms(cost.weight_s), efficiency=round(cost.floor_s / step, 3),
                      tok_s=round(batch / step, 1), pool_batch=pool_batch)


def _trace(b: Bench):
    trace = load_trace()
    if b.args.quick:
        trace = [(a, max(8, p // 32), max(2, o // 32)) for a, p, o in trace[:12]]
    return trace


def _trace_config(b: Bench, trace, concurrency: int, policy: str = "continuous", budget: int = BUDGET_TOKENS) -> dict:
    max_len = max(p + o for _, p, o in trace) + 16
    return dict(max_model_len=max_len, max_num_seqs=concurrency, max_num_batched_tokens=budget,
                num_blocks=concurrency * -(-max_len // 16), policy=policy)


def _latency(seqs) -> dict:
    from labs.serving_sim import metrics

    t, p = metrics.ttfts(seqs), metrics.tpots(seqs)
    e = [s.finish_time - s.arrival for s in seqs if s.finish_time is not None]
    return {"ttft_p50_ms": _ms(metrics.percentile(t, 50)), "ttft_p99_ms": _ms(metrics.percentile(t, 99)),
            "tpot_p50_ms": _ms(metrics.percentile(p, 50)), "tpot_p99_ms": _ms(metrics.percentile(p, 99)),
            "e2e_p50_s": round(metrics.percentile(e, 50), 3), "e2e_p99_s": round(metrics.percentile(e, 99), 3)}


def _simulate(b: Bench, trace, cfg: dict, honor_arrivals: bool):
    from labs.serving_sim import driver
    from labs.serving_sim.trace import Request

    reqs = [Request(i, a if honor_arrivals else 0.0, p, o) for i, (a, p, o) in enumerate(trace)]
    if cfg["policy"] == "static":
        return driver.run_static(reqs, b.sim_cost, cfg["max_num_seqs"], cfg["num_blocks"])
    fields = {k: v for k, v in cfg.items() if k != "policy"}
    return driver.run_continuous(reqs, b.sim_cost, driver.sim_config(**fields), record=True)


def section_offline(b: Bench) -> None:
    """The target: offline throughput against the cost model's bound at this concurrency."""
    trace = _trace(b)
    conc = 8 if b.args.quick else CONCURRENCY
    cfg = _trace_config(b, trace, conc, budget=OFFLINE_BUDGET_TOKENS)
    b.reconfigure(**cfg)
    log("offline: warm-up, the whole trace once (captures every batch bucket's graph, compiles every kernel) ...")
    b.serve(trace, honor_arrivals=False)
    b.llm.steps = []
    seqs, wall = b.serve(trace, honor_arrivals=False)
    out_tokens = sum(s.num_output for s in seqs)
    bound = b.dep.throughput_bound([(p, o) for _, p, o in trace], conc)
    measured = out_tokens / wall
    dec = [s.seconds for s in b.llm.steps if s.decode_only]
    mixed = [s.seconds for s in b.llm.steps if not s.decode_only]
    sim = _simulate(b, trace, cfg, honor_arrivals=False)
    sim_dec = [dt for dt, n, r, _ in sim.step_log if n == r]
    sim_tok_s = sum(s.num_output for s in sim.requests) / sim.end_time
    b.row(f"offline/C{conc}", "offline", concurrency=conc, max_num_batched_tokens=cfg["max_num_batched_tokens"],
          requests=len(trace), output_tokens=out_tokens,
          seconds=round(wall, 3), output_tok_s=round(measured, 1), bound_tok_s=round(bound.output_tokens_per_s, 1),
          efficiency=round(measured / bound.output_tokens_per_s, 3), bound_prefill_s=round(bound.prefill_s, 3),
          bound_decode_s=round(bound.decode_s, 3), steps=len(b.llm.steps),
          decode_step_ms_mean=_ms(statistics.fmean(dec)) if dec else None,
          decode_steps=len(dec), decode_steps_s=round(sum(dec), 3), mixed_steps=len(mixed),
          mixed_steps_s=round(sum(mixed), 3),
          sim_output_tok_s=round(sim_tok_s, 1), sim_seconds=round(sim.end_time, 3), sim_steps=sim.steps,
          sim_decode_step_ms_mean=_ms(statistics.fmean(sim_dec)) if sim_dec else None,
          sim_error=round(sim_tok_s / measured - 1, 3), preemptions=b.llm.scheduler.preemptions)
    b.offline_tok_s = measured
    b.clear()


def section_hf(b: Bench) -> None:
    """Hugging Face generate, eager, padded static batches of `concurrency` in trace order."""
    torch = b.torch
    trace = _trace(b)
    conc = 8 if b.args.quick else CONCURRENCY
    hf = hf_model(b.llm.model)
    total_out, start = 0, time.perf_counter()
    for i in range(0, len(trace), conc):
        batch = trace[i:i + conc]
        longest = max(p for _, p, _ in batch)
        new = max(o for _, _, o in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        mask = torch.zeros(len(batch), longest, dtype=torch.long)
        for r, (_, p, _) in enumerate(batch):  # left padding, as generate wants for a decoder
            ids[r, longest - p:] = torch.tensor(b.prompt(p))
            mask[r, longest - p:] = 1
        with torch.inference_mode():
            hf.generate(input_ids=ids.to(b.device), attention_mask=mask.to(b.device), max_new_tokens=new,
                        min_new_tokens=new, do_sample=False, pad_token_id=0)
        b.sync()
        total_out += sum(o for _, _, o in batch)  # useful tokens: a row's tokens past its length are waste
        log(f"  hf: {min(i + conc, len(trace))}/{len(trace)} requests")
    wall = time.perf_counter() - start
    bound = b.dep.throughput_bound([(p, o) for _, p, o in trace], conc)
    engine = getattr(b, "offline_tok_s", None)
    b.row(f"hf/C{conc}/eager", "hf", concurrency=conc, requests=len(trace), output_tokens=total_out,
          seconds=round(wall, 3), output_tok_s=round(total_out / wall, 1), bound_tok_s=round(bound.output_tokens_per_s, 1),
          efficiency=round(total_out / wall / bound.output_tokens_per_s, 3),
          engine_over_hf=round(engine / (total_out / wall), 2) if engine else None)
    del hf
    if b.device.type == "cuda":
        torch.cuda.empty_cache()


def hf_model(m):
    """transformers' LlamaForCausalLM holding the engine model's weights (shared, not copied), on its device."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from labs.engine.model import rope_inv_freq

    p = next(m.parameters())
    config = LlamaConfig.from_dict(m.cfg.hf_config_dict())
    default = torch.get_default_dtype()
    torch.set_default_dtype(p.dtype)
    try:
        with torch.device(p.device):  # real buffers (rotary frequencies); the weights are replaced below
            hf = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    hf.load_state_dict({k: v.contiguous() for k, v in m.hf_state_dict().items()}, strict=False, assign=True)
    for mod in hf.modules():
        if hasattr(mod, "inv_freq"):
            mod.inv_freq = rope_inv_freq(m.cfg).to(p.device)
    hf.generation_config.pad_token_id = 0
    return hf.eval()


def section_batching(b: Bench) -> None:
    trace = _trace(b)
    conc = 8 if b.args.quick else CONCURRENCY
    for policy in ("continuous", "static"):
        cfg = _trace_config(b, trace, conc, policy)
        b.reconfigure(**cfg)
        b.serve([(0.0, 16, 4)] * 2, honor_arrivals=False)  # warm the small buckets
        seqs, wall = b.serve(trace, honor_arrivals=True)
        out = sum(s.num_output for s in seqs)
        span = max(s.finish_time for s in seqs) - min(s.arrival for s in seqs)
        sim = _simulate(b, trace, cfg, honor_arrivals=True)
        from labs.serving_sim import metrics

        ss = metrics.summary(sim)
        b.row(f"batching/{policy}", "batching", policy=policy, concurrency=conc, requests=len(trace),
              output_tok_s=round(out / span, 1), **_latency(seqs), steps=len(b.llm.steps),
              sim_output_tok_s=round(ss["output_tok_per_s"], 1), sim_ttft_p99_ms=_ms(ss["ttft_p99_s"]),
              sim_tpot_mean_ms=_ms(ss["tpot_mean_s"]))
        b.clear()


def _warm_chunks(b: Bench, decodes: int, ctx: int, prompt: int) -> None:
    """Run one throwaway prompt through a budget's mixed batches before the timed one.

    The first mixed batch of a new shape compiles its kernels: round 2's chunked/512 row, the first
    budget timed, recorded that compile as a 0.8 s decode gap.
    """
    b.place_decodes(decodes, ctx)
    seq = b.add(b.prompt(prompt), 2, time.perf_counter())
    while not seq.finished:
        b.llm.step()
    b.clear()


def section_chunked(b: Bench) -> None:
    decodes, ctx, prompt = (4, 32, 256) if b.args.quick else (32, 512, 16384)
    budgets = QUICK_CHUNK_BUDGETS if b.args.quick else CHUNK_BUDGETS
    for budget in (*budgets, None):
        max_len = prompt + 64
        blocks = decodes * -(-(ctx + 256) // 16) + -(-max_len // 16) + 8
        b.reconfigure(max_model_len=max_len, max_num_seqs=decodes + 1, max_num_batched_tokens=budget or 2048,
                      enable_chunked_prefill=budget is not None, num_blocks=blocks)
        _warm_chunks(b, decodes, ctx, min(prompt, 2 * (budget or prompt)))
        running = b.place_decodes(decodes, ctx)
        b.time_steps(3, warm=0)
        t_add = time.perf_counter()
        long = b.add(b.prompt(prompt), 2, t_add)
        while long.first_token_time is None:
            b.llm.step()
        b.time_steps(2, warm=0)
        gaps = [y - x for s in running for x, y in zip(s.token_times, s.token_times[1:]) if y >= t_add]
        cp = b.dep.chunked_prefill(prompt, budget, decodes, ctx)
        ttft = long.first_token_time - t_add
        worst = max(gaps)
        b.row(f"chunked/{budget or 'off'}", "chunked", max_num_batched_tokens=budget, decodes=decodes, prompt=prompt,
              worst_gap_ms=_ms(worst), ttft_ms=_ms(ttft), floor_worst_gap_ms=_ms(cp.worst_s),
              floor_ttft_ms=_ms(cp.total_s), efficiency=round(cp.total_s / ttft, 3))
        b.clear()


def section_prefix(b: Bench) -> None:
    suffix = 8 if b.args.quick else 64
    systems = (64, 128) if b.args.quick else SYSTEM_PROMPTS
    b.reconfigure(max_model_len=max(systems) + suffix + 32, max_num_seqs=4, max_num_batched_tokens=16384,
                  enable_prefix_caching=True)
    b.serve([(0.0, 32, 2)], honor_arrivals=False)
    for n in systems:
        system = b.prompt(n)
        for kind in ("miss", "hit"):
            hits_before = b.llm.blocks.hit_tokens
            t = time.perf_counter()
            seq = b.add(system + b.prompt(suffix), 1, t)
            while not seq.finished:
                b.llm.step()
            ttft = seq.first_token_time - t
            cached = seq.num_cached_tokens
            floor = b.dep.prefill(n + suffix - cached, cached).floor_s
            b.row(f"prefix/{n}/{kind}", "prefix", system_tokens=n, suffix_tokens=suffix, cached_tokens=cached,
                  hit_rate=round((b.llm.blocks.hit_tokens - hits_before) / (n + suffix), 3), ttft_ms=_ms(ttft),
                  floor_ms=_ms(floor), efficiency=round(floor / ttft, 3))
    b.clear()


def section_preempt(b: Bench) -> None:
    n, prompt, output, fits = (8, 16, 16, 4) if b.args.quick else (64, 128, 128, 16)
    per_seq = -(-(prompt + output) // 16)
    trace = [(0.0, prompt, output)] * n
    for factor in (1, 1.5, 2, 4):
        seqs_cap = int(fits * factor)
        b.reconfigure(max_model_len=prompt + output + 16, max_num_seqs=seqs_cap, num_blocks=fits * per_seq)
        b.serve([(0.0, 8, 2)] * 2, honor_arrivals=False)
        seqs, wall = b.serve(trace, honor_arrivals=False)
        out = sum(s.num_output for s in seqs)
        lat = _latency(seqs)
        bound = b.dep.throughput_bound([(prompt, output)] * n, fits)
        b.row(f"preempt/x{factor:g}", "preempt", oversubscription=factor, max_num_seqs=seqs_cap, pool_seqs=fits,
              requests=n, output_tok_s=round(out / wall, 1), e2e_p99_s=lat["e2e_p99_s"],
              tpot_p99_ms=lat["tpot_p99_ms"], preemptions=b.llm.scheduler.preemptions,
              recomputed_tokens=b.llm.scheduler.recomputed_tokens, bound_tok_s=round(bound.output_tokens_per_s, 1),
              efficiency=round(out / wall / bound.output_tokens_per_s, 3))
        b.clear()


def _ms(seconds: float | None) -> float | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return round(seconds * 1e3, 3)


# --- output ---------------------------------------------------------------------------

SKIP = {"name", "section", "ok"}


def format_row(row: dict) -> str:
    """One printed line per row: its name, then its fields (torch-free, for pages too)."""
    fields = " ".join(f"{k}={v}" for k, v in row.items() if k not in SKIP)
    return f"{row['name']:<24} {fields}"


def format_table(rows: list[dict]) -> str:
    return "\n".join(format_row(r) for r in rows)


RUNNERS = {"stages": section_stages, "decode": section_decode, "offline": section_offline, "hf": section_hf,
           "batching": section_batching, "chunked": section_chunked, "prefix": section_prefix,
           "preempt": section_preempt}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        return cli.fail("--device cuda: no CUDA GPU is visible")
    if args.record and not (args.device or "cuda") == "cuda" or args.record and not torch.cuda.is_available():
        return cli.fail("--record: only a GPU run is recorded (this one would run on the CPU)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)  # before any section writes a profile into it
    b = Bench(args, torch)
    failed = []
    for name in SECTIONS:
        if name not in args.only:
            continue
        left = args.budget_s - b.elapsed()
        if left < SECTION_COST_S[name] * (0.1 if args.quick else 1):
            log(f"{name}: skipped, {left:.0f} s of the {args.budget_s:g} s budget left")
            continue
        log(f"{name}: starting at {b.elapsed():.0f} s")
        try:
            with torch.inference_mode():
                RUNNERS[name](b)
        except Exception as exc:  # one broken section must not lose the others' rows
            log(f"{name}: failed: {type(exc).__name__}: {exc}")
            failed.append(name)
            b.clear()
    env = _environment(torch, b)
    if args.out:
        (args.out / "bench.json").write_text(json.dumps({"run": env, "rows": b.rows}, indent=2) + "\n")
    if args.record and b.rows:
        try:
            report = record_rows(RESULTS_PATH, "engine", Machine(env["gpu"]), b.rows, ["name"], env,
                                 derive=lambda rows: {"table": format_table(rows)})
        except RecordedError as err:
            return cli.fail(str(err))
        print(report)
        if args.out:
            (args.out / "engine.json").write_text(RESULTS_PATH.read_text())
    log(f"done in {b.elapsed():.0f} s: {len(b.rows)} rows" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _environment(torch, b: Bench) -> dict:
    if b.device.type == "cuda":
        from labs.gpu_harness.environment import environment

        env = environment(torch)
    else:
        import datetime

        env = {"gpu": "cpu", "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    return {**env, **b.rates, "model": b.args.model, "layers": b.llm.model.cfg.n_layers,
            "trace": str(TRACE_FILE.relative_to(TRACE_FILE.parent.parent.parent)), "wall_s": round(b.elapsed(), 1)}


if __name__ == "__main__":
    sys.exit(main())
