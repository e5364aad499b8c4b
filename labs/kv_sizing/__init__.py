"""KV-cache sizing lab: how many tokens of KV cache a GPU holds under vLLM 0.33.

    from labs.kv_sizing import budget
    b = budget(get_model("llama-3.1-8b"), get_gpu("h200"), 8192)

`formula` holds the torch-free bytes-per-token and bytes-per-block arithmetic;
`memory_budget` itemises the GPU's memory the way vLLM's startup profiling does;
`check` (torch) allocates a pool of the predicted size on a real GPU and compares.
Run `python -m labs.kv_sizing --help` for the calculator.
"""

from labs.kv_sizing.memory_budget import Budget, budget

__all__ = ["Budget", "budget"]
