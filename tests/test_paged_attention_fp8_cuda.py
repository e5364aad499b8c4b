"""The CUDA fp8 decode kernel (labs/paged_attention/fp8_decode.cu).

On any machine: every specialisation compiles with NVRTC for sm_90 within the register
budget its launch bounds promise, without spills, and the launcher says why it will not
take a call. With a GPU: the kernel against the dequantising fp32 reference over block
sizes, group sizes, query dtypes, split counts, ragged and zero lengths, NaN in unused
slots, and graph replay with new lengths; and against the Triton fp8 kernel.
"""

from __future__ import annotations

import itertools
import random

import pytest
from conftest import require_or_skip

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from labs.paged_attention import fp8_decode, kernel, nvrtc  # noqa: E402
from labs.paged_attention.kernel import FP8_DTYPE, MAX_SPLITS, REDUCE_CHUNK_CUDA_FP8, paged_decode  # noqa: E402
from labs.paged_attention.workload import make_problem  # noqa: E402
from test_paged_attention import (  # noqa: E402  (the bounds and checks the Triton kernel's tests use)
    TOLERANCES,
    _replay_with_new_lengths,
    assert_matches,
    reference,
)

try:
    nvrtc._nvrtc()
    HAVE_NVRTC = True
except nvrtc.NvrtcError:
    HAVE_NVRTC = False


@pytest.fixture
def nvrtc_available():
    # PyTorch's CUDA wheels bring NVRTC; CI installs one, so there its absence is a failure.
    require_or_skip(HAVE_NVRTC, "NVRTC", "it comes with PyTorch's CUDA wheels (nvidia-cuda-nvrtc)")

# The specialisations the launcher asks for: block size x split (the chunked plan, or the flat
# one, with or without the fold) x query dtype for an 8-head pool, and every other program width
# (KV heads per program) with 16-token blocks.
SPLITS = ("direct", "split", "flat", "fold")
FOLD = REDUCE_CHUNK_CUDA_FP8  # the fold that leaves the reduction one step
VARIANTS = [(b, s, q, fp8_decode.HEADS_MAX) for b, s, q in itertools.product((1, 8, 16, 32), SPLITS, (False, True))]
VARIANTS += [(16, s, True, h) for h in (1, 2, 4) for s in SPLITS]


@pytest.mark.parametrize(("block_size", "split", "q_bf16", "heads"), VARIANTS,
                         ids=[f"bs{b}-{s}-{'bf16' if q else 'fp16'}-h{h}" for b, s, q, h in VARIANTS])
def test_every_specialisation_compiles_within_its_register_budget(nvrtc_available, block_size, split, q_bf16, heads):
    cubin, log = fp8_decode.compile_variant(90, block_size, heads * 128, split != "direct", q_bf16, heads,
                                            verbose=True, flat=split in ("flat", "fold"),
                                            fold=FOLD if split == "fold" else 0)
    report = nvrtc.ptxas_report(log)
    threads = heads * fp8_decode.WARPS_PER_HEAD * 32
    budget = 65536 // (threads * fp8_decode.programs_per_sm(heads))
    assert cubin[:4] == b"\x7fELF", "NVRTC returned no cubin"
    assert 0 < report["registers"] <= budget, report
    assert report["spill_stores"] == report["spill_loads"] == 0, f"spills: {report}"


def test_a_compile_error_carries_nvrtc_log(nvrtc_available):
    with pytest.raises(nvrtc.NvrtcError, match="(?s)did not compile for sm_90.*undefined_name"):
        nvrtc.compile_cubin('extern "C" __global__ void k() { undefined_name(); }', "bad.cu", 90)


def _problem(lens, group, block_size=16, dtype=torch.bfloat16, device="cpu", head_dim=128, **kw):
    return make_problem(lens, 2 * group, 2, head_dim, block_size, dtype, device, kv_dtype=FP8_DTYPE, **kw)


