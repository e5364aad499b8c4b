"""The worked designs (labs/design.py) against the cost model they are built on."""

from __future__ import annotations

import dataclasses

import pytest

from labs import design as D
from labs import specs


def test_chat_batch_meets_its_caps_and_the_fleet_carries_the_load():
    c = D.design("chat")
    assert 1 <= c.batch <= min(c.batch_by_tpot, c.batch_by_kv)
    assert c.dep.decode(c.batch, c.context).floor_s <= c.tpot_s
    assert c.dep.kv_pool(c.max_model_len).token_slots >= c.batch * c.context
    # requests fit in whole blocks, and block 0 (the null block) is never handed out
    blocks = -(-c.context // c.pool.block_size)
    assert c.batch_by_kv * blocks <= c.pool.num_blocks - 1 < (c.batch_by_kv + 1) * blocks
    assert c.replicas * c.planned_rps >= c.qps
    assert (c.replicas - 1) * c.planned_rps < c.qps  # no replica more than needed
    assert c.gpus == c.replicas * c.dep.tp
    assert c.usd_per_million_output == pytest.approx(c.gpus * c.gpu_hour_usd / (c.qps * 3600 * c.output) * 1e6)


def test_chat_tp_options_are_ordered_by_gpus_and_halving_speed_needs_more_replicas():
    c = D.design("chat")
    options = c.tp_options()
    assert [o.gpus for o in options] == sorted(o.gpus for o in options)
    assert options[0].gpus == c.gpus
    assert c.half_speed().replicas >= c.replicas
    assert c.doubled("qps").replicas >= c.replicas
    with pytest.raises(D.DesignError, match="choose"):
        c.doubled("headroom")


def test_lora_adapter_bytes_match_the_projection_shapes():
    # Llama-3.1-8B, rank 1, TP 1: per layer q, o: 4096+4096; k, v: 4096+1024; gate, up: 4096+14336; down: 14336+4096
    per_layer = 2 * 8192 + 2 * 5120 + 3 * 18432
    assert D.lora_adapter_bytes("llama-3.1-8b", 1) == per_layer * 32 * 2
    assert D.lora_adapter_bytes("llama-3.1-8b", 16) == 16 * D.lora_adapter_bytes("llama-3.1-8b", 1)
    assert D.lora_adapter_bytes("llama-3.1-8b", 16, tp=2) < D.lora_adapter_bytes("llama-3.1-8b", 16)


def test_lora_slots_shrink_the_pool_by_their_bytes():
    lora = D.design("lora")
    lost = lora.pool_without.kv_pool - lora.pool_with.kv_pool
    assert lost == pytest.approx(lora.gpu_slots_bytes, rel=0.01)
    assert lora.doubled("max_lora_rank").gpu_slots_bytes == 2 * lora.gpu_slots_bytes
    assert lora.step_overhead > 1
    with pytest.raises(D.DesignError, match="max_cpu_loras"):
        dataclasses.replace(lora, max_cpu_loras=lora.max_loras - 1)


def test_rag_prefix_hits_and_chunking_come_from_the_cost_model():
    rag = D.design("rag")
    dep = rag.dep
    assert rag.warm_prefill.floor_s == dep.prefill(rag.question, cached=rag.document).floor_s
    assert rag.warm_prefill.floor_s < rag.cold_prefill.floor_s
    assert rag.halved("hit_rate").prefill_s_per_request > rag.prefill_s_per_request
    assert rag.chunked_at(1024).worst_s < rag.chunked_at(8192).worst_s
    assert rag.batch * rag.context + rag.cached_documents * rag.document <= rag.pool.token_slots
    assert rag.transfer_bytes == dep.kv_bytes(rag.prompt) * dep.tp


@pytest.mark.parametrize("bad,message", [
    ({"qps": 0}, "qps must be a positive"),
    ({"prompt": 9000}, "exceeds max_model_len"),
    ({"headroom": 1.5}, "at most 1"),
])
def test_bad_chat_inputs_say_what_is_wrong(bad, message):
    fields = dict(model="llama-3.1-8b", gpu="h200", qps=1, prompt=100, output=100, ttft_s=1, tpot_s=0.05)
    with pytest.raises(D.DesignError, match=message):
        D.ChatDesign(**{**fields, **bad})


def test_assumptions_file_is_checked(tmp_path):
    good = D.load_assumptions()
    assert good.basis == "assumption" and set(good.gpu_hour_usd) <= set(specs.all_gpus())
    bad = tmp_path / "design.yaml"
    bad.write_text("checked: x\nbasis: assumption\nnote: n\ngpu_hour_usd: {h999: 1}\nnetwork_gb_per_s: 50\n")
    with pytest.raises(D.DesignError, match="h999: not a GPU"):
        D.load_assumptions(bad)
    bad.write_text("checked: x\nbasis: assumption\nnote: n\ngpu_hour_usd: {h200: -1}\nnetwork_gb_per_s: 50\n")
    with pytest.raises(D.DesignError, match="positive number of USD"):
        D.load_assumptions(bad)
    with pytest.raises(D.DesignError, match="the worked designs are"):
        D.design("video")


def test_chat_at_tp_matches_the_tp_options():
    c = D.design("chat")
    by_tp = {o.dep.tp: o for o in c.tp_options()}
    assert c.at_tp(2).gpus == by_tp[2].gpus and c.at_tp(2).batch_by_kv == by_tp[2].batch_by_kv
