"""Serve labs.engine over HTTP with OpenAI's API: `python -m labs.server`.

    python -m labs.server --tiny --device cpu --port 8000
    python -m labs.server --model llama-3.1-8b --max-num-seqs 128 --port 8000
    python -m labs.server --weights ~/models/Llama-3.1-8B-Instruct --api-key secret

Without --weights the model has seeded random weights: its text is noise, its timing is
not. --tiny is Llama-3.1-8B's recipe (RoPE, GQA) at a size a CPU runs in milliseconds,
for tests. Every argument is checked before the model is built; a bad one exits 2 with
one line naming it. The server binds 127.0.0.1 unless --host says otherwise.
"""

from __future__ import annotations

import os
import sys

from labs import cli

MAX_SEQS = 4096
MAX_LEN = 1 << 20
TINY = dict(name="tiny-llama", n_layers=2, hidden_size=64, n_heads=4, n_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=512, max_position_embeddings=16384)


def parser() -> cli.Parser:
    p = cli.Parser(prog="python -m labs.server", description=__doc__.split("\n\n")[0])
    m = p.add_argument_group("model")
    m.add_argument("--model", default="llama-3.1-8b", help="a model of labs/data/models.yaml (random weights)")
    m.add_argument("--tiny", action="store_true", help="a tiny model of --model's recipe (for tests on a CPU)")
    m.add_argument("--weights", type=cli.existing_dir, metavar="DIR", help="a local Hugging Face folder")
    m.add_argument("--layers", type=cli.bounded_int(1, 1000), help="keep only the first N layers")
    m.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    m.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    m.add_argument("--seed", type=cli.bounded_int(0, 2**63 - 1), default=0, help="seed of the random weights")
    m.add_argument("--served-model-name", help="the name clients send as 'model' (default: the model's)")
    e = p.add_argument_group("engine (vLLM's flag names)")
    e.add_argument("--max-model-len", type=cli.bounded_int(2, MAX_LEN), default=2048)
    e.add_argument("--max-num-seqs", type=cli.bounded_int(1, MAX_SEQS), default=64)
    e.add_argument("--max-num-batched-tokens", type=cli.bounded_int(1, MAX_LEN), default=2048)
    e.add_argument("--block-size", type=int, choices=(8, 16, 32), default=16)
    e.add_argument("--num-blocks", type=cli.bounded_int(1, 1 << 24), help="KV pool in blocks")
    e.add_argument("--no-cuda-graphs", action="store_true")
    s = p.add_argument_group("server (vLLM's flag names)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=cli.bounded_int(0, 65535), default=8000, help="0 picks a free port")
    s.add_argument("--api-key", action="append", help="a Bearer token to require on /v1 (repeat for several); "
                   "default: $VLLM_API_KEY if set")
    s.add_argument("--max-num-queued-reqs", type=cli.bounded_int(1, 1 << 20),
                   help="refuse (503) a request beyond this many in flight (default: no limit)")
    s.add_argument("--no-warmup", action="store_true",
                   help="skip the start-up pass that captures every decode batch bucket's CUDA graph")
    s.add_argument("--uvicorn-log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug", "trace"))
    return p


def build_llm(a):
    from labs.engine.config import ModelConfig

    cfg = None
    if a.tiny:
        cfg = ModelConfig.from_spec(a.model).replace(**TINY)
    device = a.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    from labs.engine import LLM

    return LLM(a.model, weights=a.weights, model_config=cfg, n_layers=a.layers, dtype=a.dtype, device=device,
               seed=a.seed, decode_attention="triton" if device == "cuda" else "torch",
               cuda_graphs=not a.no_cuda_graphs and device == "cuda", max_model_len=a.max_model_len,
               max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
               block_size=a.block_size, num_blocks=a.num_blocks)


def warm_up(llm) -> None:
    """Run each decode batch bucket once before serving, so no request pays for a graph capture or a kernel compile.

    b requests of 3 tokens each give one prefill step and then decode steps of exactly b
    rows: the bucket for b is captured there (labs/engine/runner.py captures on first use).
    """
    from labs.engine import SamplingParams
    from labs.engine.runner import batch_buckets

    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for b in batch_buckets(llm.config.max_num_seqs):
        llm.generate([[1, 2, 3]] * b, params)
    llm.steps.clear()


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.tiny and a.weights:
        cli.reject(p, "--tiny", "give --tiny or --weights, not both")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            cli.reject(p, "--device", "cuda was asked for and no CUDA GPU is visible")
    from labs.engine.config import ConfigError

    try:
        llm = build_llm(a)
    except ConfigError as exc:
        return cli.fail(str(exc))
    if not a.no_warmup and llm.device.type == "cuda":
        warm_up(llm)
    keys = a.api_key or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else None)

    import uvicorn

    from labs.server.app import build_app

    app = build_app(llm, a.served_model_name, keys, a.max_num_queued_reqs)
    config = uvicorn.Config(app, host=a.host, port=a.port, log_level=a.uvicorn_log_level, access_log=False)
    server = uvicorn.Server(config)
    print(f"serving {a.served_model_name or llm.model_name} on http://{a.host}:{a.port} "
          f"({llm.device}, {llm.config.usable_blocks} KV blocks of {llm.config.block_size})", file=sys.stderr,
          flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
