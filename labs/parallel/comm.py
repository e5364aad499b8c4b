"""Bytes each parallel strategy moves per token, from a model's geometry (no torch).

What is counted, once, for every page and CLI that quotes these figures:

* **TP (Megatron-style, as vLLM's RowParallelLinear does it).** Each decoder
  layer ends two blocks (attention, MLP or MoE) with a row-parallel matmul
  whose partial sums are all-reduced: two all-reduces per layer of
  ``tokens x hidden x b`` bytes, b = 2 for bf16 activations. Each rank sends
  and receives 2(n-1)/n of that message (ring). The embedding's all-reduce
  and the logits' gather run once per step, not per layer, and are left out.
* **PP.** A stage boundary hands over ``hidden_states`` and ``residual``
  (vLLM's IntermediateTensors for Llama-style models, vllm/model_executor/
  models/llama.py): ``2 x hidden x b`` bytes per token, point to point.
* **EP with data-parallel attention (the DeepSeek-V3 recipe), dispatch to owner.**
  Each rank holds its own tokens; a MoE layer sends each token's hidden state
  to the ranks of its k experts (dispatch) and brings the k weighted outputs
  back (combine), as vLLM's DeepEP all-to-all backends do. Counted per copy
  (k per token) and deduplicated per destination rank (a token sent once to a
  rank that holds several of its experts). Under uniform routing (n-1)/n of the
  copies leave the rank. vLLM's default backend, allgather_reducescatter,
  instead gathers every rank's tokens everywhere: the bytes of an all-reduce
  (labs.parallel.plan prices both).

Compared on the same tokens, the ratio of all bytes on the wire, EP over TP, is
k/n per MoE layer when every copy is sent: EP is cheaper when a token's
experts are fewer than the ranks (Mixtral, k = 2), and no cheaper at k = n
(DeepSeek-V3 on 8 GPUs) unless copies to one rank are deduplicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labs import specs
from labs.parallel import alphabeta

ACT_BYTES = 2  # bf16 activations, what vLLM runs these models with
ALL_REDUCES_PER_LAYER = 2
PP_TENSORS = 2  # hidden_states and residual


def tp_message_bytes(model: specs.ModelSpec, tokens: int, act_bytes: int = ACT_BYTES) -> int:
    """The buffer one TP all-reduce reduces: every token's hidden state."""
    return tokens * model.hidden_size * act_bytes


def tp_bytes_per_token_per_rank(model: specs.ModelSpec, tp: int, layers: int | None = None,
                                act_bytes: int = ACT_BYTES) -> float:
    """Bytes one rank sends (and receives) per token over `layers` layers: 2 all-reduces each, ring."""
    layers = model.n_layers if layers is None else layers
    return ALL_REDUCES_PER_LAYER * layers * alphabeta.bus_factor("all_reduce", tp) * model.hidden_size * act_bytes


def pp_bytes_per_token(model: specs.ModelSpec, act_bytes: int = ACT_BYTES) -> int:
    """Bytes one stage boundary carries per token."""
    return PP_TENSORS * model.hidden_size * act_bytes


def moe_layers(model: specs.ModelSpec) -> int:
    if model.moe is None:
        return 0
    return model.n_layers - model.moe.first_dense_layers


