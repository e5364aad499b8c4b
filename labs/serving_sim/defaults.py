"""vLLM 0.33's scheduler defaults for a GPU, resolved from labs/data/vllm.yaml.

`--max-num-batched-tokens` and `--max-num-seqs` default to None; EngineArgs
fills them from a table keyed by usage context and the GPU's driver-reported
memory (`batch_defaults` in the facts file, read by labs.vllm_facts, mirrors
vllm/engine/arg_utils.py `get_batch_defaults`), then adjusts them
(`_set_default_max_num_seqs_and_batched_tokens_args`): --performance-mode
throughput doubles both, chunked prefill off raises the token budget to
max_model_len, the budget is capped at max_num_seqs x max_model_len and
max_num_seqs at the budget. This module applies those steps to a GPU from
labs/data/gpus.yaml, so the simulator starts where a real `vllm serve` would.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import vllm_facts
from labs.specs import GPUSpec, SpecError

# Entry points: the simulator's short names -> the names labs.vllm_facts takes.
CONTEXTS = {"serve": "vllm serve", "llm": "LLM"}
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")


@dataclass(frozen=True)
class BatchDefaults:
    gpu: str
    context: str
    max_num_batched_tokens: int
    max_num_seqs: int


def batch_defaults(gpu: GPUSpec, context: str = "serve", *, max_model_len: int | None = None,
                   enable_chunked_prefill: bool = True, performance_mode: str = "balanced") -> BatchDefaults:
    """The (max_num_batched_tokens, max_num_seqs) vLLM picks when neither flag is given."""
    if context not in CONTEXTS:
        raise SpecError(f"usage context must be one of {', '.join(CONTEXTS)}, got {context!r}")
    if performance_mode not in PERFORMANCE_MODES:
        raise SpecError(f"performance mode must be one of {', '.join(PERFORMANCE_MODES)}, got {performance_mode!r}")
    tokens, seqs = (vllm_facts.gpu_batch_default(name, gpu, CONTEXTS[context])
                    for name in ("max_num_batched_tokens", "max_num_seqs"))
    if performance_mode == "throughput":
        tokens, seqs = 2 * tokens, 2 * seqs
    if max_model_len is not None:
        if not enable_chunked_prefill:
            tokens = max(tokens, max_model_len)
        tokens = min(tokens, seqs * max_model_len)
    seqs = min(seqs, tokens)
    return BatchDefaults(gpu.name, context, tokens, seqs)
