"""The multi-LoRA lab: adapter bytes in the cost model, the row grouping, and both LoRA paths against fp32.

CPU: the Triton kernels run in the interpreter on tiny shapes (fp16 and fp32; the
interpreter has no bf16 arithmetic). GPU: bf16 over many shapes, ranks, adapter counts,
rows without an adapter and uneven groups.
"""

from __future__ import annotations

import pytest

from labs import design, roofline

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from conftest import HAS_CUDA  # noqa: E402

from labs.lora import kernels, lab  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"


# ---------------------------------------------------------------------------
# Cost model
# ---------------------------------------------------------------------------


def test_adapter_bytes_are_rank_times_in_plus_out_per_projection():
    # Llama-3.1-8B: q 4096->4096, k and v 4096->1024, o 4096->4096, gate and up 4096->14336, down 14336->4096
    per_layer = (4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14336) + (14336 + 4096)
    assert roofline.lora_adapter_bytes("llama-3.1-8b", 1) == per_layer * 32 * 2
    assert roofline.lora_adapter_bytes("llama-3.1-8b", 16) == 16 * roofline.lora_adapter_bytes("llama-3.1-8b", 1)
    assert roofline.lora_adapter_bytes("llama-3.1-8b", 8, ("q_proj", "v_proj")) == 8 * (8192 + 5120) * 32 * 2
    assert roofline.lora_adapter_bytes("llama-3.1-8b", 8, ("q_proj",), "float32") == 8 * 8192 * 32 * 4
    # TP 2, default sharding: q keeps A whole and halves B; o halves A and keeps B whole
    assert roofline.lora_adapter_bytes("llama-3.1-8b", 1, ("q_proj", "o_proj"), tp=2) == (4096 + 2048 + 2048 + 4096) * 64
    # the design page's figure is this one
    assert design.lora_adapter_bytes("llama-3.1-8b", 16, tp=2) == roofline.lora_adapter_bytes("llama-3.1-8b", 16, tp=2)


def test_adapter_beside_the_base_weights_rounds_counts_down():
    a = roofline.deployment("llama-3.1-8b", "h200").lora_adapter(16)
    assert a.bytes == roofline.lora_adapter_bytes("llama-3.1-8b", 16)
    assert a.fraction == pytest.approx(a.bytes / a.base_bytes) and a.fraction < 0.01
    assert a.per_base * a.bytes <= a.base_bytes < (a.per_base + 1) * a.bytes
    assert a.fit_gib(1) == 2**30 // a.bytes and a.slots_bytes(4) == 4 * a.slot_bytes


def test_a_gpu_slot_also_holds_the_embedding_and_lm_head_slots():
    """With --lora-target-modules unset vLLM 0.33 wraps embed_tokens and lm_head too: a slot at rank r holds
    the seven projections and A, B of both tables, (vocab + hidden) x r each, bf16, whole on every rank."""
    tables = 2 * 64 * (128_256 + 4_096) * 2
    assert roofline.lora_slot_bytes("llama-3.1-8b", 64) == roofline.lora_adapter_bytes("llama-3.1-8b", 64) + tables
    tp2 = roofline.lora_slot_bytes("llama-3.1-8b", 64, tp=2)
    assert tp2 == roofline.lora_adapter_bytes("llama-3.1-8b", 64, tp=2) + tables  # the tables are not split
    a = roofline.deployment("llama-3.1-8b", "h200").lora_adapter(64, targets=("q_proj", "v_proj"))
    assert a.slot_bytes == roofline.lora_slot_bytes("llama-3.1-8b", 64) > a.bytes  # slots do not follow targets
    assert a.slots_bytes(16) == 16 * a.slot_bytes


@pytest.mark.parametrize("bad, match", [
    (dict(rank=0), "positive integer"), (dict(rank=16, targets=("lm_head",)), "targets must be"),
    (dict(rank=16, dtype="fp8"), "dtype must be"), (dict(rank=16, tp=3), "tensor parallel"),
])
def test_bad_adapter_arguments_name_what_is_allowed(bad, match):
    with pytest.raises(roofline.SpecError, match=match):
        roofline.lora_adapter_bytes("llama-3.1-8b", **bad)
    with pytest.raises(roofline.CostModelError, match="dense models"):
        roofline.lora_adapter_bytes("mixtral-8x7b", 16)


def test_lora_op_reads_each_adapter_once_and_the_activations():
    op = roofline.lora_op("h200", 64, 4096, 4096, 16, 8)
    assert op.flops == 2 * 64 * 16 * 8192
    assert op.bytes == 2 * (8 * 16 * 8192 + 64 * 4096 + 2 * 64 * 4096)
    assert roofline.lora_op("h200", 64, 4096, 4096, 16, 16).bytes > op.bytes  # more adapters, more bytes
    with pytest.raises(roofline.CostModelError, match="at least as many rows"):
        roofline.lora_op("h200", 4, 4096, 4096, 16, 8)


# ---------------------------------------------------------------------------
# Grouping rows by adapter
# ---------------------------------------------------------------------------


def test_plan_groups_rows_by_slot_skips_rows_without_one_and_cuts_tiles():
    ids = torch.tensor([2, -1, 0, 2, 2, -1, 0, 2, 2, 2], dtype=torch.int32)
    p = kernels.plan(torch, ids, block_m=2)
    assert p.adapters == 2 and p.order.tolist() == [2, 6, 0, 3, 4, 7, 8, 9]
    assert p.tile_slot.tolist() == [0, 2, 2, 2] and p.tile_start.tolist() == [0, 2, 4, 6]
    assert p.tile_end.tolist() == [2, 8, 8, 8]
    assert [(s, r.tolist()) for s, r in p.groups] == [(0, [2, 6]), (2, [0, 3, 4, 7, 8, 9])]
    empty = kernels.plan(torch, torch.full((4,), -1, dtype=torch.int32))
    assert empty.adapters == 0 and empty.tile_slot.numel() == 0
    with pytest.raises(ValueError, match="slots >= 0 or -1"):
        kernels.plan(torch, torch.tensor([0, -2]))