def expected_ranks_hit(model: specs.ModelSpec, ep: int) -> float:
    """Expected distinct EP ranks a token's k experts live on, experts spread evenly and chosen uniformly.

    P(a given rank holds none of the k) = C(E - E/ep, k) / C(E, k), so the
    expected count is ep * (1 - that). Used for deduplicated dispatch.
    """
    moe = model.moe
    if moe is None:
        raise alphabeta.ModelError(f"{model.name} has no experts")
    e, k = moe.n_routed_experts, moe.experts_per_token
    if e % ep:
        raise alphabeta.ModelError(f"{model.name}: {e} experts do not divide over EP = {ep}")
    miss = math.comb(e - e // ep, k) / math.comb(e, k)
    return ep * (1 - miss)


@dataclass(frozen=True)
class MoELayerComm:
    """One MoE layer's communication for `tokens` tokens in all, over n GPUs, two ways."""

    model: str
    n: int
    tokens: int
    tp_allreduce_message: int        # bytes each rank's all-reduce reduces (all tokens, replicated)
    tp_bytes_per_rank: float         # sent by each rank: 2(n-1)/n x message
    tp_bytes_total: float            # all ranks together
    ep_tokens_per_rank: int          # tokens each rank owns under DP attention
    ep_copies_per_token: float       # k (every copy sent)
    ep_ranks_per_token: float        # expected distinct ranks (deduplicated)
    ep_bytes_per_rank: float         # dispatch + combine, copies that leave the rank
    ep_bytes_per_rank_dedup: float
    ep_bytes_total: float
    ep_send_buffer: int              # one all-to-all's send buffer per rank: local tokens x k x hidden x b

    @property
    def ratio(self) -> float:
        """EP's bytes on the wire over TP's, every copy sent: k/n."""
        return self.ep_bytes_total / self.tp_bytes_total


def moe_layer_times(c: "MoELayerComm", link: alphabeta.Link, graph: bool = True) -> tuple[float, float]:
    """(TP all-reduce, EP dispatch + combine all-to-all) seconds for one MoE layer (alpha-beta)."""
    tp_t = alphabeta.collective_time("all_reduce", c.tp_allreduce_message, c.n, link, graph)
    ep_t = 2 * alphabeta.collective_time("all_to_all", c.ep_send_buffer, c.n, link, graph)
    return tp_t, ep_t


def moe_layer_comm(model: specs.ModelSpec, n: int, tokens: int, act_bytes: int = ACT_BYTES) -> MoELayerComm:
    """TP all-reduce (TP attention and TP experts) vs EP all-to-all (DP attention, experts split over n)."""
    moe = model.moe
    if moe is None:
        raise alphabeta.ModelError(f"{model.name} is not a mixture-of-experts model")
    if n < 2 or tokens < n or tokens % n:
        raise alphabeta.ModelError(f"need n >= 2 GPUs and a token count that divides over them; got n={n}, "
                                   f"tokens={tokens}")
    h = model.hidden_size
    msg = tokens * h * act_bytes
    tp_rank = alphabeta.bus_factor("all_reduce", n) * msg
    local = tokens // n
    k = moe.experts_per_token
    leave = (n - 1) / n
    ranks = expected_ranks_hit(model, n)
    ep_rank = 2 * local * k * leave * h * act_bytes
    ep_rank_dedup = 2 * local * ranks * leave * h * act_bytes
    return MoELayerComm(model.name, n, tokens, msg, tp_rank, tp_rank * n, local, float(k), ranks,
                        ep_rank, ep_rank_dedup, ep_rank * n, local * k * h * act_bytes)


def tp_step_comm_time(model: specs.ModelSpec, tokens: int, tp: int, link: alphabeta.Link,
                      graph: bool = True, layers: int | None = None) -> float:
    """Seconds of TP all-reduces in one forward pass of `tokens` tokens (alpha-beta)."""
    layers = model.n_layers if layers is None else layers
    return ALL_REDUCES_PER_LAYER * layers * alphabeta.collective_time(
        "all_reduce", tp_message_bytes(model, tokens), tp, link, graph)


@dataclass(frozen=True)
class TPStep:
    """One forward step at TP = tp: the cost model's per-rank floor plus the alpha-beta all-reduces."""

    model: str
    gpu: str
    tp: int
    tokens: int
    kind: str                # "decode" (tokens sequences, one token each) or "prefill" (one sequence)
    floor_s: float           # labs.roofline, one rank, datasheet bandwidth
    comm_s: float
    floor_tp1_s: float

    @property
    def step_s(self) -> float:
        return self.floor_s + self.comm_s

    @property
    def speedup(self) -> float:
        return self.floor_tp1_s / self.step_s

    @property
    def comm_share(self) -> float:
        return self.comm_s / self.step_s


def derived_tp_step(model: str, gpu: str, tp: int, tokens: int, kind: str = "decode", context: int = 1024,
                    link: str = "nvlink-h200", graph: bool = True) -> TPStep:
    """The TP speedup the cost model and the alpha-beta model predict, before any multi-GPU run.

    Communication is added to the floor, not overlapped: vLLM runs the
    all-reduce on the compute stream between the row-parallel matmul and the
    next norm, so nothing hides it.
    """
    from labs import roofline

    def floor(t: int) -> float:
        d = roofline.deployment(model, gpu, tp=t)
        step = d.decode(tokens, context) if kind == "decode" else d.prefill(tokens)
        return step.floor_s

    m = specs.get_model(model)
    c = tp_step_comm_time(m, tokens, tp, alphabeta.get_link(link), graph)
    return TPStep(model, gpu, tp, tokens, kind, floor(tp), c, floor(1))
