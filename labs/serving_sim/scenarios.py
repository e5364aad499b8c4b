"""The experiments the CLI and the site run: each returns its data and a table.

Every function takes names from labs/data (a model, a GPU), builds the roofline
and, where it needs one, a KV pool sized the way vLLM 0.33 sizes it (the
KV-sizing lab's `budget`, or `num_gpu_blocks_override` as vLLM's own
`--num-gpu-blocks-override`, which exists to force preemption in tests). All
randomness is seeded. Everything printed is derived by the simulator, an ideal
roofline, never measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import specs
from labs.kv_sizing.memory_budget import DEFAULT_GPU_MEMORY_UTILIZATION, budget
from labs.serving_sim import metrics, spec_decode
from labs.serving_sim.cost import Chunk, Roofline
from labs.serving_sim.defaults import CONTEXTS, batch_defaults
from labs.engine.config import EngineConfig
from labs.serving_sim.driver import run_continuous, run_static, sim_config
from labs.serving_sim.metrics import fixed, ms, table
from labs.serving_sim.trace import LengthRange, make_trace
from labs.specs import SpecError

LABEL = "derived (simulator): ideal roofline, not measured"


@dataclass(frozen=True)
class Setup:
    """What every scenario starts from: model, GPU, roofline, pool and scheduler limits."""

    cost: Roofline
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    pool_source: str
    # vLLM's default for the GPU when --max-num-seqs was not given (None when it was): a scenario
    # that picks its own token budget caps this default at the budget, as EngineArgs does.
    default_max_num_seqs: int | None = None
    budget_given: bool = False  # --max-num-batched-tokens was set (vLLM then never raises it)

    def engine(self, **changes) -> EngineConfig:
        """An engine config as vLLM 0.33 would accept it, or a SpecError where vLLM refuses it.

        `_set_default_max_num_seqs_and_batched_tokens_args` (vllm/engine/arg_utils.py) lowers a
        defaulted max_num_seqs to the token budget; `SchedulerConfig.verify_max_model_len`
        (vllm/config/scheduler.py) refuses a budget below an explicit max_num_seqs, and, with
        chunked prefill off, an explicit budget below max_model_len.
        """
        base = dict(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                    num_blocks=self.num_blocks, block_size=self.block_size, max_model_len=self.max_model_len)
        base.update(changes)
        budget = base["max_num_batched_tokens"]
        if "max_num_batched_tokens" in changes and "max_num_seqs" not in changes and self.default_max_num_seqs:
            base["max_num_seqs"] = min(self.default_max_num_seqs, budget)
        if budget < base["max_num_seqs"]:
            raise SpecError(f"max_num_batched_tokens {budget:,} is below max_num_seqs {base['max_num_seqs']:,}: "
                            "vLLM 0.33 refuses that config; raise the budget or lower --max-num-seqs")
        if (not base.get("enable_chunked_prefill", True) and self.budget_given
                and "max_num_batched_tokens" not in changes and budget < base["max_model_len"]):
            raise SpecError(f"--max-num-batched-tokens {budget:,} is below max_model_len {base['max_model_len']:,} "
                            "with chunked prefill off: vLLM 0.33 refuses that config; lower --max-model-len "
                            "or leave the budget to its default")
        return sim_config(**base)

    def header(self) -> str:
        m, g = self.cost.model, self.cost.gpu
        return (f"{m.display_name} on {g.display_name}; KV pool {self.num_blocks:,} blocks x {self.block_size} = "
                f"{self.num_blocks * self.block_size:,} token slots ({self.pool_source}); "
                f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens {self.max_num_batched_tokens:,}. "
                f"{LABEL}.")


def setup(model: str, gpu: str, *, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
          max_model_len: int | None = None, kv_cache_dtype: str = "auto", gpu_memory_utilization: float | None = None,
          num_gpu_blocks_override: int | None = None, overhead_ms: float = 0.0) -> Setup:
    """Roofline and KV pool for `model` on `gpu`; unset limits take vLLM's `vllm serve` defaults."""
    if gpu_memory_utilization is None:
        gpu_memory_utilization = DEFAULT_GPU_MEMORY_UTILIZATION
    m, g = specs.get_model(model), specs.get_gpu(gpu)
    cost = Roofline(m, g, kv_cache_dtype, overhead_ms / 1e3)
    max_model_len = max_model_len or m.max_position_embeddings
    d = batch_defaults(g, "serve", max_model_len=max_model_len)
    tokens = max_num_batched_tokens or d.max_num_batched_tokens
    seqs = max_num_seqs or min(d.max_num_seqs, tokens)  # vLLM caps a defaulted max_num_seqs at the budget
    b = budget(m, g, max_model_len, gpu_memory_utilization=gpu_memory_utilization,
               kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=tokens, max_num_seqs=seqs)
    if num_gpu_blocks_override is not None:
        if num_gpu_blocks_override < 1:
            raise SpecError(f"--num-gpu-blocks-override must be >= 1, got {num_gpu_blocks_override}")
        blocks, source = num_gpu_blocks_override, "--num-gpu-blocks-override"
    else:
        if b.num_blocks < 1:
            raise SpecError(f"{m.name} leaves no KV pool on {g.name}: {b.error}")
        blocks, source = b.num_blocks, f"sized by the KV-sizing lab at gpu_memory_utilization {gpu_memory_utilization}"
    return Setup(cost, blocks, b.block_size, seqs, tokens, max_model_len, source,
                 default_max_num_seqs=None if max_num_seqs else d.max_num_seqs,
                 budget_given=max_num_batched_tokens is not None)


