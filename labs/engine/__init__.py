"""A small serving engine on the paged-attention kernel: a Llama-family model, vLLM V1-style scheduling.

Modules, in the order a request meets them: ``sequence`` (request state, SamplingParams),
``block_manager`` (KV blocks, prefix caching), ``scheduler`` (what runs each step),
``runner`` (runs a step on the device), ``model`` (the decoder), ``fused`` and ``varlen``
(its Triton kernels), ``sampler``, and ``llm``
(the ``LLM`` front end); ``config`` and ``tokenizer`` hold what they are built from. The
scheduler and block manager are plain Python: the serving simulator runs them without torch.

    from labs.engine import LLM, SamplingParams
    llm = LLM("llama-3.1-8b", n_layers=2)            # seeded random weights
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0))
"""

from labs.engine.sequence import SamplingParams


def __getattr__(name):  # LLM pulls in torch; import it only when asked for
    if name == "LLM":
        from labs.engine.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams"]
