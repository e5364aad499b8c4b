"""Tests for the PagedAttention decode lab: allocator, kernel against reference, and SDPA.

The same kernel tests run on two machines. Without CUDA, conftest sets TRITON_INTERPRET=1
and they run in the Triton interpreter on small shapes in fp16 and fp32 (the interpreter
has no bf16 arithmetic). Tests marked `gpu` repeat the grid at real sizes in bf16 and
fp16, up to 32k tokens, and compare with PyTorch's SDPA.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from labs.paged_attention.cache import (
    NULL_BLOCK,
    BlockAllocator,
    BlockTables,
    OutOfBlocksError,
)

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from labs.paged_attention.cache import PagedKVCache  # noqa: E402
from labs.paged_attention.kernel import (  # noqa: E402
    FP8_DTYPE,
    MAX_SPLITS,
    MIN_WAVE_FILL,
    choose_num_splits,
    chunked_plan,
    flat_plan,
    fold_groups,
    paged_decode,
    plan_splits,
    split_reduce_kernel,
    split_targets,
    wave_fill,
)
from labs.paged_attention.reference import gather_kv, paged_decode_ref  # noqa: E402
from labs.paged_attention.workload import make_problem  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Tolerances against the fp32 reference, per input dtype, as (atol, rtol).
# Start: torch.testing.assert_close's defaults (fp16 rtol 1e-3, bf16 rtol 1.6e-2, fp32
# rtol 1.3e-6, atol 1e-5 for all). Widened for low precision because the kernel rounds
# the softmax weights P to the input dtype before P @ V (as FlashAttention does) and
# rounds the output once more: two roundings of unit size 2**-11 (fp16) or 2**-8 (bf16)
# on outputs of magnitude <= ~1, so atol = rtol = 4 units of fp16 and 4 units of bf16.
TOLERANCES = {
    torch.float32: (1e-5, 1.3e-6),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

# ----------------------------------------------------------------------------------
# Grids. One dimension per decorator.
BLOCK_SIZES = [1, 8, 16, 32]
GQA_RATIOS = [1, 4, 8]  # query heads per KV head
SPLITS = [1, 3]  # 1: one program per (sequence, KV head); 3: split-K with the reduction
CPU_DTYPES = [torch.float16, torch.float32]  # the interpreter has no bf16 arithmetic
GPU_DTYPES = [torch.bfloat16, torch.float16]
GPU_SPLITS = [None, 1]  # None: the launcher's heuristic from the SM count

# Small shapes for the interpreter: it runs every program in NumPy, so cost grows with
# B * Hkv * splits * tiles. 2 KV heads, head_dim 32, 16-token tiles keep the file
# under a minute on 2 cores while still running several tiles per split.
CPU_KV_HEADS = 2
CPU_HEAD_DIM = 32
CPU_TILE_N = 16


def ragged_lens(block_size: int, long: int) -> list[int]:
    """Lengths that hit every edge: 1 token, a block minus one, a block plus one, long ones.

    The long sequence comes first: it donates the shared prefix blocks, which the
    sequences longer than the prefix (at least long // 2 + 1) then reuse.
    """
    return [long, 1, max(block_size - 1, 2), block_size + 1, 2 * block_size + 3, long // 2 + 1]


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """assert_close with the dtype's tolerance; on failure, name the worst (sequence, head)."""
    atol, rtol = TOLERANCES[dtype]
    out = out.float()
    assert torch.isfinite(out).all(), f"{what}: non-finite output at {torch.nonzero(~torch.isfinite(out))[:5].tolist()}"
    err = (out - ref).abs()
    worst = torch.nonzero(err == err.max())[0].tolist()
    torch.testing.assert_close(
        out, ref, atol=atol, rtol=rtol,
        msg=lambda m: f"{what}: worst at (seq, head, dim) = {worst}, |diff| = {err.max():.3g}\n{m}",
    )


def run_case(problem, **kwargs) -> torch.Tensor:
    return paged_decode(
        problem.q, problem.k_cache, problem.v_cache, problem.block_tables, problem.seq_lens,
        max_seq_len=problem.max_seq_len, **problem.kernel_kwargs(), **kwargs,
    )


def reference(problem) -> torch.Tensor:
    """fp32 attention on what the cache holds (dequantised first when it is fp8)."""
    return paged_decode_ref(problem.q, problem.k_cache, problem.v_cache, problem.block_tables, problem.seq_lens,
                            **problem.kernel_kwargs())


# fp8 against fp32 on the values before quantisation: e4m3 keeps 3 mantissa bits, so a
# stored value is off by at most 2**-4 of itself; on random data the output's relative
# error lands near 3-5%. The line is one unit in the last place, 2**-3. Against the
# dequantising reference the kernel's error is the query dtype's (TOLERANCES): every
# e4m3 value is exact in fp16 and bf16, so the kernel rounds nothing more than with a
# 16-bit cache.
FP8_QUANT_REL_ERR = 2.0**-3


def random_lens(rng, batch: int, longest: int) -> list[int]:
    """Lengths spread over 1..longest, the first one the longest (it donates shared blocks)."""
    return [longest] + [rng.randint(1, longest) for _ in range(batch - 1)]


# ----------------------------------------------------------------------------------
# Allocator and block tables (plain Python, no torch needed, but grouped here).


def test_allocator_never_hands_out_the_null_block():
    allocator = BlockAllocator(8)
    blocks = allocator.allocate(7)
    assert NULL_BLOCK not in blocks
    assert sorted(blocks) == list(range(1, 8))
    assert allocator.num_free == 0


def test_allocator_exhaustion_names_the_numbers():
    allocator = BlockAllocator(5)
    allocator.allocate(3)
    with pytest.raises(OutOfBlocksError, match=r"asked for 2 blocks but only 1 are free"):
        allocator.allocate(2)
    assert allocator.num_free == 1, "a failed allocation must not take any block"


def test_allocator_reuses_the_block_freed_last():
    allocator = BlockAllocator(6)
    a, b, c = allocator.allocate(3)
    allocator.free([a, c])
    assert allocator.allocate(1) == [c]


def test_refcounts_keep_shared_blocks_until_last_user():
    allocator = BlockAllocator(4)
    (block,) = allocator.allocate(1)
    allocator.share([block])
    assert allocator.refcount(block) == 2
    allocator.free([block])
    assert allocator.refcount(block) == 1 and allocator.num_free == 2
    allocator.free([block])
    assert allocator.refcount(block) == 0 and allocator.num_free == 3


def test_allocator_rejects_double_free_and_sharing_free_blocks():
    allocator = BlockAllocator(4)
    (block,) = allocator.allocate(1)
    allocator.free([block])
    with pytest.raises(ValueError, match="already free"):
        allocator.free([block])
    with pytest.raises(ValueError, match="it is free"):
        allocator.share([block])
    with pytest.raises(ValueError, match="null block"):
        allocator.free([NULL_BLOCK])


def test_slot_mapping_is_block_times_size_plus_offset():
    allocator = BlockAllocator(10)
    tables = BlockTables(allocator, block_size=8)
    slots = tables.append(0, 11)
    blocks = tables.blocks(0)
    assert slots == [blocks[t // 8] * 8 + t % 8 for t in range(11)]
    more = tables.append(0, 6)  # fills block 2's slots 3..7, then one slot of a new block
    blocks = tables.blocks(0)
    assert len(blocks) == 3 and more == [blocks[t // 8] * 8 + t % 8 for t in range(11, 17)]


def test_fork_shares_whole_blocks_and_free_returns_them_last():
    allocator = BlockAllocator(10)
    tables = BlockTables(allocator, block_size=8)
    tables.append(0, 20)  # 3 blocks
    tables.fork(0, 1, 16)  # shares 2 blocks
    assert tables.blocks(1) == tables.blocks(0)[:2]
    assert [allocator.refcount(b) for b in tables.blocks(0)] == [2, 2, 1]
    new_slot = tables.append(1, 1)[0]
    assert new_slot // 8 not in tables.blocks(0), "a forked sequence writes into a block of its own"
    with pytest.raises(ValueError, match="whole blocks"):
        tables.fork(0, 2, 12)
    free_before = allocator.num_free
    tables.free(0)
    assert allocator.num_free == free_before + 1  # only the unshared block comes back
    tables.free(1)
    assert allocator.num_free == allocator.num_usable


def test_failed_append_leaves_the_tables_unchanged():
    allocator = BlockAllocator(3)
    tables = BlockTables(allocator, block_size=8)
    tables.append(0, 8)
    with pytest.raises(OutOfBlocksError):
        tables.append(0, 17)  # needs 3 more blocks, 1 is free
    assert tables.seq_len(0) == 8 and len(tables.blocks(0)) == 1 and allocator.num_free == 1


def test_allocator_module_does_not_import_torch():
    code = "import sys, labs.paged_attention.cache; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cache_write_stores_tokens_at_their_slots():
    cache = PagedKVCache(2, 6, 8, 2, 4, torch.float32, "cpu")  # 2 layers, 6 blocks of 8
    cache.fill_(float("nan"))
    k = torch.randn(3, 2, 4)
    v = torch.randn(3, 2, 4)
    cache.write(1, [5, 12, 47], k, v)  # slot = block * 8 + offset
    assert torch.equal(cache.k[1][0, 5], k[0]) and torch.equal(cache.k[1][1, 4], k[1])
    assert torch.equal(cache.v[1][5, 7], v[2])
    assert cache.k[0].isnan().all(), "writing layer 1 must not touch layer 0"
    assert cache.bytes_per_block == 2 * 2 * 8 * 2 * 4 * 4


# ----------------------------------------------------------------------------------
# Split heuristic (pure arithmetic).


def test_split_heuristic_fills_the_gpu_for_small_batches():
    # 132 SMs x 4 resident programs = 528 slots. B=1 with 8 KV heads is 8 programs unsplit.
    # 64 tiles, at least MIN_SPLIT_TILES = 2 per split: 32 splits, 256 of 528 slots.
    assert choose_num_splits(1, 8, 4096, 132, tile_n=64, programs_per_sm=4) == 32
    assert choose_num_splits(1, 8, 32768, 132, tile_n=64, programs_per_sm=4) == 60  # 480 of 528 slots
    assert choose_num_splits(32, 8, 4096, 132, tile_n=64, programs_per_sm=4) == 2  # 512 programs
    assert choose_num_splits(16, 8, 32768, 132, tile_n=64, programs_per_sm=4) == 4


def test_split_heuristic_avoids_a_part_filled_last_wave():
    # 1024 programs = 1.94 waves of 528: already full enough, no split.
    assert choose_num_splits(128, 8, 2048, 132, programs_per_sm=4) == 1
    # 200 programs = 0.38 of a wave; splitting 3 ways gives 600 = 1.14 waves (fill 0.57),
    # 5 ways 1000 = 1.89 waves (fill 0.95): the heuristic takes 5.
    assert wave_fill(200 * 3, 528) < MIN_WAVE_FILL <= wave_fill(200 * choose_num_splits(25, 8, 4096, 132), 528)
    assert choose_num_splits(25, 8, 4096, 132) == 5


def test_split_heuristic_leaves_a_half_full_wave_unsplit():
    # 384 programs fill 0.73 of a wave: splitting to fill it cut each split to 4 tiles and
    # ran slower on the H200 (82.2 vs 63.2 us at B=96, L=1024, 4 KV heads).
    assert choose_num_splits(96, 4, 1024, 132, tile_n=64, programs_per_sm=4) == 1
    assert choose_num_splits(32, 8, 4096, 132, tile_n=64, programs_per_sm=4) == 2  # 256: under half


def test_split_heuristic_never_splits_below_two_tiles():
    assert choose_num_splits(4, 8, 1, 132) == 1  # one token: one tile, one split
    assert choose_num_splits(1, 1, 100, 132, tile_n=64) == 1  # 2 tiles: one split of both
    assert choose_num_splits(1, 1, 300, 132, tile_n=64) == 2  # 5 tiles: 2 splits of 2-3
    assert choose_num_splits(1, 1, 10**6, 10**4) <= MAX_SPLITS


# ----------------------------------------------------------------------------------
# Kernel against the reference, small shapes (interpreter on CPU, or the GPU).


@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("gqa", GQA_RATIOS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_kernel_matches_reference(dtype, block_size, gqa, num_splits):
    """Ragged lengths, random block order, shared prefix blocks, NaN in every unused slot."""
    lens = ragged_lens(block_size, long=3 * max(block_size, 16) + 5)
    problem = make_problem(
        lens, CPU_KV_HEADS * gqa, CPU_KV_HEADS, CPU_HEAD_DIM, block_size, dtype, DEVICE,
        shared_prefix_blocks=max(16 // block_size, 1),  # 16 tokens, or one block of 32
    )
    assert problem.shared_blocks > 0, "the grid must cover blocks shared between sequences"
    table0 = problem.block_tables[0, : -(-lens[0] // block_size)].tolist()
    assert table0 != sorted(table0), "block tables must not be in physical order"
    out = run_case(problem, num_splits=num_splits, tile_n=CPU_TILE_N)
    assert_matches(out, reference(problem), dtype, f"lens={lens}")


@pytest.mark.parametrize("num_splits", [8, MAX_SPLITS])
def test_more_splits_than_blocks(num_splits):
    """Empty splits write (0, -inf); the reduction must give them zero weight, not NaN."""
    problem = make_problem([5, 1, 17], 8, 2, CPU_HEAD_DIM, 8, torch.float16, DEVICE)
    out = run_case(problem, num_splits=num_splits, tile_n=CPU_TILE_N)
    assert_matches(out, reference(problem), torch.float16, f"num_splits={num_splits}")


def test_reduction_gives_empty_splits_zero_weight_even_over_nan():
    """Splits with lse = -inf hold no keys; whatever sits in their partial output is ignored."""
    if DEVICE == "cpu":
        from labs.paged_attention.interpreter_compat import patch_interpreter_index

        patch_interpreter_index()
    heads, splits, d = 2, 4, 16
    # One sequence of 4 tiles, a target of 4 splits: the plan gives it splits 0..3.
    seq_lens = torch.tensor([4 * 16], dtype=torch.int32, device=DEVICE)
    assert plan_splits([64], (4, 4), 16) == [splits]
    part = torch.randn(splits + 1, heads, d, device=DEVICE)
    lse = torch.tensor([[1.0, float("-inf"), 0.5, float("-inf"), 0.0]] * heads, device=DEVICE).T.contiguous()
    part[1] = float("nan")  # an empty split's slot holding garbage
    part[3] = float("nan")
    out = torch.empty(1, heads, d, device=DEVICE)
    split_reduce_kernel[(1, heads)](part, lse, out, seq_lens, 1, 4, 4, 64, 0, 0, 0, out.stride(0), out.stride(1),
                                    HEAD_DIM=d, D_PAD=d, B_PAD=1, TILE_N=16, S_CHUNK=2, S_SMALL=2, CHUNKED=False,
                                    RANK_MAX=0, FLAT=False, FOLD=0, USE_GDC=False)
    w = torch.exp2(lse[[0, 2], 0] - 1.0)
    expected = (w[0] * part[0] + w[1] * part[2]) / w.sum()
    torch.testing.assert_close(out[0], expected)


def test_context_length_one_with_split():
    problem = make_problem([1, 1, 1], 8, 2, CPU_HEAD_DIM, 16, torch.float16, DEVICE)
    out = run_case(problem, num_splits=4, tile_n=CPU_TILE_N)
    # One token: softmax weight 1, so the output is exactly that token's V, rounded.
    v0 = torch.stack([gather_kv(problem.v_cache, problem.block_tables[b], 1)[0] for b in range(3)])
    torch.testing.assert_close(out, v0.repeat_interleave(4, dim=1), atol=0, rtol=0)


def test_block_size_1_agrees_with_block_size_16():
    a = make_problem([40, 3, 17], 8, 2, CPU_HEAD_DIM, 16, torch.float16, DEVICE, seed=7)
    b = make_problem([40, 3, 17], 8, 2, CPU_HEAD_DIM, 1, torch.float16, DEVICE, seed=7)
    # Same seed draws the same K/V values for each token, whatever the block size.
    for s in range(3):
        assert torch.equal(gather_kv(a.k_cache, a.block_tables[s], a.lens[s]), gather_kv(b.k_cache, b.block_tables[s], b.lens[s]))
    out_a = run_case(a, num_splits=2, tile_n=CPU_TILE_N)
    out_b = run_case(b, num_splits=2, tile_n=CPU_TILE_N)
    # Same tiles in the same order: the arithmetic is identical, so the bits are too.
    torch.testing.assert_close(out_a, out_b, atol=0, rtol=0)


def test_result_does_not_depend_on_unused_slots():
    outs = []
    for fill in (float("nan"), 1e4, -1e4):
        problem = make_problem([9, 20], 8, 2, CPU_HEAD_DIM, 8, torch.float16, DEVICE, fill=fill, seed=3)
        outs.append(run_case(problem, num_splits=2, tile_n=CPU_TILE_N))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)
    torch.testing.assert_close(outs[0], outs[2], atol=0, rtol=0)


def test_head_dim_not_a_power_of_two():
    problem = make_problem([23, 5], 4, 2, 40, 8, torch.float16, DEVICE)  # padded to 64, masked
    out = run_case(problem, num_splits=2, tile_n=CPU_TILE_N)
    assert_matches(out, reference(problem), torch.float16, "head_dim=40")


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("group", [1, 3, 7, 16])
def test_group_sizes_on_ragged_lengths(group, num_splits):
    """Groups that are not powers of 2 leave padding rows in the tile; none may leak out."""
    lens = random_lens(__import__("random").Random(group), 5, 70)
    problem = make_problem(lens, 2 * group, 2, CPU_HEAD_DIM, 8, torch.float16, DEVICE, seed=group)
    out = run_case(problem, num_splits=num_splits, tile_n=CPU_TILE_N)
    assert_matches(out, reference(problem), torch.float16, f"group={group} lens={lens}")


def test_split_counts_follow_the_lengths():
    """The plan gives long sequences more splits: 4,000 tokens next to 100-token ones."""
    lens = [4000, 100, 100, 100, 1]
    counts = plan_splits(lens, (40, 40), 16)
    assert counts[0] == 38 and counts[1:] == [1, 1, 1, 1]
    assert plan_splits(lens, (400, 400), 16)[0] == 64, "no sequence gets more than SPLIT_CAP"
    assert sum(counts) <= 40 + len(lens), "the grid holds target + batch splits"
    assert plan_splits([512] * 4, (12, 40), 16) == [3] * 4, "equal lengths use the uniform target"
    assert plan_splits([5, 3], (2, 2), 16) == [1, 1], "target <= batch: no split at all"


CHUNKED_CASES = [
    # (lengths, targets, tile, cap, rank_max)
    ([4000, 100, 100, 0, 1, 4096, 33, 100], (16, 40), 16, 64, 256),  # ties, a zero, one exact chunk
    ([131072] + [512] * 63, (128, 528), 32, 128, 256),  # one long sequence: longer chunks, at most cap
    (list(range(1, 3000, 97)), (31, 200), 32, 128, 4),  # past rank_max: sequence order
    ([700, 700, 700, 5], (8, 8), 16, 64, 256),
]


@pytest.mark.parametrize(("lens", "targets", "tile", "cap", "rank_max"), CHUNKED_CASES)
def test_chunked_plan_covers_every_token_once_full_chunks_first(lens, targets, tile, cap, rank_max):
    """The CUDA kernel's ragged plan: equal chunks in sequence order, then the remainders,
    longest first (sequence order past rank_max), within the grid the host sized."""
    items = chunked_plan(lens, targets, tile, cap, rank_max)
    assert len(items) <= max(targets) + len(lens), "the grid holds target + batch items"
    spans: dict[int, list[tuple[int, int]]] = {}
    for seq, lo, hi in items:
        assert lo % tile == 0 and (lo < hi or lens[seq] == 0)
        spans.setdefault(seq, []).append((lo, hi))
    for seq, n in enumerate(lens):
        cover = sorted(spans[seq])
        assert cover[0][0] == 0 and cover[-1][1] == n, f"sequence {seq} not covered: {cover}"
        assert all(a[1] == b[0] for a, b in zip(cover, cover[1:])), f"sequence {seq}: gaps or overlaps {cover}"
        assert len(cover) <= cap
    # The rule, stated once more: one chunk size (longer where cap chunks would not hold a
    # sequence), the full chunks in sequence order, then one remainder per sequence.
    chunk = tile * -(-sum(lens) // (targets[1] * tile))
    sizes = [max(chunk, tile * -(-(-(-n // tile)) // cap)) for n in lens]  # ceil(ceil(n / tile) / cap) tiles
    full = [(seq, j * size, (j + 1) * size) for seq, (n, size) in enumerate(zip(lens, sizes)) for j in range(n // size)]
    assert items[:len(full)] == full, "full chunks first, in sequence order"
    rests = items[len(full):]
    assert sorted(seq for seq, _, _ in rests) == [seq for seq, n in enumerate(lens) if n % sizes[seq] or n == 0]
    lengths = [hi - lo for _, lo, hi in rests]
    if len(lens) <= rank_max:
        assert lengths == sorted(lengths, reverse=True), "remainders longest first"
    else:
        assert [seq for seq, _, _ in rests] == sorted(seq for seq, _, _ in rests), "remainders in sequence order"


def test_chunked_plan_keeps_equal_lengths_proportional():
    items = chunked_plan([512] * 4, (12, 40), 16, 64)
    assert [s for s, _, _ in items] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], "3 splits each, in sequence order"
    assert chunked_plan([5, 3], (2, 2), 16, 64) == [(0, 0, 5), (1, 0, 3)], "target <= batch: one item each"
    assert chunked_plan([0, 0], (4, 8), 16, 64) == [(0, 0, 0), (1, 0, 0)], "all empty: one zero item each"


@pytest.mark.parametrize("rank_max", [256, 2])
def test_reduction_follows_the_chunked_plan(rank_max):
    """split_reduce_kernel with CHUNKED finds each sequence's rows where chunked_plan put them
    (the CUDA kernel writes them there); rows of one-item sequences are left to the kernel."""
    if DEVICE == "cpu":
        from labs.paged_attention.interpreter_compat import patch_interpreter_index

        patch_interpreter_index()
    lens, targets, tile, cap = [300, 16, 0, 130, 300, 47], (6, 24), 16, 64
    items = chunked_plan(lens, targets, tile, cap, rank_max)
    heads, d = 2, 16
    gen = torch.Generator().manual_seed(7)
    part = torch.randn(len(items), heads, d, generator=gen).to(DEVICE)
    lse = (4 * torch.rand(len(items), heads, generator=gen)).to(DEVICE)
    out = torch.full((len(lens), heads, d), 123.0, device=DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    split_reduce_kernel[(len(lens), heads)](
        part, lse, out, seq_lens, len(lens), targets[0], targets[1], cap, 0, 0, 0, out.stride(0), out.stride(1),
        HEAD_DIM=d, D_PAD=d, B_PAD=8, TILE_N=tile, S_CHUNK=4, S_SMALL=2, CHUNKED=True, RANK_MAX=rank_max,
        FLAT=False, FOLD=0, USE_GDC=False)
    for seq in range(len(lens)):
        rows = [k for k, (s, _, _) in enumerate(items) if s == seq]
        if len(rows) == 1:
            assert (out[seq] == 123.0).all(), f"sequence {seq} has one item: the kernel writes it, not the reduction"
            continue
        w = torch.exp2(lse[rows] - lse[rows].max(dim=0).values)  # (splits, heads)
        expected = (w[:, :, None] * part[rows]).sum(0) / w.sum(0)[:, None]
        torch.testing.assert_close(out[seq], expected, msg=f"sequence {seq}, rows {rows}")


@pytest.mark.parametrize("lens, programs, min_units, weight, fold", [
    ([300, 16, 0, 130, 300, 47], 5, 2, 0, 0),
    ([300, 16, 0, 130, 300, 47], 7, 1, 2, 0),
    ([4096] * 3, 7, 2, 1, 0),
    ([1, 1, 1, 1, 2000], 4, 3, 1, 0),
    ([64, 64, 64, 64, 64, 65], 16, 1, 3, 0),
    ([40] * 3, 7, 1, 2, 0),  # equal and short: 2 tiles each caps the target's 3 splits
    ([0] * 3, 5, 2, 2, 0),  # equal and empty: one split each, written by the kernel
    # The fold: 12 pieces of the long sequence in groups of 4, 6, 3 (the last group short),
    # the 700-token one's 3 in groups of 2 and 1 at fold 2; equal lengths never fold.
    ([3000, 40, 0, 700, 50], 16, 1, 2, 3),
    ([3000, 40, 0, 700, 50], 16, 1, 2, 2),
    ([3000, 40, 0, 700, 50], 16, 1, 2, 5),
    ([3000, 40, 0, 700, 50], 16, 1, 2, 16),  # nothing past the fold: as without one
    ([4096] * 3, 7, 2, 1, 2),
])
def test_reduction_follows_the_flat_plan(lens, programs, min_units, weight, fold):
    """split_reduce_kernel with FLAT finds each sequence's pieces in the rows flat_plan gives
    them (the CUDA kernel writes them there); a sequence in one piece is the kernel's. With
    FOLD it reads only each group's first row, where the kernel combined the group
    (fold_groups; simulated here, every other member's row set to NaN)."""
    if DEVICE == "cpu":
        from labs.paged_attention.interpreter_compat import patch_interpreter_index

        patch_interpreter_index()
    targets, cap, tile, heads, d = (9, 12), 64, 32, 2, 16
    pieces = flat_plan(lens, targets, tile, cap, programs, min_units, weight)
    for seq, n in enumerate(lens):
        mine = [(a, z) for _, s, a, z in pieces if s == seq]
        assert mine[0][0] == 0 and mine[-1][1] == n, f"sequence {seq}: its pieces cover it"
        assert all(z == a for (_, z), (a, _) in zip(mine, mine[1:])), f"sequence {seq}: in order, no gap"
    split = [row for row, seq, _, _ in pieces if sum(s == seq for _, s, _, _ in pieces) > 1]
    assert len(set(split)) == len(split), "a row per piece of a split sequence (whole ones are written directly)"
    n_rows = max(row for row, _, _, _ in pieces) + 1
    gen = torch.Generator().manual_seed(3)
    part = torch.randn(n_rows, heads, d, generator=gen)
    lse = 4 * torch.rand(n_rows, heads, generator=gen)
    expected = {}
    for seq in range(len(lens)):
        mine = [row for row, s, _, _ in pieces if s == seq]
        w = torch.exp2(lse[mine] - lse[mine].max(dim=0).values)
        expected[seq] = (mine, (w[:, :, None] * part[mine]).sum(0) / w.sum(0)[:, None])
    groups = fold_groups(lens, pieces, fold)
    folded = sum(len(g) > 1 for gs in groups.values() for g in gs)
    if fold in (2, 3, 5) and len(set(lens)) > 1:
        assert folded, "the case folds something"
    for gs in groups.values():
        for rows in (g for g in gs if len(g) > 1):  # the kernel's combine, in log2 units
            m = lse[rows].max(dim=0).values
            w = torch.exp2(lse[rows] - m)
            part[rows[0]] = (w[:, :, None] * part[rows]).sum(0) / w.sum(0)[:, None]
            lse[rows[0]] = m + torch.log2(w.sum(0))
            part[rows[1:]] = float("nan")
            lse[rows[1:]] = float("nan")
    part, lse = part.to(DEVICE), lse.to(DEVICE)
    out = torch.full((len(lens), heads, d), 123.0, device=DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    split_reduce_kernel[(len(lens), heads)](
        part, lse, out, seq_lens, len(lens), targets[0], targets[1], cap, programs, min_units, weight,
        out.stride(0), out.stride(1), HEAD_DIM=d, D_PAD=d, B_PAD=8, TILE_N=tile, S_CHUNK=2, S_SMALL=2,
        CHUNKED=False, RANK_MAX=0, FLAT=True, FOLD=fold, USE_GDC=False)
    for seq, (mine, want) in expected.items():
        if len(mine) == 1:
            assert (out[seq] == 123.0).all(), f"sequence {seq} is one piece: the kernel writes it"
            continue
        torch.testing.assert_close(out[seq].cpu(), want, msg=f"sequence {seq}, rows {mine}")


@pytest.mark.parametrize("fold", [0, 2, 3, 4, 32])
def test_fold_groups_cover_every_piece_once(fold):
    """Over random flat plans: every piece of a sequence in exactly one group, groups of
    consecutive pieces in launch order, ceil(n / fold) to a group where n > fold (the last
    group shorter), so at most `fold` groups; equal lengths and short sequences unfolded."""
    rng = random.Random(fold)
    for _ in range(200):
        batch = rng.randint(1, 12)
        lens = [rng.choice([0, rng.randint(1, 64), rng.randint(1, 5000)]) for _ in range(batch)]
        if rng.random() < 0.1:
            lens = [lens[0]] * batch
        programs = rng.randint(1, 40)
        pieces = flat_plan(lens, (programs, programs), 32, 64, programs, rng.randint(1, 3), rng.randint(0, 3))
        groups = fold_groups(lens, pieces, fold)
        for seq in set(s for _, s, _, _ in pieces):
            rows = [row for row, s, _, _ in pieces if s == seq]
            assert [r for g in groups[seq] for r in g] == rows, "every piece once, in order"
            n, g = len(rows), len(groups[seq][0])
            if fold and n > fold and len(set(lens)) > 1:
                assert g == -(-n // fold) and len(groups[seq]) <= fold
                assert all(len(x) == g for x in groups[seq][:-1]) and 1 <= len(groups[seq][-1]) <= g
            else:
                assert all(len(x) == 1 for x in groups[seq])


def test_split_targets_need_no_lengths():
    uniform, ragged = split_targets(64, 8, 132, 4096, tile_n=64, programs_per_sm=4, ragged_waves=4)
    assert uniform == 64 and ragged == 264  # 1 split each; 4 waves of 528 slots over 8 KV heads


@pytest.mark.parametrize("batch", [264, 300, 527])
def test_fewer_waves_do_not_leave_a_larger_batch_unsplit(batch):
    """The CUDA kernel's 2 waves aim for 264 splits on 132 SMs; a batch of 264-527 sequences is
    still split, as 4 waves split it, so its one long sequence is cut into chunks."""
    uniform, ragged = split_targets(batch, 1, 132, None, tile_n=32, programs_per_sm=1, ragged_waves=2)
    assert uniform == batch and ragged == batch + 1
    lens = [131072] + [600] * (batch - 1)
    items = chunked_plan(lens, (uniform, ragged), 32, split_cap=128)
    # Chunks of about the mean length (1,120 tokens at 264 sequences) or split_cap's 1,024.
    assert 100 <= sum(seq == 0 for seq, _, _ in items) <= 128
    assert max(end - start for _, start, end in items) <= 1120


@pytest.mark.parametrize(("waves", "batch"), [(2, 528), (2, 4096), (4, 528), (4, 600)])
def test_past_the_default_waves_target_a_batch_stays_unsplit(waves, batch):
    """Past RAGGED_WAVES' target the floor stops: a split launch rebuilds the plan over the whole
    batch in every program, which cost more than the unsplit launch on equal lengths (NOTES.md, v11)."""
    assert split_targets(batch, 1, 132, None, tile_n=32, programs_per_sm=1, ragged_waves=waves) == (batch, batch)


def test_the_cuda_kernel_aims_for_its_own_waves():
    from labs.paged_attention import kernel

    assert kernel.default_config(True, "cuda").ragged_waves == kernel.CUDA_FP8_RAGGED_WAVES
    assert kernel.default_config(True, "triton").ragged_waves == kernel.RAGGED_WAVES
    assert kernel.default_config(False).ragged_waves == kernel.RAGGED_WAVES


def test_ragged_plan_matches_reference_with_many_splits():
    """One long sequence among short ones: it gets most of the splits, the reduction loops."""
    lens = [300, 3, 20, 9, 40, 1, 2, 17]
    problem = make_problem(lens, 4, 2, CPU_HEAD_DIM, 16, torch.float16, DEVICE, seed=4)
    assert max(plan_splits(lens, (8 * 6, 8 * 6), CPU_TILE_N, split_cap=128)) == 19  # one sequence, 19 splits
    out = run_case(problem, num_splits=6, tile_n=CPU_TILE_N)
    assert_matches(out, reference(problem), torch.float16, f"lens={lens}")


def test_zero_length_sequence_gives_a_zero_row():
    problem = make_problem([20, 5, 7], 4, 2, CPU_HEAD_DIM, 8, torch.float16, DEVICE, seed=2)
    problem.seq_lens[1] = 0  # a padding slot of a captured batch
    out = paged_decode(problem.q, problem.k_cache, problem.v_cache, problem.block_tables, problem.seq_lens,
                       num_splits=2, tile_n=CPU_TILE_N)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    problem.lens[1] = 0
    assert_matches(out, reference(problem), torch.float16, "zero-length sequence")


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("group", [1, 4, 7])
def test_fp8_cache_matches_both_references(group, num_splits):
    lens = random_lens(__import__("random").Random(10 + group), 4, 60)
    problem = make_problem(lens, 2 * group, 2, CPU_HEAD_DIM, 8, torch.float16, DEVICE, seed=group,
                           kv_dtype=FP8_DTYPE)
    plain = make_problem(lens, 2 * group, 2, CPU_HEAD_DIM, 8, torch.float32, DEVICE, seed=group)
    assert problem.k_cache.dtype == FP8_DTYPE and problem.k_cache.element_size() == 1
    assert 0 < problem.k_scale.item() < 1, "calibrated scale: amax / 448 of standard-normal data"
    out = run_case(problem, num_splits=num_splits, tile_n=CPU_TILE_N)
    assert_matches(out, reference(problem), torch.float16, f"fp8 vs dequantised, lens={lens}")
    err = ((out.float() - reference(plain)).norm() / reference(plain).norm()).item()
    assert err <= FP8_QUANT_REL_ERR, f"fp8 vs unquantised: {err:.3g}"


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_v_stored_by_dimension_matches_reference(block_size):
    """V as (blocks, heads, dim, block_size): per-block loads, NaN in the last block's unused slots."""
    lens = [3 * max(block_size, 16) + 5, 1, max(block_size - 1, 2), block_size + 1]
    problem = make_problem(lens, 6, 2, CPU_HEAD_DIM, block_size, torch.float16, DEVICE, seed=block_size,
                           v_layout="dim", shared_prefix_blocks=1)
    assert problem.v_cache.shape == (problem.k_cache.shape[0], 2, CPU_HEAD_DIM, block_size)
    for num_splits in (1, 3):
        out = run_case(problem, num_splits=num_splits, tile_n=CPU_TILE_N)
        assert_matches(out, reference(problem), torch.float16, f"v by dim, block_size={block_size}")


def test_fp8_pool_stores_v_by_dimension():
    """The fp8 writer puts token t's V[h, :] at v[block, h, :, t % block_size]."""
    cache = PagedKVCache(1, 3, 8, 2, 4, FP8_DTYPE, "cpu", v_layout="dim")
    v = torch.arange(2 * 4, dtype=torch.float32).reshape(1, 2, 4) / 8
    cache.write(0, [2 * 8 + 5], v, v)
    assert tuple(cache.v[0].shape) == (3, 2, 4, 8)
    torch.testing.assert_close(cache.v[0][2, :, :, 5].float(), v[0])
    torch.testing.assert_close(cache.k[0][2, 5].float(), v[0])
    with pytest.raises(ValueError, match="v_layout"):
        PagedKVCache(1, 3, 8, 2, 4, FP8_DTYPE, "cpu", v_layout="heads")


def test_fp8_writer_quantises_with_the_scale_and_saturates():
    from labs.paged_attention.cache import FP8_MAX

    cache = PagedKVCache(1, 2, 8, 1, 4, FP8_DTYPE, "cpu")
    cache.set_scales(0, 0.5, 2.0)
    k = torch.tensor([[[1.0, -3.0, 1000.0, 0.1]]])
    cache.write(0, [9], k, k)
    stored = cache.k[0][1, 1, 0].float()
    assert stored.tolist()[:2] == [2.0, -6.0] and stored[2] == FP8_MAX, "value / scale, clamped to 448"
    assert cache.v[0][1, 1, 0].float()[1] == -1.5
    with pytest.raises(ValueError, match="only to an fp8 cache"):
        PagedKVCache(1, 2, 8, 1, 4, torch.float16, "cpu").set_scales(0, 1.0, 1.0)


def test_launcher_rejects_bad_inputs_with_clear_messages():
    p = make_problem([5], 4, 2, CPU_HEAD_DIM, 8, torch.float16, DEVICE)
    args = (p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    with pytest.raises(ValueError, match="share q.s dtype"):
        paged_decode(p.q.float(), *args[1:])
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_decode(p.q[:, :3], *args[1:])
    with pytest.raises(ValueError, match="int32"):
        paged_decode(*args[:3], p.block_tables.long(), p.seq_lens)
    with pytest.raises(ValueError, match="capacity"):
        paged_decode(*args, max_seq_len=10**6)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode(*args, num_splits=0)
    for waves in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="ragged_waves must be > 0"):
            paged_decode(*args, ragged_waves=waves)
    with pytest.raises(ValueError, match="apply only to an fp8 cache"):
        paged_decode(*args, k_scale=torch.ones(()), v_scale=torch.ones(()))
    f8 = make_problem([5], 4, 2, CPU_HEAD_DIM, 8, torch.float16, DEVICE, kv_dtype=FP8_DTYPE)
    with pytest.raises(ValueError, match="needs k_scale"):
        paged_decode(f8.q, f8.k_cache, f8.v_cache, f8.block_tables, f8.seq_lens)
    with pytest.raises(ValueError, match="v_layout='dim', v_cache must be"):
        paged_decode(f8.q, f8.k_cache, f8.v_cache, f8.block_tables, f8.seq_lens, k_scale=f8.k_scale,
                     v_scale=f8.v_scale, v_layout="dim")
    with pytest.raises(ValueError, match="v_layout must be one of"):
        paged_decode(*args, v_layout="heads")


# ----------------------------------------------------------------------------------
# GPU: the same grid at real sizes, and SDPA on the same KV stored contiguously.

GPU_GQA = [(32, 32), (32, 8), (64, 8)]  # (Hq, Hkv): ratios 1, 4, 8 as in Llama-style models
GPU_HEAD_DIM = 128


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", GPU_SPLITS)
@pytest.mark.parametrize("heads", GPU_GQA, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_kernel_matches_reference(dtype, block_size, heads, num_splits):
    num_q_heads, num_kv_heads = heads
    lens = ragged_lens(block_size, long=32768) + [4097]
    problem = make_problem(
        lens, num_q_heads, num_kv_heads, GPU_HEAD_DIM, block_size, dtype, "cuda",
        shared_prefix_blocks=max(256 // block_size, 1),
    )
    out = run_case(problem, num_splits=num_splits)
    assert_matches(out, reference(problem), dtype, f"lens={lens}")


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [MAX_SPLITS])
def test_gpu_more_splits_than_blocks(num_splits):
    problem = make_problem([1, 15, 17, 100], 32, 8, GPU_HEAD_DIM, 16, torch.bfloat16, "cuda")
    out = run_case(problem, num_splits=num_splits)
    assert_matches(out, reference(problem), torch.bfloat16, f"num_splits={num_splits}")


@pytest.mark.gpu
def test_gpu_block_size_1_agrees_with_block_size_16():
    lens = [4099, 1, 333]
    a = make_problem(lens, 32, 8, GPU_HEAD_DIM, 16, torch.bfloat16, "cuda", seed=5)
    b = make_problem(lens, 32, 8, GPU_HEAD_DIM, 1, torch.bfloat16, "cuda", seed=5)
    torch.testing.assert_close(run_case(a, num_splits=4), run_case(b, num_splits=4), atol=0, rtol=0)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("heads", GPU_GQA, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_error_within_2x_of_sdpa(dtype, heads):
    """Same KV, stored contiguously for SDPA; both judged against one fp32 reference."""
    num_q_heads, num_kv_heads = heads
    batch, seq_len = 4, 8191  # 8191: the last block holds 15 of 16 tokens
    problem = make_problem([seq_len] * batch, num_q_heads, num_kv_heads, GPU_HEAD_DIM, 16, dtype, "cuda")
    k = torch.stack([gather_kv(problem.k_cache, problem.block_tables[b], seq_len) for b in range(batch)])
    v = torch.stack([gather_kv(problem.v_cache, problem.block_tables[b], seq_len) for b in range(batch)])
    # (B, L, Hkv, d) -> (B, Hkv, L, d); GQA by enable_gqa, never by repeating K/V.
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        problem.q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), is_causal=False, enable_gqa=True
    ).squeeze(2)
    ref = reference(problem)
    ours = run_case(problem)
    err_ours, err_sdpa = rel_err(ours, ref), rel_err(sdpa, ref)
    assert err_ours <= 2 * err_sdpa, f"kernel error {err_ours:.3g} > 2 x SDPA's {err_sdpa:.3g}"
    assert_matches(ours, sdpa.float(), dtype, "kernel vs SDPA")


# ----------------------------------------------------------------------------------
# GPU: ragged batches, every group size, graph replay, fp8.


@pytest.mark.gpu
@pytest.mark.parametrize("group", range(1, 17))
def test_gpu_every_group_size_on_random_lengths(group):
    """Group sizes 1-16, random lengths up to 20K, blocks in random order, NaN in unused slots."""
    import random

    lens = random_lens(random.Random(group), 12, 20000)
    problem = make_problem(lens, 4 * group, 4, GPU_HEAD_DIM, 16, torch.bfloat16, "cuda", seed=group)
    table0 = problem.block_tables[0, : -(-lens[0] // 16)].tolist()
    assert table0 != sorted(table0)
    assert_matches(run_case(problem), reference(problem), torch.bfloat16, f"group={group} lens={lens}")


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["uniform", "lognormal", "one-long"])
def test_gpu_ragged_workloads_match_reference(rule):
    """The benchmark's three ragged rules, at fewer sequences (the one-long rule keeps its 128K)."""
    from labs.paged_attention.bench import Ragged

    lens = Ragged(16 if rule != "one-long" else 8, rule).lens()
    problem = make_problem(lens, 32, 8, GPU_HEAD_DIM, 16, torch.bfloat16, "cuda", seed=3)
    assert_matches(run_case(problem), reference(problem), torch.bfloat16, f"{rule}: lens={lens}")


def _replay_with_new_lengths(kv_dtype, **launch):
    """Capture once on equal lengths; replay after writing ragged lengths (and a 0) in place,
    then equal lengths again (the plan switches between its two forms at every replay).

    launch: extra paged_decode arguments (test_paged_attention_fp8_cuda.py passes backend="cuda")."""
    import random

    lens = [6000] * 8
    problem = make_problem(lens, 32, 8, GPU_HEAD_DIM, 16, torch.bfloat16, "cuda", seed=9, kv_dtype=kv_dtype)
    kwargs = {**problem.kernel_kwargs(), **launch}
    call = lambda: paged_decode(problem.q, problem.k_cache, problem.v_cache,  # noqa: E731
                                problem.block_tables, problem.seq_lens, **kwargs)
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    atol, rtol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(out.float(), reference(problem), atol=atol, rtol=rtol)
    rng = random.Random(1)
    for new in ([5999, 1, 17, 0, 4096, 6000, 33, 2048], [rng.randint(1, 6000) for _ in range(8)], [3001] * 8):
        problem.seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        problem.lens[:] = new
        out.fill_(float("nan"))  # every element must be written again by the replay
        graph.replay()
        assert_matches(out, reference(problem), torch.bfloat16, f"replay with lens={new}")


@pytest.mark.gpu
def test_gpu_graph_replay_with_new_lengths():
    _replay_with_new_lengths(None)


@pytest.mark.gpu
def test_gpu_fp8_graph_replay_with_new_lengths():
    _replay_with_new_lengths(FP8_DTYPE)


# V by dimension runs every group; vLLM's order needs two groups only (its addressing does not depend on
# the group), so those cases are not generated at all rather than generated and skipped.
FP8_LAYOUT_GROUPS = [("dim", g) for g in (1, 4, 7, 8, 16)] + [("token", g) for g in (4, 7)]


@pytest.mark.gpu
@pytest.mark.parametrize(("v_layout", "group"), FP8_LAYOUT_GROUPS, ids=[f"{v}-g{g}" for v, g in FP8_LAYOUT_GROUPS])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_fp8_matches_both_references(dtype, group, v_layout):
    """V stored by dimension (the lab's fp8 pool) and by token (vLLM's order) both match."""
    import random

    lens = random_lens(random.Random(group), 10, 32768)
    problem = make_problem(lens, 4 * group, 4, GPU_HEAD_DIM, 16, dtype, "cuda", seed=group, kv_dtype=FP8_DTYPE,
                           v_layout=v_layout)
    plain = make_problem(lens, 4 * group, 4, GPU_HEAD_DIM, 16, torch.float32, "cuda", seed=group)
    out = run_case(problem)
    assert_matches(out, reference(problem), dtype, f"fp8 vs dequantised, lens={lens}")
    err = rel_err(out, reference(plain))
    assert err <= FP8_QUANT_REL_ERR, f"fp8 vs unquantised values: {err:.3g}"