# ---------------------------------------------------------------------------
# Static vs continuous batching
# ---------------------------------------------------------------------------


def batching(s: Setup, n: int = 400, prompt: str = "128:2048", output: str = "16:512", seed: int = 0) -> tuple[dict, str]:
    """Same trace, same slot limit, two policies; then a trace with no length spread."""
    p, o = LengthRange.parse(prompt), LengthRange.parse(output)
    traces = {
        f"mixed (prompt {p}, output {o})": make_trace(n, p, o, seed=seed),
        f"equal (prompt {round(p.mean)}, output {round(o.mean)})":
            make_trace(n, LengthRange(round(p.mean), round(p.mean)), LengthRange(round(o.mean), round(o.mean)), seed=seed),
    }
    data, rows = {}, []
    for name, trace in traces.items():
        st = metrics.summary(run_static(trace, s.cost, s.max_num_seqs, s.num_blocks, s.block_size))
        co = metrics.summary(run_continuous(trace, s.cost, s.engine()))
        data[name] = {"static": st, "continuous": co}
        for label, r in (("static", st), ("continuous", co)):
            rows.append([name, label, fixed(r["output_tok_per_s"]),
                         f"{r['output_tok_per_s'] / st['output_tok_per_s']:.2f}x",
                         fixed(r["ttft_mean_s"], 2), fixed(r["ttft_p99_s"], 2), ms(r["tpot_mean_s"]),
                         f"{100 * r['wasted_token_fraction']:.0f}%"])
    text = "\n".join([
        s.header(),
        f"{n} requests arriving at t = 0 (seed {seed}); static batches of up to {s.max_num_seqs} requests, "
        "prompts padded to the longest, run until the longest output ends.",
        "",
        table(["trace", "policy", "output tok/s", "vs static", "mean TTFT s", "p99 TTFT s",
               "mean TPOT ms", "wasted compute"], rows, "llrrrrrr"),
    ])
    return {"setup": s.header(), "runs": data}, text


# ---------------------------------------------------------------------------
# Chunked prefill: a long prompt arrives while requests decode
# ---------------------------------------------------------------------------


