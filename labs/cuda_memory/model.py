"""What a warp's addresses cost, counted: 32-byte sectors for global memory, banks for shared memory.

Global memory moves whole 32-byte sectors between DRAM, L2 and the SM. A warp's load
costs the sectors its 32 addresses touch, whatever it uses of them. Shared memory has
32 banks of 4-byte words (word w in bank w mod 32); a warp's access takes as many
passes as the most distinct words that fall in one bank. Both counts are exact for
the patterns the lab runs, and the lab prints them beside what it measured.
"""

from __future__ import annotations

SECTOR_BYTES = 32
BANKS = 32
WARP = 32


def sectors_per_warp(stride_elems: int, elem_bytes: int = 4, lanes: int = WARP) -> int:
    """Distinct 32-byte sectors a warp touches when lane l reads element l * stride."""
    if stride_elems < 0 or elem_bytes < 1:
        raise ValueError("stride must be >= 0 and element size >= 1 byte")
    return len({(lane * stride_elems * elem_bytes) // SECTOR_BYTES for lane in range(lanes)})


def sector_efficiency(stride_elems: int, elem_bytes: int = 4, lanes: int = WARP) -> float:
    """Bytes a warp uses / bytes its sectors move: 1.0 when coalesced, 1/8 for scattered floats."""
    useful = lanes * elem_bytes if stride_elems else elem_bytes
    return useful / (sectors_per_warp(stride_elems, elem_bytes, lanes) * SECTOR_BYTES)


def bank_ways(word_addresses: list[int]) -> int:
    """Passes one warp's shared-memory access needs: the most distinct words in any one bank.

    Lanes reading the same word share it (a broadcast), so only distinct words count.
    """
    per_bank: dict[int, set[int]] = {}
    for w in word_addresses:
        per_bank.setdefault(w % BANKS, set()).add(w)
    return max(len(s) for s in per_bank.values())


def strided_bank_ways(stride_words: int) -> int:
    """Passes for lane l reading word l * stride: gcd(stride, 32) for a nonzero stride."""
    return bank_ways([lane * stride_words for lane in range(WARP)])


def tile_column_ways(tile: int = 32, pad: int = 0) -> int:
    """Passes for a warp reading one column of a tile[tile][tile + pad] float array."""
    return bank_ways([lane * (tile + pad) for lane in range(WARP)])


def strided_index(i: int, n: int, stride: int) -> int:
    """Element thread i reads in the strided pattern: (n / stride) rows of `stride`, by columns."""
    rows = n // stride
    return (i % rows) * stride + i // rows


def scatter_index(i: int, log2n: int) -> int:
    """Element thread i reads in the scattered pattern (kernels.cu scatter): a bijection on [0, 2^log2n)."""
    mask = (1 << log2n) - 1
    half = log2n // 2
    x = (i * 2654435761) & 0xFFFFFFFF & mask
    x ^= x >> half
    x = (x * 2246822519) & 0xFFFFFFFF & mask
    x ^= x >> half
    return x