def _run(problem, **kw):
    return paged_decode(problem.q, problem.k_cache, problem.v_cache, problem.block_tables, problem.seq_lens,
                        **problem.kernel_kwargs(), **kw)


def test_cuda_backend_says_why_it_cannot_take_a_call():
    problem = _problem([5, 9], 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="backend='cuda' cannot take this call: not a CUDA tensor"):
        _run(problem, backend="cuda")


def test_backend_names_are_checked():
    problem = _problem([5], 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="backend must be one of"):
        _run(problem, backend="cudnn")
    plain = make_problem([5], 4, 2, 32, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match="serves an fp8 cache only"):
        paged_decode(plain.q, plain.k_cache, plain.v_cache, plain.block_tables, plain.seq_lens, backend="cuda")


def test_the_fold_is_the_cuda_kernels_and_its_arguments_are_checked():
    problem = _problem([5, 9], 4, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"fold must be 0 \(never\) or in \[2, 1024\], got 1"):
        _run(problem, fold=1)
    with pytest.raises(ValueError, match="fold applies to the CUDA fp8 kernel"):
        _run(problem, fold=FOLD)  # on the CPU the Triton kernel runs, under the interpreter
    with pytest.raises(ValueError, match="fold_counts is read only by the CUDA kernel's fold"):
        _run(problem, fold_counts=torch.zeros(8, dtype=torch.int32))
    _run(problem, fold=0)  # never folding is every kernel's way


# ----------------------------------------------------------------------------------
# GPU


def _check(problem, what, **kw):
    out = _run(problem, backend="cuda", **kw)
    assert_matches(out, reference(problem), problem.q.dtype, what)
    return out


GPU_SPLITS = [None, 1, 3, MAX_SPLITS]


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", GPU_SPLITS, ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("group", [1, 4, 7, 8])
@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_cuda_fp8_matches_reference(dtype, block_size, group, num_splits):
    """Ragged lengths through every tile edge (1, 15, 16, 17, 63, 64, 65 tokens) and a long one."""
    rng = random.Random(block_size * 100 + group)
    lens = [9000, 1, 15, 16, 17, 63, 64, 65] + [rng.randint(1, 9000) for _ in range(4)]
    problem = _problem(lens, group, block_size, dtype, "cuda", seed=group,
                       shared_prefix_blocks=max(128 // block_size, 1))
    _check(problem, f"bs={block_size} group={group} splits={num_splits} lens={lens}", num_splits=num_splits,
           max_seq_len=max(lens))


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", GPU_SPLITS, ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("length", [1, 17, 64, 1000, 9000])
def test_gpu_cuda_fp8_equal_lengths(length, num_splits):
    """Equal lengths take the plan's closed form (item i is split i % n of sequence i / n), and
    the items the grid holds for a ragged plan exit; 40 sequences put the uniform and ragged
    targets apart."""
    problem = _problem([length] * 40, 4, 16, torch.bfloat16, "cuda", seed=length)
    _check(problem, f"length={length} splits={num_splits}", num_splits=num_splits, max_seq_len=length)


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "head_dim", "v_layout", "message"), [
    ((32, 2), 128, "token", "16 query heads per KV head"),
    ((32, 8), 64, "token", "head_dim 64"),
    ((32, 8), 128, "dim", "v_layout='dim'"),
])
def test_gpu_cuda_backend_names_what_it_does_not_take(heads, head_dim, v_layout, message):
    problem = make_problem([40, 7], *heads, head_dim, 16, torch.bfloat16, "cuda", kv_dtype=FP8_DTYPE,
                           v_layout=v_layout)
    with pytest.raises(ValueError, match=f"cannot take this call: {message}"):
        _run(problem, backend="cuda")
    _run(problem)  # auto falls back to the Triton kernel


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 3], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("num_kv_heads", [1, 3, 4, 6, 8, 12, 32])
def test_gpu_cuda_fp8_every_program_width(num_kv_heads, num_splits):
    """A program serves heads_per_program(num_kv_heads) heads, one warp each: 1, 2, 4 or 8 of
    them, and 12 or 32 heads take several programs per split."""
    lens = [3000, 1, 17, 64, 65, 700]
    problem = make_problem(lens, 4 * num_kv_heads, num_kv_heads, 128, 16, torch.bfloat16, "cuda",
                           kv_dtype=FP8_DTYPE, seed=num_kv_heads)
    _check(problem, f"kv_heads={num_kv_heads} splits={num_splits}", num_splits=num_splits, max_seq_len=max(lens))