def chunked_prefill(s: Setup, decodes: int = 32, decode_prompt: int = 512, long_prompt: int = 16384,
                    budgets: tuple[int, ...] = (512, 2048, 8192), arrival: float = 0.5, seed: int = 0) -> tuple[dict, str]:
    """ITL of running decodes and TTFT of a long prompt, chunked (per budget) and unchunked."""
    if long_prompt + 1 > s.max_model_len:
        raise SpecError(f"long prompt {long_prompt} does not fit max_model_len {s.max_model_len}")
    for b in budgets:
        if s.default_max_num_seqs is None and b < s.max_num_seqs:
            raise SpecError(f"argument --budgets: {b:,} is below --max-num-seqs {s.max_num_seqs:,}; vLLM 0.33 refuses "
                            "max_num_batched_tokens below max_num_seqs")
    t_one = s.cost.step_time([Chunk(long_prompt, 0)])
    # Decodes long enough to outlast any of the prefills below.
    out_len = max(64, int(4 * t_one / s.cost.decode_step_time(decodes, decode_prompt)) + 64)
    base = make_trace(decodes, LengthRange(decode_prompt, decode_prompt), LengthRange(out_len, out_len), seed=seed)
    long_req = make_trace(1, LengthRange(long_prompt, long_prompt), LengthRange(8, 8), start=arrival,
                          first_rid=decodes, seed=seed)
    trace = base + long_req
    until = arrival + 4 * t_one + 0.25
    configs = [("off", s.engine(enable_chunked_prefill=False))]
    configs += [(f"on, {b:,}", s.engine(max_num_batched_tokens=b)) for b in budgets]
    data, rows = {}, []
    for label, cfg in configs:
        res = run_continuous(trace, s.cost, cfg, until=until)
        lr = next(r for r in res.requests if r.seq_id == decodes)
        dec = [r for r in res.requests if r.seq_id < decodes]
        if any(r.first_token_time is None or r.first_token_time > arrival for r in dec):
            raise SpecError("decodes had not started before the long prompt arrived; raise --arrival")
        if lr.first_token_time is None:
            raise SpecError("the long prompt did not finish its prefill in the simulated window")
        gaps = metrics.itls(dec, arrival, lr.first_token_time)
        during = sum(1 for r in dec for t in r.token_times if arrival <= t <= lr.first_token_time) / decodes
        row = {"budget": cfg.token_budget, "chunked": cfg.enable_chunked_prefill, "max_num_seqs": cfg.max_num_seqs,
               "long_ttft_s": lr.first_token_time - arrival, "itl_p50_s": metrics.percentile(gaps, 50),
               "itl_max_s": max(gaps), "decode_tokens_during_prefill": during}
        data[label] = row
        rows.append([label, f"{cfg.token_budget:,}", f"{cfg.max_num_seqs:,}", ms(row["long_ttft_s"]),
                     ms(row["itl_p50_s"]), ms(row["itl_max_s"]), fixed(during, 1)])
    text = "\n".join([
        s.header(),
        f"{decodes} requests decoding (prompt {decode_prompt}); a {long_prompt:,}-token prompt arrives at "
        f"t = {arrival} s. ITL counts the decodes' gaps from its arrival to its first token. A budget below "
        "the default max_num_seqs lowers it to the budget, as vLLM 0.33 does when --max-num-seqs is not given.",
        "",
        table(["chunked prefill", "token budget", "max_num_seqs", "long prompt TTFT ms", "decode ITL p50 ms",
               "decode ITL max ms", "decode tokens during prefill"], rows, "lrrrrrr"),
        "",
        "Where the default budget comes from:",
        "",
        defaults()[1],
    ])
    return {"setup": s.header(), "rows": data}, text


# ---------------------------------------------------------------------------
# Preemption: a pool too small for the admitted requests' growth
# ---------------------------------------------------------------------------


def preemption(s: Setup, n: int = 64, prompt: int = 256, output: int = 1024,
               cases: tuple[tuple[int, int], ...] = ((2048, 64), (2048, 32), (2048, 24), (2048, 16), (4096, 64), (6144, 64)),
               seed: int = 0) -> tuple[dict, str]:
    """Preemptions, recompute and throughput for (KV blocks, max_num_seqs) pairs."""
    trace = make_trace(n, LengthRange(prompt, prompt), LengthRange(output, output), seed=seed)
    data, rows = {}, []
    for blocks, seqs in cases:
        r = metrics.summary(run_continuous(trace, s.cost, s.engine(num_blocks=blocks, max_num_seqs=seqs)))
        key = f"{blocks}x{seqs}"
        data[key] = r
        rows.append([f"{blocks:,}", f"{blocks * s.block_size:,}", seqs, r["preemptions"],
                     f"{r['recomputed_tokens']:,}", f"{100 * r['recomputed_tokens'] / r['computed_tokens']:.0f}%",
                     fixed(r["output_tok_per_s"]), ms(r["itl_max_s"], 0), fixed(r["duration_s"], 2)])
    demand = n * (prompt + output)
    text = "\n".join([
        s.header().split("; KV pool")[0] + f". {LABEL}.",
        f"{n} requests at t = 0, prompt {prompt}, output {output}: {demand:,} tokens of KV if all ran at once.",
        "Pool sizes set as with --num-gpu-blocks-override; recompute = prefill work redone after preemption.",
        "",
        table(["KV blocks", "token slots", "max_num_seqs", "preemptions", "recomputed tokens", "of computed",
               "output tok/s", "max ITL ms", "duration s"], rows, "rrrrrrrrr"),
    ])
    return {"demand_tokens": demand, "rows": data}, text


# ---------------------------------------------------------------------------
# Speculative decoding
# ---------------------------------------------------------------------------


