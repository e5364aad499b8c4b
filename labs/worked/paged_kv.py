"""Worked examples of the paged KV cache: the block manager's arithmetic and the paged decode kernel's.

The PagedAttention lessons and their questions follow one decode step through a block table
(Llama-3.1-8B, B = 32, L = 4,096 on an H200), one request's blocks from admission to finish,
and a contiguous reservation against 16-token blocks. Every figure they quote is computed
here from the cost model (labs.roofline), the KV-sizing formulas (labs.kv_sizing.formula),
the vLLM facts file and the paged-attention lab's recorded rows, so the pages only quote.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import roofline, vllm_facts
from labs.kv_sizing import formula
from labs.paged_attention.report import kernel_constant, paged_attention_row
from labs.specs import get_gpu, get_model
from labs.worked import positive

# A block-table entry is an int32 physical block id (vllm/v1/worker/block_table.py; the lab's tables).
BLOCK_TABLE_ENTRY_BYTES = 4
# Gather-then-attend moves every KV byte three times: the copy reads it, writes it, attention reads it again.
GATHER_COPY_PASSES = 3
# tl.dot needs at least 16 rows, so a kernel program pads its query rows to 16 (kernel.py's G_PAD).
TL_DOT_MIN_ROWS = 16


@dataclass(frozen=True)
class PagedDecodeStep:
    """One decode step of `batch` sequences of `context` tokens, read through block tables."""

    kv_bytes_per_element: int  # s: bytes of one cached element
    kv_row_bytes: int  # one token's K (or V) row of one KV head: d contiguous elements
    block_layer_bytes: int  # one block of one layer (vLLM's page)
    blocks_per_sequence: int
    block_table_bytes: int  # the whole batch's int32 block tables
    kv_read_bytes: float
    layer_kv_read_bytes: float  # the KV one layer's attention reads per step
    layer_kv_read_s: float  # that read at the bandwidth: one layer's attention floor
    gather_copy_s: float  # the step's KV traffic if the blocks were copied to a contiguous buffer first
    lab_tile_tokens: int  # tokens per tile of the lab's bf16 kernel (kernel.py DEFAULT_TILE_N)
    lookups_per_tile: int  # block-table entries one such tile reads at the default block size
    triton_split_max_sequences: int  # most sequences for which vLLM's Triton backend splits the keys
    no_gqa_flop_per_byte: float  # attention FLOPs per KV byte with one query head per KV head
    no_gqa_padded_flop_per_byte: float  # the same with the query rows padded to tl.dot's 16


def paged_kv_decode_step(model: str, gpu: str, batch: int, context: int) -> PagedDecodeStep:
    """The paged decode kernel's worked example: why a contiguous copy triples a byte-bound step,
    why the block table is noise against the KV it indexes, and why padding costs no time."""
    positive("batch", batch)
    positive("context", context)
    m = get_model(model)
    step = roofline.deployment(m, gpu).decode(batch, context)
    itemsize = formula.kv_itemsize(m)
    block_size = formula.default_block_size(m)
    blocks = formula.blocks_per_request(m, context, block_size)
    # FLOPs per byte of decode attention is 2 H_q / (H_kv s); with no GQA H_q = H_kv.
    no_gqa = 2 / itemsize
    tile = kernel_constant("DEFAULT_TILE_N")
    return PagedDecodeStep(
        kv_bytes_per_element=itemsize,
        kv_row_bytes=m.head_dim * itemsize,
        block_layer_bytes=formula.page_bytes(m, block_size),
        blocks_per_sequence=blocks,
        block_table_bytes=batch * blocks * BLOCK_TABLE_ENTRY_BYTES,
        kv_read_bytes=step.kv_read_bytes,
        layer_kv_read_bytes=step.kv_read_bytes / m.n_layers,
        layer_kv_read_s=step.kv_read_s / m.n_layers,
        gather_copy_s=GATHER_COPY_PASSES * step.kv_read_s,
        lab_tile_tokens=tile,
        lookups_per_tile=-(-tile // block_size),
        triton_split_max_sequences=vllm_facts.kernel_constant("MIN_LAUNCH_GRID_SIZE_2D") // m.n_kv_heads,
        no_gqa_flop_per_byte=no_gqa,
        no_gqa_padded_flop_per_byte=TL_DOT_MIN_ROWS * no_gqa,
    )


@dataclass(frozen=True)
class PagedMeasuredStep:
    """One lab shape's measured per-layer kernel time, summed over the model's layers."""

    layer_time_us: float
    n_layers: int
    step_attention_ms: float  # attention time of one decode step, every layer


def paged_kv_measured_step(model: str, shape: str, gpu: str) -> PagedMeasuredStep:
    """The lab times one layer; a decode step runs the kernel once per layer, so the lesson
    compares the sum with the step's floor. `gpu` is the lab's results label ("H200")."""
    m = get_model(model)
    row = paged_attention_row(shape, gpu)
    return PagedMeasuredStep(layer_time_us=row["time_us"], n_layers=m.n_layers,
                             step_attention_ms=row["time_us"] * m.n_layers / 1e3)


@dataclass(frozen=True)
class PagedReservation:
    """Contiguous max-length reservation against paged blocks, every request at `used` tokens."""

    reserved_unused_pct: float  # share of a contiguous reservation no token fills
    tail_waste_slots: int  # the most a request's last block leaves empty
    tail_waste_bytes: int
    contiguous_used_pct: float  # share of held KV memory that holds tokens, contiguous
    paged_used_pct: float  # the same, paged
    contiguous_requests: int
    paged_requests_by_kv: int  # requests the paged pool holds
    paged_requests: int  # those, capped by --max-num-seqs
    requests_gain: float  # paged_requests / contiguous_requests
    contiguous_tokens_per_s: float  # decode floor's tokens/s at that batch
    paged_tokens_per_s: float
    throughput_gain: float


def paged_kv_reservation(model: str, gpu: str, used: int, max_model_len: int) -> PagedReservation:
    """What paging buys over reserving max_model_len per request: more requests in the same pool,
    and less decode throughput gain than that because each request adds KV bytes to every step."""
    positive("used", used)
    positive("max_model_len", max_model_len)
    if used > max_model_len:
        raise ValueError(f"used ({used}) must not exceed max_model_len ({max_model_len})")
    m, g = get_model(model), get_gpu(gpu)
    d = roofline.deployment(m, g)
    full, short = d.kv_pool(max_model_len), d.kv_pool(used)
    max_num_seqs = vllm_facts.gpu_batch_default("max_num_seqs", g)
    paged = min(short.max_requests, max_num_seqs)
    contig = full.max_requests
    return PagedReservation(
        reserved_unused_pct=100 * (max_model_len - used) / max_model_len,
        tail_waste_slots=short.block_size - 1,
        tail_waste_bytes=(short.block_size - 1) * d.kv_bytes_per_token(),
        contiguous_used_pct=100 * used / max_model_len,
        paged_used_pct=100 * used / (short.blocks_per_request * short.block_size),
        contiguous_requests=contig,
        paged_requests_by_kv=short.max_requests,
        paged_requests=paged,
        requests_gain=paged / contig,
        contiguous_tokens_per_s=d.decode(contig, used).tokens_per_s,
        paged_tokens_per_s=d.decode(paged, used).tokens_per_s,
        throughput_gain=d.throughput_gain(paged, used, base=contig),
    )


@dataclass(frozen=True)
class PagedRequestBlocks:
    """One request's blocks at admission, through decode, and at finish."""

    block_size: int
    bytes_per_block: int
    cached_blocks: int  # prefix-cache hits: whole blocks of the cached prefix only
    prompt_blocks: int  # blocks the prompt needs on admission
    new_prompt_blocks: int  # those not found in the cache
    last_prompt_block_tokens: int  # tokens in the prompt's last (possibly partial) block
    decode_blocks: int  # blocks added while decoding the output
    final_blocks: int
    final_bytes: int  # KV the request frees at the end


