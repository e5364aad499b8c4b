"""From memory numbers to a cause and the knob that fixes it. No torch here.

An out-of-memory report is only useful if it says which of the usual causes it
is, because each has a different fix. The numbers that tell them apart:

* total / free: the driver's view (torch.cuda.mem_get_info): free is what a
  new cudaMalloc can still get, from this process or any other.
* reserved / allocated: PyTorch's caching allocator. reserved - allocated is
  memory this process holds but no tensor uses (cached blocks).
* largest_free_block: the largest cached block (torch.cuda.memory_snapshot(),
  blocks in state "inactive"). A request fits the cache only if one block is
  large enough: cached bytes are not contiguous.
* requested: the allocation (or KV budget) that failed.

Scenario-specific numbers, when present, come in `context`: the KV check's
needed vs available bytes, the instances' memory fractions, a prefill's batched
tokens and its measured bytes per token.

Rules, in the order they are tried (the first that holds names the cause):

1. instance fractions summing above 1 -> two-instances (--gpu-memory-utilization)
2. KV needed > KV available -> kv-too-small (--max-model-len / --kv-cache-dtype / utilization)
3. the request fits in free + cached bytes, yet neither the driver nor any one
   cached block can hold it -> fragmentation (expandable_segments)
4. a prefill whose activations exceed the headroom, with a smaller token count
   that would fit -> prefill-activation (--max-num-batched-tokens, chunked prefill)
5. otherwise -> capacity: the memory is really not there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

GIB = 2**30


@dataclass(frozen=True)
class Evidence:
    """What was measured when the failure happened; bytes unless named otherwise."""

    total: int
    free: int
    reserved: int
    allocated: int
    largest_free_block: int
    requested: int
    context: dict = field(default_factory=dict)

    @property
    def cached_unused(self) -> int:
        return self.reserved - self.allocated

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    cause: str
    knob: str
    numbers: dict

    def to_dict(self) -> dict:
        return asdict(self)


def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def diagnose(ev: Evidence) -> Diagnosis:
    """Name the cause of a failed allocation from its numbers."""
    ctx = ev.context

    fractions = ctx.get("instance_fractions")
    if fractions and sum(fractions) > 1:
        # Used memory outside this process's caching allocator: the other instance, plus this process's
        # own CUDA context (PyTorch's message names the other process's share alone).
        other = ev.total - ev.free - ev.reserved
        return Diagnosis(
            "two-instances",
            f"instances ask for {' + '.join(f'{f:g}' for f in fractions)} = {sum(fractions):.2f} of the GPU; "
            f"each --gpu-memory-utilization is a fraction of total memory, and {_gib(other)} is already held "
            f"outside this process's allocator (the other instance and this process's CUDA context)",
            "give each instance --gpu-memory-utilization so that the fractions sum to at most 1 minus the "
            "other processes' share (vLLM 0.33 checks free >= ceil(total x fraction) at startup)",
            {"sum_of_fractions": sum(fractions), "held_by_others": other},
        )

    needed, available = ctx.get("kv_needed"), ctx.get("kv_available")
    if needed is not None and available is not None and needed > available:
        est = ctx.get("estimated_max_model_len")
        return Diagnosis(
            "kv-too-small",
            f"one request of max_model_len {ctx.get('max_model_len')} needs {_gib(needed)} of KV cache, "
            f"the pool has {_gib(available)}",
            f"lower --max-model-len to at most {est}" + (" (vLLM's own estimate)" if est else "")
            + ", or shrink the KV (--kv-cache-dtype fp8), or raise --gpu-memory-utilization, or add GPUs (TP)",
            {"kv_needed": needed, "kv_available": available, "estimated_max_model_len": est},
        )

    fits_in_total = ev.requested <= ev.free + ev.cached_unused
    no_single_fit = ev.requested > ev.free and ev.requested > ev.largest_free_block
    if fits_in_total and no_single_fit and ev.cached_unused >= ev.requested:
        return Diagnosis(
            "fragmentation",
            f"{_gib(ev.cached_unused)} is reserved but unallocated, yet the largest cached block is "
            f"{_gib(ev.largest_free_block)} and the driver has {_gib(ev.free)} free: no contiguous "
            f"{_gib(ev.requested)}",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before CUDA initialises), so freed pages "
            "can be unmapped and remapped contiguously",
            {"cached_unused": ev.cached_unused, "largest_free_block": ev.largest_free_block},
        )

    tokens, per_token = ctx.get("batched_tokens"), ctx.get("activation_bytes_per_token")
    if tokens and per_token:
        # The room the prefill had before it started; at the moment of failure part
        # of it is already taken by the prefill's own live tensors.
        headroom = ctx.get("headroom", ev.free + ev.cached_unused)
        fit_tokens = int(headroom // per_token)
        if 0 < fit_tokens < tokens:
            return Diagnosis(
                "prefill-activation",
                f"a prefill of {tokens} batched tokens needs about {_gib(tokens * per_token)} of activations "
                f"({per_token / 2**10:.0f} KiB per token), only {_gib(headroom)} is left beside the KV pool",
                f"cap the tokens per step: --max-num-batched-tokens at most {fit_tokens} "
                "(chunked prefill splits long prompts into chunks of that size)",
                {"batched_tokens": tokens, "activation_bytes_per_token": per_token, "tokens_that_fit": fit_tokens},
            )

    return Diagnosis(
        "capacity",
        f"{_gib(ev.requested)} requested with {_gib(ev.free)} free on the device and {_gib(ev.cached_unused)} "
        "cached: the memory is not there",
        "use less memory (smaller model or KV pool, quantized weights) or more GPUs",
        {},
    )
