"""Serving simulator: iteration-level scheduling over a synthetic trace, costed by a roofline.

    python -m labs.serving_sim batching                 # static vs continuous batching
    python -m labs.serving_sim chunked-prefill          # a long prompt vs running decodes (ITL spikes)
    python -m labs.serving_sim preemption               # a KV pool too small: preemptions and recompute
    python -m labs.serving_sim spec-decode --alpha 0.7  # speculative decoding speedup vs alpha, k, batch
    python -m labs.serving_sim knobs --rate 40          # max_num_seqs sweep: throughput vs latency
    python -m labs.serving_sim sampling                 # what the sampler's logits cost per step
    python -m labs.serving_sim defaults                 # vLLM 0.33's batch defaults per GPU

Every number it prints is derived from labs/data (model geometry, GPU datasheet
figures, vLLM defaults) by an ideal roofline: a lower bound to compare policies
with, not a measurement. Runs are seeded and print the same table every time;
--out DIR also writes the data as DIR/<subcommand>.json. Exit code 2 on bad
input, with a message naming the problem.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from labs import cli, specs, vllm_facts
from labs.engine.config import ConfigError
from labs.serving_sim import scenarios
from labs.serving_sim.trace import LengthRange

SUBCOMMANDS = ("batching", "chunked-prefill", "preemption", "spec-decode", "knobs", "sampling", "defaults")


# Upper bounds keep every run short and its memory small (a trace holds one list per request).
MAX_REQUESTS = 20_000
MAX_TRACE_TOKENS = 50_000_000  # requests x (longest prompt + longest output)
MAX_TOKENS = 1 << 24
MAX_SEQS = 65_536
MAX_TRIALS = 1_000_000
MAX_K = 64


def _int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo:,}, {hi:,}], got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo:,}, {hi:,}], got {text!r}")
        return v
    return parse


def _float_in(lo: float, hi: float, *, lo_open: bool = False, allow_inf: bool = False):
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]" + (" or inf" if allow_inf else "")

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}") from None
        if allow_inf and v == math.inf:
            return v
        if not math.isfinite(v) or not (lo < v if lo_open else lo <= v) or v > hi:
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}")
        return v
    return parse


def _ints(hi: int):
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"every value must be >= 1, got {text!r}")
        if any(v > hi for v in values):
            raise argparse.ArgumentTypeError(f"every value must be <= {hi:,}, got {text!r}")
        return values
    return parse


def _cases(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in text.split(","):
        blocks, sep, seqs = item.partition("x")
        try:
            pair = (int(blocks), int(seqs))
        except ValueError:
            raise argparse.ArgumentTypeError(f"cases are BLOCKSxMAX_NUM_SEQS, comma-separated, got {item!r}") from None
        if not sep or min(pair) < 1:
            raise argparse.ArgumentTypeError(f"cases are BLOCKSxMAX_NUM_SEQS with both >= 1, got {item!r}")
        if pair[0] > MAX_TOKENS or pair[1] > MAX_SEQS:
            raise argparse.ArgumentTypeError(f"cases allow at most {MAX_TOKENS:,} blocks and {MAX_SEQS:,} seqs, "
                                             f"got {item!r}")
        out.append(pair)
    return tuple(out)


_tokens = _int_in(1, MAX_TOKENS)
_requests = _int_in(1, MAX_REQUESTS)


def _common(p: argparse.ArgumentParser, *, engine: bool = True, max_num_seqs_default: int | None = None) -> None:
    p.add_argument("--model", default="llama-3.1-8b",
                   help="dense model from labs/data/models.yaml (default: %(default)s)")
    p.add_argument("--gpu", default="h200", help="GPU from labs/data/gpus.yaml (default: %(default)s)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV-cache dtype as vLLM's --kv-cache-dtype: auto, bfloat16, fp8 (default: %(default)s)")
    p.add_argument("--step-overhead-ms", type=_float_in(0, 1000), default=0.0,
                   help="fixed CPU/launch time added to every step, in ms (default: %(default)s, the ideal roofline)")
    p.add_argument("--seed", type=cli.bounded_int(0, 2**63 - 1), default=0,
                   help="seed of the synthetic trace, 0..2**63-1 (default: %(default)s)")
    p.add_argument("--out", metavar="DIR", type=cli.output_dir, help="also write the results as DIR/<subcommand>.json")
    if engine:
        p.add_argument("--max-num-seqs", type=_int_in(1, MAX_SEQS), default=max_num_seqs_default,
                       help="requests per step, as vLLM's flag (default: "
                            + (f"{max_num_seqs_default}" if max_num_seqs_default else "vLLM's default for the GPU") + ")")
        p.add_argument("--max-num-batched-tokens", type=_tokens, default=None,
                       help="token budget per step, as vLLM's flag (default: vLLM's `vllm serve` default for the GPU)")
        p.add_argument("--max-model-len", type=_tokens, default=None,
                       help="longest request in tokens (default: the model's max_position_embeddings)")
        p.add_argument("--gpu-memory-utilization", type=_float_in(0, 1, lo_open=True), default=vllm_facts.resolved_default("gpu_memory_utilization"),
                       help="fraction of GPU memory for this instance, sizes the KV pool (default: %(default)s)")
        p.add_argument("--num-gpu-blocks-override", type=_tokens, default=None,
                       help="KV pool size in blocks instead of the sized pool, as vLLM's flag (default: sized)")


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m labs.serving_sim", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")

    b = sub.add_parser("batching", help="static vs continuous batching on a mixed and an equal-length trace")
    _common(b, max_num_seqs_default=64)
    b.add_argument("--requests", type=_requests, default=400, help="requests in the trace (default: %(default)s)")
    b.add_argument("--prompt-len", default="128:2048", help="prompt tokens, N or LO:HI uniform (default: %(default)s)")
    b.add_argument("--output-len", default="16:512", help="output tokens, N or LO:HI uniform (default: %(default)s)")

    c = sub.add_parser("chunked-prefill", help="decode ITL and long-prompt TTFT with chunked prefill off and on")
    _common(c)
    c.add_argument("--decodes", type=_int_in(1, 4096), default=32, help="requests decoding when the long prompt arrives (default: %(default)s)")
    c.add_argument("--decode-prompt-len", type=_tokens, default=512, help="their prompt length (default: %(default)s)")
    c.add_argument("--long-prompt-len", type=_tokens, default=16384, help="the long prompt's length (default: %(default)s)")
    c.add_argument("--budgets", type=_ints(MAX_TOKENS), default=(512, 2048, 8192),
                   help="max_num_batched_tokens values to try with chunking on (default: 512,2048,8192)")
    c.add_argument("--arrival", type=_float_in(0, 3600, lo_open=True), default=0.5, help="arrival time of the long prompt, s (default: %(default)s)")

    r = sub.add_parser("preemption", help="preemptions and recompute when admitted requests outgrow the KV pool")
    _common(r)
    r.add_argument("--requests", type=_requests, default=64, help="requests, all at t = 0 (default: %(default)s)")
    r.add_argument("--prompt-len", type=_tokens, default=256, help="prompt tokens each (default: %(default)s)")
    r.add_argument("--output-len", type=_tokens, default=1024, help="output tokens each (default: %(default)s)")
    r.add_argument("--cases", type=_cases, default=((2048, 64), (2048, 32), (2048, 24), (6144, 64)),
                   help="BLOCKSxMAX_NUM_SEQS pairs to run (default: 2048x64,2048x32,2048x24,6144x64)")

    s = sub.add_parser("spec-decode", help="speculative decoding speedup against alpha, k and batch size")
    _common(s, engine=False)
    s.add_argument("--draft", default="eagle",
                   help="drafter: eagle (one-layer head), ngram (free), or a model name (default: %(default)s)")
    s.add_argument("--batch", type=_int_in(1, MAX_TOKENS), default=1, help="batch for the alpha x k grid (default: %(default)s)")
    s.add_argument("--context", type=_tokens, default=1024, help="tokens of context per request (default: %(default)s)")
    s.add_argument("--alphas", type=cli.number_list(cli.finite_float(0.0, 1.0)), default=(0.5, 0.6, 0.7, 0.8, 0.9),
                   help="acceptance rates for the grid (default: 0.5,0.6,0.7,0.8,0.9)")
    s.add_argument("--ks", type=_ints(MAX_K), default=(1, 2, 3, 4, 5), help="speculative token counts k (default: 1,2,3,4,5)")
    s.add_argument("--alpha", type=cli.finite_float(0.0, 1.0), default=0.7, help="acceptance rate for the batch sweep (default: %(default)s)")
    s.add_argument("--batches", type=_ints(MAX_TOKENS), default=(1, 16, 64, 256, 1024),
                   help="batch sizes for the sweep (default: 1,16,64,256,1024)")
    s.add_argument("--trials", type=_int_in(1, MAX_TRIALS), default=10000, help="Monte-Carlo steps per check (default: %(default)s)")

    k = sub.add_parser("knobs", help="sweep max_num_seqs on a Poisson trace: throughput vs TPOT vs TTFT")
    _common(k)
    k.add_argument("--requests", type=_requests, default=240, help="requests in the trace (default: %(default)s)")
    k.add_argument("--prompt-len", default="128:2048", help="prompt tokens, N or LO:HI (default: %(default)s)")
    k.add_argument("--output-len", default="16:512", help="output tokens, N or LO:HI (default: %(default)s)")
    k.add_argument("--rate", type=_float_in(0, 1e6, lo_open=True, allow_inf=True), default=40.0, help="Poisson arrival rate, requests/s (default: %(default)s)")
    k.add_argument("--seqs", type=_ints(MAX_SEQS), default=(8, 16, 32, 64, 128, 256),
                   help="max_num_seqs values to sweep (default: 8,16,32,64,128,256)")

    m = sub.add_parser("sampling", help="bytes of the float32 logits per sampler pass vs a decode step")
    _common(m, engine=False)
    m.add_argument("--batches", type=_ints(MAX_TOKENS), default=(1, 64, 256, 1024), help="batch sizes (default: 1,64,256,1024)")
    m.add_argument("--context", type=_tokens, default=1024, help="tokens of context per request (default: %(default)s)")
    m.add_argument("--prompt-logprobs", type=_tokens, default=8192,
                   help="prompt length for the prompt_logprobs line (default: %(default)s)")

    d = sub.add_parser("defaults", help="max_num_batched_tokens / max_num_seqs vLLM 0.33 picks per GPU")
    d.add_argument("--gpus", default=None, help="comma-separated GPU names (default: every GPU in labs/data/gpus.yaml)")
    d.add_argument("--out", metavar="DIR", type=cli.output_dir, help="also write the results as DIR/defaults.json")
    return p


def _setup(a: argparse.Namespace) -> scenarios.Setup:
    if not 0 < a.gpu_memory_utilization <= 1:
        raise specs.SpecError(f"--gpu-memory-utilization must be in (0, 1], got {a.gpu_memory_utilization}")
    limit = specs.get_model(a.model).max_position_embeddings
    if a.max_model_len is not None and a.max_model_len > limit:
        # vLLM 0.33 refuses this at start-up unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.
        raise specs.SpecError(f"argument --max-model-len: {a.model} allows at most {limit:,} tokens "
                              f"(its max_position_embeddings), got {a.max_model_len:,}; vLLM 0.33 refuses a longer "
                              "max_model_len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    s = _sized(a)
    # vllm/config/scheduler.py refuses a token budget below an explicit max_num_seqs (a defaulted one
    # is lowered to the budget, in setup, as vLLM's EngineArgs does).
    if a.max_num_batched_tokens is not None and a.max_num_batched_tokens < s.max_num_seqs:
        raise specs.SpecError(f"argument --max-num-batched-tokens: must be >= max_num_seqs ({s.max_num_seqs}), "
                              f"as vLLM 0.33 requires; got {a.max_num_batched_tokens}")
    return s


def _sized(a: argparse.Namespace) -> scenarios.Setup:
    return scenarios.setup(a.model, a.gpu, max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                           max_model_len=a.max_model_len, kv_cache_dtype=a.kv_cache_dtype,
                           gpu_memory_utilization=a.gpu_memory_utilization,
                           num_gpu_blocks_override=a.num_gpu_blocks_override, overhead_ms=a.step_overhead_ms)


def _bare_setup(a: argparse.Namespace) -> scenarios.Setup:
    """Roofline only (no engine flags): spec-decode and sampling size nothing."""
    return scenarios.setup(a.model, a.gpu, kv_cache_dtype=a.kv_cache_dtype, overhead_ms=a.step_overhead_ms)


def _check_trace_size(a: argparse.Namespace) -> None:
    """Refuse traces whose token lists alone would take gigabytes (requests x longest request)."""
    longest = (LengthRange.parse(a.prompt_len).hi + LengthRange.parse(a.output_len).hi
               if isinstance(a.prompt_len, str) else a.prompt_len + a.output_len)
    if a.requests * longest > MAX_TRACE_TOKENS:
        raise specs.SpecError(f"--requests {a.requests} x {longest:,} tokens (longest prompt + output) is above "
                              f"{MAX_TRACE_TOKENS:,} tokens; use fewer requests or shorter lengths")


def run(a: argparse.Namespace) -> tuple[dict, str]:
    if a.command in ("batching", "knobs", "preemption"):
        _check_trace_size(a)
    if a.command == "batching":
        return scenarios.batching(_setup(a), a.requests, a.prompt_len, a.output_len, a.seed)
    if a.command == "chunked-prefill":
        return scenarios.chunked_prefill(_setup(a), a.decodes, a.decode_prompt_len, a.long_prompt_len, a.budgets,
                                         a.arrival, a.seed)
    if a.command == "preemption":
        return scenarios.preemption(_setup(a), a.requests, a.prompt_len, a.output_len, a.cases, a.seed)
    if a.command == "spec-decode":
        for x in (*a.alphas, a.alpha):
            if not 0 <= x <= 1:
                raise specs.SpecError(f"acceptance rates must be in [0, 1], got {x}")
        return scenarios.spec(_bare_setup(a), a.draft, a.batch, a.context, a.alphas, a.ks, a.alpha, a.batches,
                              a.trials, a.seed)
    if a.command == "knobs":
        return scenarios.knobs(_setup(a), a.requests, a.prompt_len, a.output_len, a.rate, a.seqs, a.seed)
    if a.command == "sampling":
        return scenarios.sampling(_bare_setup(a), a.batches, a.context, a.prompt_logprobs)
    gpus = tuple(a.gpus.split(",")) if a.gpus else None
    return scenarios.defaults(gpus)


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    out = Path(a.out) if a.out else None
    if out is not None and out.exists() and not out.is_dir():
        return _fail(f"--out {a.out} exists and is not a folder")
    try:
        data, text = run(a)
    except (specs.SpecError, ConfigError) as exc:
        return _fail(str(exc))
    print(text)
    if out is not None:
        args = {k: v for k, v in vars(a).items() if k != "out"}
        payload = {"command": a.command, "args": _jsonable(args), "label": scenarios.LABEL,
                   "data": _jsonable(data), "table": text}
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{a.command}.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            return _fail(f"--out {a.out}: cannot write there ({exc.strerror or exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