def test_heads_per_program_divides_the_pool():
    assert [fp8_decode.heads_per_program(h) for h in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 40)] == \
        [1, 2, 1, 4, 1, 2, 1, 8, 4, 8, 8, 8]


@pytest.mark.gpu
def test_gpu_cuda_fp8_zero_length_rows_are_zero():
    problem = _problem([9, 300, 9, 1], 4, device="cuda", seed=2)
    problem.seq_lens[0] = problem.seq_lens[2] = 0  # padding slots of a captured batch
    problem.lens[0] = problem.lens[2] = 0
    for splits in (None, 1, 5):
        out = _check(problem, f"splits={splits}", num_splits=splits)
        assert out[0].abs().max() == 0 and out[2].abs().max() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 3], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("batch", [3, 256, 257, 600])
def test_gpu_cuda_fp8_ragged_plans_at_every_batch_size(batch, num_splits):
    """Unequal lengths take kernel.flat_plan, and with a forced split count kernel.chunked_plan
    (the remainders ranked longest first up to RANK_MAX_BATCH sequences and in sequence order
    past it), with ties and zero lengths."""
    rng = random.Random(batch)
    lens = [5000] + [rng.choice([1, 16, 300, 300, rng.randint(1, 2000)]) for _ in range(batch - 1)]
    problem = _problem(lens, 4, 16, torch.bfloat16, "cuda", seed=batch)
    for i in range(1, batch, 7):  # padding slots of a captured batch
        problem.seq_lens[i] = 0
        problem.lens[i] = 0
    out = _check(problem, f"batch={batch} splits={num_splits}", max_seq_len=max(lens), num_splits=num_splits)
    assert out[1].abs().max() == 0


@pytest.mark.gpu
def test_gpu_cuda_and_triton_fp8_kernels_agree():
    """Same data, same plan: the two kernels differ only in rounding order (fp32 sums)."""
    lens = [20000, 333, 4096, 1, 7777]
    problem = make_problem(lens, 32, 8, 128, 16, torch.bfloat16, "cuda", kv_dtype=FP8_DTYPE, seed=4)
    a = _run(problem, backend="cuda").float()
    b = _run(problem, backend="triton").float()
    atol, rtol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.mark.gpu