def spec(s: Setup, draft: str = "eagle", batch: int = 1, context: int = 1024,
         alphas: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9), ks: tuple[int, ...] = (1, 2, 3, 4, 5),
         alpha: float = 0.7, batches: tuple[int, ...] = (1, 16, 64, 256, 1024), trials: int = 10000,
         seed: int = 0) -> tuple[dict, str]:
    """Speedup over plain decode against alpha and k, then against batch size; formula vs Monte-Carlo."""
    d = spec_decode.make_drafter(draft, s.cost)
    ratio = spec_decode.draft_cost_ratio(s.cost, d, batch, context)
    grid = {a: {k: spec_decode.speedup(s.cost, d, a, k, batch, context) for k in ks} for a in alphas}
    # A batch row is only real if its KV fits: each request holds context + k + 1 tokens in whole blocks.
    sweep_ks = (1, 3, 5)
    per_request = -(-(context + max(sweep_ks) + 1) // s.block_size)
    fits = s.num_blocks // per_request
    kept = sorted({b for b in batches if b <= fits} | ({fits} if any(b > fits for b in batches) else set()))
    dropped = [b for b in batches if b > fits]
    sweep = {b: {k: spec_decode.speedup(s.cost, d, alpha, k, b, context) for k in sweep_ks} for b in kept}
    check = {(a, k): (spec_decode.expected_tokens(a, k), spec_decode.monte_carlo_tokens(a, k, trials, seed))
             for a in alphas for k in (1, 3, 5)}
    worst = max(abs(f - mc) for f, mc in check.values())
    t1 = table(["alpha \\ k", *[str(k) for k in ks]],
               [[f"{a:.1f}", *[f"{grid[a][k]:.2f}x" for k in ks]] for a in alphas])
    t2 = table(["batch", "k = 1", "k = 3", "k = 5"],
               [[b, *[f"{sweep[b][k]:.2f}x" for k in sweep_ks]] for b in kept], "rrrr")
    pool_note = (f"The KV pool ({s.num_blocks:,} blocks of {s.block_size}) holds {fits:,} requests of {context:,} "
                 f"tokens plus {max(sweep_ks)} drafts; " + (f"batch {', '.join(f'{b:,}' for b in dropped)} would not fit, so the "
                 f"last row is the largest batch that does." if dropped else "every batch above fits."))
    t3 = table(["alpha", "k", "E[tokens/step] formula", f"Monte-Carlo ({trials:,} steps)"],
               [[f"{a:.1f}", k, f"{f:.3f}", f"{mc:.3f}"] for (a, k), (f, mc) in check.items() if k == 3], "rrrr")
    m = s.cost.model
    text = "\n".join([
        f"{m.display_name} on {s.cost.gpu.display_name}; drafter {draft}: one draft pass costs {ratio:.3f} of a "
        f"target decode step at batch {batch}, context {context}. {LABEL}.",
        "",
        f"Decode speedup at batch {batch}, context {context} (rows: acceptance rate alpha; columns: k):",
        "",
        t1,
        "",
        f"Decode speedup against batch size at alpha {alpha}, context {context}:",
        "",
        t2,
        "",
        pool_note,
        "",
        f"Tokens per step, closed form vs simulated acceptances (k = 3; largest gap over all checked: {worst:.3f}):",
        "",
        t3,
    ])
    data = {"draft_cost_ratio": ratio, "grid": {str(a): {str(k): v for k, v in r.items()} for a, r in grid.items()},
            "batch_sweep": {str(b): {str(k): v for k, v in r.items()} for b, r in sweep.items()},
            "pool_requests": fits, "batches_left_out": dropped,
            "check": {f"{a}/{k}": {"formula": f, "monte_carlo": mc} for (a, k), (f, mc) in check.items()},
            "max_abs_gap": worst}
    return data, text


# ---------------------------------------------------------------------------
# Tuning: max_num_seqs against throughput and latency
# ---------------------------------------------------------------------------


def knobs(s: Setup, n: int = 240, prompt: str = "128:2048", output: str = "16:512", rate: float = 40.0,
          seqs: tuple[int, ...] = (8, 16, 32, 64, 128, 256), seed: int = 0) -> tuple[dict, str]:
    """One Poisson trace, a sweep of max_num_seqs: the throughput/latency curve the knob walks."""
    trace = make_trace(n, LengthRange.parse(prompt), LengthRange.parse(output), rate=rate, seed=seed)
    data, rows = {}, []
    for q in seqs:
        r = metrics.summary(run_continuous(trace, s.cost, s.engine(max_num_seqs=q)))
        data[str(q)] = r
        rows.append([q, fixed(r["output_tok_per_s"]), ms(r["tpot_mean_s"]), ms(r["itl_p99_s"]),
                     fixed(r["ttft_mean_s"], 2), fixed(r["ttft_p99_s"], 2), r["preemptions"]])
    text = "\n".join([
        s.header(),
        f"{n} requests, Poisson arrivals at {rate:g} requests/s (seed {seed}), prompt {prompt}, output {output}.",
        "",
        table(["max_num_seqs", "output tok/s", "mean TPOT ms", "p99 ITL ms", "mean TTFT s", "p99 TTFT s",
               "preemptions"], rows, "rrrrrrr"),
    ])
    return {"setup": s.header(), "rows": data}, text


# ---------------------------------------------------------------------------
# Sampling: what the logits cost next to a decode step
# ---------------------------------------------------------------------------


def sampling(s: Setup, batches: tuple[int, ...] = (1, 64, 256, 1024), context: int = 1024,
             prompt_logprobs: int = 8192) -> tuple[dict, str]:
    """Bytes of the float32 logits each sampler pass reads, against the step's own time."""
    c, m = s.cost, s.cost.model
    data, rows = {}, []
    for b in batches:
        logits = b * m.vocab_size * 4
        one_pass = 2 * logits / c.bandwidth  # read and write the B x V float32 tensor once
        step = c.decode_step_time(b, context)
        data[str(b)] = {"logits_bytes": logits, "pass_s": one_pass, "step_s": step}
        rows.append([b, f"{logits / 2**20:,.1f}", f"{one_pass * 1e6:,.1f}", ms(step, 2),
                     f"{100 * one_pass / step:.2f}%"])
    p = prompt_logprobs
    plog = p * m.vocab_size * 4
    head = 2 * c.lm_head_params * p / c.flops
    prefill = c.step_time([Chunk(p, 0)])
    data["prompt_logprobs"] = {"tokens": p, "logits_bytes": plog, "lm_head_s": head, "prefill_s": prefill}
    text = "\n".join([
        f"{m.display_name} (vocab {m.vocab_size:,}) on {c.gpu.display_name}, context {context}. {LABEL}.",
        "One pass = read and write the B x V float32 logits once at HBM bandwidth.",
        "",
        table(["batch", "logits MiB", "one pass us", "decode step ms", "pass / step"], [list(map(str, r)) for r in rows],
              "rrrrr"),
        "",
        f"prompt_logprobs on a {p:,}-token prompt: logits for every prompt position, {plog / 2**20:,.0f} MiB, "
        f"and {head * 1e3:.1f} ms of LM-head FLOPs on top of a {prefill * 1e3:.0f} ms prefill.",
    ])
    return data, text


# ---------------------------------------------------------------------------
# Defaults: what vLLM picks per GPU
# ---------------------------------------------------------------------------


def defaults(gpus: tuple[str, ...] | None = None) -> tuple[dict, str]:
    """max_num_batched_tokens / max_num_seqs per GPU and usage context, from labs/data/vllm.yaml."""
    names = gpus or tuple(specs.all_gpus())
    data, rows = {}, []
    for name in names:
        g = specs.get_gpu(name)
        per = {ctx: batch_defaults(g, ctx) for ctx in CONTEXTS}
        thr = batch_defaults(g, "serve", performance_mode="throughput")
        data[name] = {ctx: {"max_num_batched_tokens": d.max_num_batched_tokens, "max_num_seqs": d.max_num_seqs}
                      for ctx, d in per.items()}
        rows.append([g.display_name, f"{g.memory_gib_reported:.1f}",
                     f"{per['serve'].max_num_batched_tokens:,} / {per['serve'].max_num_seqs:,}",
                     f"{per['llm'].max_num_batched_tokens:,} / {per['llm'].max_num_seqs:,}",
                     f"{thr.max_num_batched_tokens:,} / {thr.max_num_seqs:,}"])
    text = "\n".join([
        "max_num_batched_tokens / max_num_seqs when neither flag is given (vLLM 0.33, "
        "EngineArgs.get_batch_defaults, from labs/data/vllm.yaml); memory as the driver reports it.",
        "",
        table(["GPU", "reported GiB", "vllm serve", "LLM class", "vllm serve, --performance-mode throughput"],
              rows, "lrrrr"),
    ])
    return data, text
