"""The mixed-step kernels against slow references: varlen paged attention, and RoPE with the cache write.

On the CPU they run in the Triton interpreter (TRITON_INTERPRET=1, conftest.py) on small
shapes; the gpu-marked tests run many more shapes, in fp32, bf16 and fp16, on a GPU.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

torch = pytest.importorskip("torch")

from labs.engine import fused, varlen  # noqa: E402
from labs.engine.model import rotate_half  # noqa: E402
from labs.paged_attention.reference import gather_kv  # noqa: E402


def _reference(q, kc, vc, tables, sizes, starts):
    """Per chunk: gather its context out of the pool, then softmax(q K^T) V in fp32, causal from its start."""
    out, off = torch.empty(q.shape, dtype=torch.float32, device=q.device), 0
    group = q.shape[1] // kc.shape[2]
    for c, (n, start) in enumerate(zip(sizes, starts)):
        ctx = start + n
        k = gather_kv(kc, tables[c], ctx).float().repeat_interleave(group, dim=1)  # (ctx, Hq, d)
        v = gather_kv(vc, tables[c], ctx).float().repeat_interleave(group, dim=1)
        s = torch.einsum("thd,nhd->htn", q[off:off + n].float(), k) / math.sqrt(q.shape[2])
        visible = torch.arange(ctx, device=q.device)[None, :] <= start + torch.arange(n, device=q.device)[:, None]
        s = s.masked_fill(~visible, float("-inf"))
        out[off:off + n] = torch.einsum("htn,nhd->thd", s.softmax(-1), v)
        off += n
    return out


def _case(rng: random.Random, sizes, starts, heads, kv_heads, d, bs, dtype, device):
    """A pool of shuffled blocks (the rest NaN), each chunk's table, and the packed queries."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    need = [-(-(s + n) // bs) for n, s in zip(sizes, starts)]
    width = max(need) + 1
    num_blocks = sum(need) + 3
    kc = torch.full((num_blocks, bs, kv_heads, d), float("nan"), dtype=dtype)
    vc = kc.clone()
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    tables = torch.zeros(len(sizes), width, dtype=torch.int32)
    for c, b in enumerate(need):
        blocks, ids = ids[:b], ids[b:]
        tables[c, :b] = torch.tensor(blocks, dtype=torch.int32)
        kc[blocks] = torch.randn(b, bs, kv_heads, d, generator=g).to(dtype)
        vc[blocks] = torch.randn(b, bs, kv_heads, d, generator=g).to(dtype)
    q = torch.randn(sum(sizes), heads, d, generator=g).to(dtype)
    bq = varlen.block_q(heads, kv_heads)
    meta = dict(q_start=torch.tensor([0, *itertools.accumulate(sizes)], dtype=torch.int32),
                ctx_start=torch.tensor(starts, dtype=torch.int32),
                tiles=torch.tensor(varlen.tile_list(sizes, bq), dtype=torch.int32).view(-1, 2))
    to = lambda x: x.to(device)  # noqa: E731
    return to(q), to(kc), to(vc), to(tables), {k: to(v) for k, v in meta.items()}


def _check(rng, sizes, starts, heads, kv_heads, d, bs, dtype, device, tol):
    q, kc, vc, tables, meta = _case(rng, sizes, starts, heads, kv_heads, d, bs, dtype, device)
    got = varlen.varlen_paged_attention(q, kc, vc, tables, **meta)
    want = _reference(q, kc, vc, tables, sizes, starts)
    assert not got.isnan().any(), "read a slot no table points to"
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


CPU_CASES = [  # (chunk sizes, their start positions, Hq, Hkv, head_dim, block_size)
    ([1, 1, 1], [0, 5, 30], 4, 2, 16, 8),  # decodes only
    ([17, 1, 9], [0, 12, 20], 4, 2, 16, 8),  # a prefill, a decode, a later chunk of a prompt
    ([70], [3], 2, 2, 16, 16),  # more than one tile and more than one key step, MHA
    ([5, 33], [40, 0], 8, 2, 32, 16),  # G = 4 as in Llama 3 8B
    ([3, 6], [2, 0], 3, 1, 16, 8),  # a group of 3: padded to 4 rows
]


@pytest.mark.parametrize("sizes,starts,heads,kv_heads,d,bs", CPU_CASES)
def test_varlen_attention_matches_the_reference_in_the_interpreter(sizes, starts, heads, kv_heads, d, bs):
    _check(random.Random(str(sizes)), sizes, starts, heads, kv_heads, d, bs, torch.float32, "cpu", 1e-5)


def test_rope_and_cache_rotates_q_and_writes_k_and_v_at_their_slots():
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, d, t, bs = 4, 2, 16, 5, 8
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g)
    inv = 1 / 10000 ** (torch.arange(0, d, 2).float() / d)
    f = torch.tensor([0, 7, 8, 30, 2]).float()[:, None] * inv
    emb = torch.cat((f, f), -1)[:, None, :]
    cos, sin = emb.cos(), emb.sin()
    kc = torch.full((6, bs, kv_heads, d), float("nan"))
    vc = kc.clone()
    slots = torch.tensor([9, 17, 40, 3, 0])
    q = fused.rope_and_cache(qkv, cos, sin, heads, kv_heads, d, kc, vc, slots)
    q_ref = qkv[:, :heads * d].view(t, heads, d)
    k_ref = qkv[:, heads * d:(heads + kv_heads) * d].view(t, kv_heads, d)
    v_ref = qkv[:, (heads + kv_heads) * d:].view(t, kv_heads, d)
    torch.testing.assert_close(q, q_ref * cos + rotate_half(q_ref) * sin, rtol=1e-6, atol=1e-6)
    flat_k, flat_v = kc.view(-1, kv_heads, d), vc.view(-1, kv_heads, d)
    torch.testing.assert_close(flat_k[slots], k_ref * cos + rotate_half(k_ref) * sin, rtol=1e-6, atol=1e-6)
    assert torch.equal(flat_v[slots], v_ref)
    others = torch.ones(flat_k.shape[0], dtype=torch.bool)
    others[slots] = False
    assert flat_k[others].isnan().all() and flat_v[others].isnan().all(), "wrote outside the given slots"


def test_varlen_attention_refuses_a_cache_of_another_dtype():
    q = torch.zeros(2, 4, 16)
    kc = torch.zeros(4, 8, 2, 16, dtype=torch.float16)
    z = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="does not fit the cache"):
        varlen.varlen_paged_attention(q, kc, kc, z, z[0], z[0, :1], z)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
def test_varlen_attention_matches_the_reference_on_the_gpu(dtype, tol):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = random.Random(7)
    for i in range(30):  # head counts vary freely; group and block size from a few values (one compile each)
        n = rng.randint(1, 12)
        sizes = [1 if rng.random() < 0.5 else rng.randint(2, 600) for _ in range(n)]
        starts = [rng.randint(0, 900) for _ in range(n)]
        kv_heads = rng.choice([1, 2, 8])
        heads = kv_heads * (4 if i % 2 else 1)
        bs = 16 if i % 3 else 32
        _check(rng, sizes, starts, heads, kv_heads, 128, bs, dtype, "cuda", tol)