def test_gpu_auto_backend_picks_cuda_where_it_applies(monkeypatch):
    calls = []
    real = fp8_decode.launch
    monkeypatch.setattr(fp8_decode, "launch", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    problem = make_problem([100, 50], 32, 8, 128, 16, torch.bfloat16, "cuda", kv_dtype=FP8_DTYPE)
    _run(problem)
    assert calls, "auto did not take the CUDA kernel for head_dim 128, group 4"
    calls.clear()
    wide = make_problem([100, 50], 32, 2, 128, 16, torch.bfloat16, "cuda", kv_dtype=FP8_DTYPE)  # group 16
    _run(wide)
    assert not calls, "auto took the CUDA kernel for a group of 16"


@pytest.mark.gpu
def test_gpu_cuda_fp8_graph_replay_with_new_lengths():
    _replay_with_new_lengths(FP8_DTYPE, backend="cuda")


def _flat_pieces(problem) -> tuple[list[int], int]:
    """(pieces per sequence, programs) of the flat plan a default CUDA launch makes for problem."""
    num_kv_heads, sms = problem.k_cache.shape[2], kernel.sm_count(problem.q.device.index)
    config = kernel.default_config(True, "cuda")
    targets, cap = kernel.launch_targets(len(problem.lens), num_kv_heads, sms, config, "cuda")
    programs = kernel.flat_plan_programs(num_kv_heads, sms, config)
    flat = (programs, config.flat_min_units, config.flat_weight)
    return kernel.splits_per_sequence(problem.lens, targets, config.tile_n, cap, config.chunked, flat), programs


FOLD_CASES = [(8, 4), (8, 8), (4, 1), (1, 4), (32, 4)]


# Tokens cached per sequence in the fold test: the most any of its runs gives each one.
FOLD_ROOM = [100_000] + [3000] * 14 + [100_000]


def _set_lens(problem, lens):
    """Run the problem's sequences at `lens`, none past the tokens cached for it."""
    assert len(lens) == len(FOLD_ROOM) and all(n <= room for n, room in zip(lens, FOLD_ROOM)), lens
    problem.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    problem.lens[:] = lens


@pytest.mark.gpu
@pytest.mark.parametrize(("kv_heads", "group"), FOLD_CASES, ids=[f"hkv{h}-g{g}" for h, g in FOLD_CASES])
def test_gpu_cuda_fp8_long_sequence_folded_in_groups(kv_heads, group):
    """A 100K-token sequence among 15 short ones, cut into more than FOLD pieces (fewer at 32 KV
    heads, whose wider programs leave it unfolded): eager, then replayed from one graph with
    other lengths, equal ones between; the device's counts are zeros again after each launch.
    Then with a caller's own counts, and a tensor too short for the launch is refused.

    Every sequence is cached as long as the longest length a replay gives it (100K tokens at
    both ends, 3,000 between), then run shorter: a replay that ran a sequence past its
    cached tokens would read blocks never written (NaN), not test the kernel."""
    rng = random.Random(kv_heads * 10 + group)
    problem = make_problem(FOLD_ROOM, kv_heads * group, kv_heads, 128, 16, torch.bfloat16, "cuda",
                           kv_dtype=FP8_DTYPE, seed=kv_heads + group)
    lens = [100_000] + [rng.randint(1, 3000) for _ in range(15)]
    _set_lens(problem, lens)
    pieces, programs = _flat_pieces(problem)
    if kv_heads != 32:  # 33 programs per head group at 32 heads on an H200: the control case
        assert pieces[0] > FOLD, pieces
    _check(problem, "eager", fold=FOLD)
    counts = kernel._FOLD_COUNTS[problem.q.device]

    kwargs = {**problem.kernel_kwargs(), "backend": "cuda", "fold": FOLD}
    call = lambda: paged_decode(problem.q, problem.k_cache, problem.v_cache,  # noqa: E731
                                problem.block_tables, problem.seq_lens, **kwargs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for new in (lens, [3000] * 16, [99_983] + [rng.randint(0, 3000) for _ in range(15)], lens[::-1]):
        _set_lens(problem, new)
        out.fill_(float("nan"))  # every element must be written again by the replay
        graph.replay()
        assert_matches(out, reference(problem), torch.bfloat16, f"replay with lens={new[:3]}...")
        torch.cuda.synchronize()
        assert int(counts.abs().sum()) == 0, "a launch left counts behind"

    needed = fp8_decode.fold_counts_needed(kv_heads, programs)
    own = torch.zeros(needed, dtype=torch.int32, device="cuda")
    _check(problem, "own counts", fold=FOLD, fold_counts=own)
    assert int(own.abs().sum()) == 0
    with pytest.raises(ValueError, match=f"fold_counts must be a contiguous 1-D int32 tensor of at least {needed}"):
        _run(problem, backend="cuda", fold=FOLD, fold_counts=own[:-1])