# ---------------------------------------------------------------------------
# Both LoRA paths against the fp32 merged-weight reference
# ---------------------------------------------------------------------------


def _problem(tokens, n_in, n_out, rank, slots, dtype, seed, none_share=0.25, skew=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, n_in, generator=g)
    a = torch.randn(slots, rank, n_in, generator=g) / n_in ** 0.5
    b = torch.randn(slots, n_out, rank, generator=g) / rank ** 0.5
    y = torch.randn(tokens, n_out, generator=g)
    if skew:  # uneven groups: slot s drawn with weight 2^-s
        w = torch.tensor([2.0 ** -s for s in range(slots)])
        ids = torch.multinomial(w, tokens, replacement=True, generator=g).to(torch.int32)
    else:
        ids = torch.randint(0, slots, (tokens,), generator=g, dtype=torch.int32)
    ids[torch.rand(tokens, generator=g) < none_share] = kernels.NO_ADAPTER
    return [t.to(DEVICE, dtype) for t in (x, a, b, y)] + [ids.to(DEVICE)]


def _check_both(x, a, b, y, ids, scale, tol, **seg):
    ref = kernels.lora_reference(torch, x, y, a, b, ids, scale)
    delta = (ref - y.float()).norm().clamp_min(1e-6)
    p = kernels.plan(torch, ids)
    for name, out in (("segmented", kernels.lora_segmented(torch, x, y.clone(), a, b, p, scale, **seg)),
                      ("loop", kernels.lora_loop(torch, x, y.clone(), a, b, p, scale))):
        err = ((out.float() - ref).norm() / delta).item()
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"
        untouched = ids == kernels.NO_ADAPTER
        assert torch.equal(out[untouched], y[untouched]), f"{name} changed a row without an adapter"


CPU_CASES = [  # (tokens, in, out, rank, slots, dtype, split_k): small, so the interpreter takes seconds
    (13, 64, 48, 8, 3, torch.float16, None),
    (40, 32, 80, 16, 5, torch.float32, 1),
    (21, 96, 32, 32, 2, torch.float16, 2),
    (9, 32, 32, 64, 4, torch.float32, None),
]


@pytest.mark.parametrize("tokens, n_in, n_out, rank, slots, dtype, split_k", CPU_CASES)
def test_segmented_and_loop_match_fp32_in_the_interpreter(tokens, n_in, n_out, rank, slots, dtype, split_k):
    args = _problem(tokens, n_in, n_out, rank, slots, dtype, seed=tokens, skew=rank == 16)
    _check_both(*args, scale=0.5, tol=2e-3 if dtype == torch.float16 else 1e-5, block_k=32, block_n=32,
                split_k=split_k)


def test_a_batch_without_adapters_is_left_alone():
    x, a, b, y, ids = _problem(6, 32, 32, 8, 2, torch.float32, seed=1, none_share=1.0)
    p = kernels.plan(torch, ids)
    assert torch.equal(kernels.lora_segmented(torch, x, y.clone(), a, b, p), y)


def test_mismatched_shapes_are_refused():
    x, a, b, y, ids = _problem(4, 32, 32, 8, 2, torch.float32, seed=2)
    with pytest.raises(ValueError, match="do not match"):
        kernels.lora_segmented(torch, x, y, a.transpose(1, 2), b, kernels.plan(torch, ids))


# ---------------------------------------------------------------------------
# The benchmark's plain-Python parts
# ---------------------------------------------------------------------------


def test_cases_use_the_models_shapes_and_have_unique_names():
    cs = lab.cases()
    assert lab.shape("q_proj") == (4096, 4096) and lab.shape("gate_proj") == (4096, 14336)
    assert len({(c.experiment, c.name) for c in cs}) == len(cs)
    assert all(c.adapters <= c.tokens for c in cs)
    r = lab.row(cs[0], {"base": 10.0, "loop": 40.0, "segmented": 5.0}, {"base": 8.0, "loop": None, "segmented": 2.0},
                loop_err=1e-3, seg_err=2e-3)
    assert r["loop_overhead"] == 4.0 and r["segmented_overhead"] == 0.5 and r["loop_over_segmented"] == 8.0
    assert r["graph_segmented_overhead"] == 0.25 and r["graph_loop_overhead"] is None
    assert r["adapter_bytes"] == 2 * 16 * (4096 + 4096) and 0 < r["floor_overhead"] < 1
    assert lab.config_name(cs[0].experiment, r) == cs[0].name
    assert "loop ovh" in lab.printed({"adapters": [r]})["adapters"]


# ---------------------------------------------------------------------------
# GPU: bf16 over many shapes
# ---------------------------------------------------------------------------

GPU_CASES = [(t, n_in, n_out, r, s)
             for t, s in ((1, 1), (7, 3), (64, 8), (300, 32), (2048, 16))
             for r in (8, 16, 32, 64)
             for n_in, n_out in ((4096, 4096), (4096, 1024), (1024, 14336))]


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, n_in, n_out, rank, slots", GPU_CASES)
def test_segmented_and_loop_match_fp32_on_the_gpu(tokens, n_in, n_out, rank, slots):
    args = _problem(tokens, n_in, n_out, rank, slots, torch.bfloat16, seed=tokens * rank + slots,
                    skew=tokens % 2 == 0)
    _check_both(*args, scale=2.0, tol=2e-2)
