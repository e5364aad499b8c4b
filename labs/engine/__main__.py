"""Run the engine: prompts in, tokens out, and how long a decode step took.

    python -m labs.engine --model llama-3.1-8b --num-prompts 32 --prompt-len 256 --max-tokens 64
    python -m labs.engine --weights ~/models/Llama-3.1-8B-Instruct --prompt "The KV cache is"
    python -m labs.engine --model llama-3.1-8b --layers 2 --device cpu --num-prompts 2 --max-tokens 4

Without --weights the model has seeded random weights (its text is noise; its timing is
not) and prompts are random token ids unless --prompt is given. Progress goes to stderr
every 2 s; results to stdout (--json for a machine-readable copy). Exit code 2 on bad input,
with one line naming the argument.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

from labs import cli
from labs.engine.config import ConfigError, ModelConfig, supported_models
from labs.paged_attention.cache import SUPPORTED_BLOCK_SIZES

MAX_PROMPTS = 4096
MAX_TOKENS = 1 << 20


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _int(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo}, {hi}], got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo}, {hi}], got {v}")
        return v
    return parse


def _float(lo: float, hi: float, lo_open: bool = False):
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}") from None
        if not math.isfinite(v) or not (lo < v if lo_open else lo <= v) or v > hi:
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text}")
        return v
    return parse


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m labs.engine", description=__doc__.split("\n\n")[0],
                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("model")
    m.add_argument("--model", default="llama-3.1-8b",
                   help=f"model from labs/data/models.yaml, random weights (one of: {', '.join(supported_models())})")
    m.add_argument("--weights", metavar="DIR", type=cli.existing_dir, help="local Hugging Face folder (config.json, *.safetensors, tokenizer.json)")
    m.add_argument("--layers", type=_int(1, 1000), help="keep only the first N layers (default: all)")
    m.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="default: bfloat16 on CUDA, float32 on CPU")
    m.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    m.add_argument("--seed", type=_int(0, 2**63 - 1), default=0, help="seed of the random weights and prompts")
    r = p.add_argument_group("requests")
    r.add_argument("--prompt", action="append", help="a prompt (repeat for several); default: random token ids")
    r.add_argument("--num-prompts", type=_int(1, MAX_PROMPTS), default=8, help="random prompts (default: %(default)s)")
    r.add_argument("--prompt-len", type=_int(1, MAX_TOKENS), default=128, help="tokens per random prompt (default: %(default)s)")
    r.add_argument("--max-tokens", type=_int(1, MAX_TOKENS), default=32, help="output tokens per request (default: %(default)s)")
    r.add_argument("--temperature", type=_float(0, 2), default=0.0, help="0 is greedy (default: %(default)s)")
    r.add_argument("--top-p", type=_float(0, 1, lo_open=True), default=1.0, help="(0, 1] (default: %(default)s)")
    r.add_argument("--top-k", type=_int(-1, 1 << 30), default=0, help="0 or -1 is off (default: %(default)s)")
    r.add_argument("--sampling-seed", type=_int(0, 2**63 - 1), help="per-request seed base (default: unseeded)")
    e = p.add_argument_group("engine (vLLM's flag names)")
    e.add_argument("--max-model-len", type=_int(2, 1 << 24), default=2048, help="(default: %(default)s)")
    e.add_argument("--max-num-seqs", type=_int(1, 4096), default=64, help="(default: %(default)s)")
    e.add_argument("--max-num-batched-tokens", type=_int(1, 1 << 24), default=2048, help="(default: %(default)s)")
    e.add_argument("--block-size", type=int, choices=SUPPORTED_BLOCK_SIZES, default=16, help="(default: %(default)s)")
    e.add_argument("--num-blocks", type=_int(1, 1 << 24),
                   help="KV pool in blocks (default: max_num_seqs x max_model_len worth)")
    e.add_argument("--no-chunked-prefill", action="store_true")
    e.add_argument("--no-prefix-caching", action="store_true")
    e.add_argument("--policy", choices=("continuous", "static"), default="continuous")
    e.add_argument("--decode-attention", choices=("triton", "torch"), default="triton",
                   help="paged Triton kernel or the torch reference (default: %(default)s)")
    e.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _check(a: argparse.Namespace) -> str | None:
    """Checks that need more than one argument or the filesystem; the message names the argument."""
    try:
        cfg = ModelConfig.from_hf_folder(a.weights) if a.weights else ModelConfig.from_spec(a.model)
    except ConfigError as exc:
        msg = str(exc)
        return msg if msg.startswith("--weights") or a.weights else f"--model: {msg}"
    if a.layers is not None and a.layers > cfg.n_layers:
        return f"--layers must be in [1, {cfg.n_layers}] for {cfg.name}, got {a.layers}"
    if a.max_model_len > cfg.max_position_embeddings:
        return f"--max-model-len must be <= {cfg.max_position_embeddings} for {cfg.name}, got {a.max_model_len}"
    if not a.prompt and a.prompt_len >= a.max_model_len:
        return f"--prompt-len must be below --max-model-len ({a.max_model_len}), got {a.prompt_len}"
    if a.device is not None:
        kind, _, index = a.device.partition(":")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
            return f"--device must be cpu, cuda or cuda:N, got {a.device!r}"
        import torch

        if kind == "cuda" and not torch.cuda.is_available():
            return "--device cuda: no CUDA GPU visible (torch.cuda.is_available() is False)"
        if index and int(index) >= torch.cuda.device_count():
            return f"--device {a.device}: only {torch.cuda.device_count()} CUDA device(s)"
    return None


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    problem = _check(a)
    if problem:
        return _fail(problem)
    import torch

    from labs.engine.llm import LLM
    from labs.engine.sequence import RequestError, SamplingParams

    try:
        llm = LLM(a.model, weights=a.weights, n_layers=a.layers, dtype=a.dtype, device=a.device, seed=a.seed,
                  decode_attention=a.decode_attention, cuda_graphs=not a.no_cuda_graphs,
                  max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                  max_num_batched_tokens=a.max_num_batched_tokens, block_size=a.block_size, num_blocks=a.num_blocks,
                  enable_chunked_prefill=not a.no_chunked_prefill, enable_prefix_caching=not a.no_prefix_caching,
                  policy=a.policy)
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc))
    except torch.cuda.OutOfMemoryError:
        return _fail("out of GPU memory building the model and KV pool: lower --num-blocks, --max-num-seqs "
                     "or --max-model-len")
    if a.prompt:
        prompts = list(a.prompt)
    else:
        g = torch.Generator().manual_seed(a.seed)
        prompts = torch.randint(0, min(llm.model.cfg.vocab_size, 256) if not a.weights else llm.model.cfg.vocab_size,
                                (a.num_prompts, a.prompt_len), generator=g).tolist()
    params = [SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                             seed=None if a.sampling_seed is None else a.sampling_seed + i)
              for i in range(len(prompts))]
    t0 = time.perf_counter()
    try:
        outs = llm.generate(prompts, params, progress=True)
    except RequestError as exc:
        return _fail(str(exc))
    wall = time.perf_counter() - t0
    bad = [o for o in outs if o.error]
    decode = [s.seconds * 1e3 for s in llm.steps if s.decode_only]
    n_out = sum(len(o.token_ids) for o in outs)
    summary = {
        "model": llm.model_name, "layers": llm.model.cfg.n_layers, "device": str(llm.device),
        "dtype": str(next(llm.model.parameters()).dtype).removeprefix("torch."),
        "requests": len(outs), "refused": len(bad), "output_tokens": n_out, "seconds": wall,
        "output_tok_per_s": n_out / wall if wall > 0 else None, "steps": len(llm.steps),
        "preemptions": llm.scheduler.preemptions, "prefix_hit_tokens": llm.blocks.hit_tokens,
        "cuda_graph_buckets": sorted(llm.runner.graphs),
        "decode_step_ms": {"steps": len(decode), "median": statistics.median(decode) if decode else None,
                           "min": min(decode) if decode else None,
                           "mean": statistics.fmean(decode) if decode else None},
    }
    if a.json:
        summary["outputs"] = [{"request_id": o.request_id, "token_ids": o.token_ids, "text": o.text,
                               "finish_reason": o.finish_reason, "error": o.error} for o in outs]
        print(json.dumps(summary, indent=2))
    else:
        for o in outs[:8]:
            shown = o.error and f"error: {o.error}" or repr(o.text[:60])
            print(f"[{o.request_id}] {len(o.prompt_token_ids)} prompt tokens -> {len(o.token_ids)} tokens: {shown}")
        if len(outs) > 8:
            print(f"... {len(outs) - 8} more")
        d = summary["decode_step_ms"]
        print(f"{summary['model']} ({summary['layers']} layers, {summary['dtype']}) on {summary['device']}: "
              f"{len(outs)} requests, {n_out:,} output tokens in {wall:.2f} s ({summary['output_tok_per_s']:,.1f} tok/s), "
              f"{len(llm.steps)} steps, {summary['preemptions']} preemptions")
        if decode:
            print(f"decode step: median {d['median']:.3f} ms, min {d['min']:.3f} ms over {d['steps']} decode-only "
                  f"steps (CUDA graph buckets {summary['cuda_graph_buckets'] or 'none'})")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