def paged_kv_request_blocks(model: str, prompt: int, output: int, cached: int) -> PagedRequestBlocks:
    """Blocks are taken on admission and at each block boundary, never ahead of need: the counts
    the lesson walks through for one request with a cached prefix."""
    positive("prompt", prompt)
    positive("output", output)
    if not 0 <= cached <= prompt:
        raise ValueError(f"cached must be between 0 and prompt ({prompt}), got {cached}")
    m = get_model(model)
    bs = formula.default_block_size(m)
    prompt_blocks = formula.blocks_per_request(m, prompt, bs)
    final_blocks = formula.blocks_per_request(m, prompt + output, bs)
    cached_blocks = cached // bs
    return PagedRequestBlocks(
        block_size=bs,
        bytes_per_block=formula.bytes_per_block(m, bs),
        cached_blocks=cached_blocks,
        prompt_blocks=prompt_blocks,
        new_prompt_blocks=prompt_blocks - cached_blocks,
        last_prompt_block_tokens=prompt - (prompt_blocks - 1) * bs,
        decode_blocks=final_blocks - prompt_blocks,
        final_blocks=final_blocks,
        final_bytes=formula.kv_bytes_per_sequence(m, prompt + output, bs),
    )


EXAMPLES = [paged_kv_decode_step, paged_kv_measured_step, paged_kv_reservation, paged_kv_request_blocks]
