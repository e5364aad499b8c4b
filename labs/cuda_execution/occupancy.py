"""How many blocks of a kernel fit on one SM: the occupancy arithmetic, in plain Python.

The same rules as the CUDA toolkit's occupancy calculator (cuda_occupancy.h,
cudaOccMaxBlocksPerSMRegsLimit and cudaOccMaxBlocksPerSMSmemLimit): registers are
allocated per warp in units of 256 and split over the SM's four sub-partitions;
shared memory per block is rounded up to 128 bytes after the 1 KiB the driver
reserves; and the SM caps threads and blocks. The lab's GPU test checks this model
against cudaOccupancyMaxActiveBlocksPerMultiprocessor for every configuration it times.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SmLimits:
    """One SM's occupancy limits. `HOPPER` holds compute capability 9.0's (H100, H200)."""

    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 233472  # 228 KiB
    reserved_smem_per_block: int = 1024
    max_smem_per_block: int = 232448  # 227 KiB, after cudaFuncSetAttribute raises the limit
    max_regs_per_thread: int = 255
    warp_size: int = 32
    sub_partitions: int = 4
    reg_alloc_unit: int = 256  # registers, per warp
    smem_alloc_unit: int = 128  # bytes, per block

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size


HOPPER = SmLimits()


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float  # resident warps / the SM's maximum
    limiter: str  # "threads", "blocks", "registers" or "shared memory"


def blocks_per_sm(block: int, regs_per_thread: int, smem_per_block: int = 0,
                  limits: SmLimits = HOPPER) -> Occupancy:
    """Resident blocks per SM for a block size, registers per thread and shared memory per block."""
    if not 1 <= block <= 1024:
        raise ValueError(f"block size must be in [1, 1024], got {block}")
    if not 0 <= regs_per_thread <= limits.max_regs_per_thread:
        raise ValueError(f"registers per thread must be in [0, {limits.max_regs_per_thread}], got {regs_per_thread}")
    if not 0 <= smem_per_block <= limits.max_smem_per_block:
        raise ValueError(f"shared memory per block must be in [0, {limits.max_smem_per_block}] bytes, got {smem_per_block}")
    warps = -(-block // limits.warp_size)
    caps = {
        "threads": limits.max_warps_per_sm // warps,
        "blocks": limits.max_blocks_per_sm,
    }
    regs_per_warp = _round_up(regs_per_thread * limits.warp_size, limits.reg_alloc_unit)
    if regs_per_warp:
        if regs_per_warp * _round_up(warps, limits.sub_partitions) > limits.regs_per_sm:
            caps["registers"] = 0
        else:
            per_partition = (limits.regs_per_sm // limits.sub_partitions) // regs_per_warp
            caps["registers"] = per_partition * limits.sub_partitions // warps
    smem = _round_up(smem_per_block + limits.reserved_smem_per_block, limits.smem_alloc_unit)
    caps["shared memory"] = limits.smem_per_sm // smem
    limiter = min(caps, key=lambda k: (caps[k], list(caps).index(k)))
    n = caps[limiter]
    return Occupancy(blocks_per_sm=n, warps_per_sm=n * warps,
                     occupancy=n * warps / limits.max_warps_per_sm, limiter=limiter)


def smem_for_blocks(target: int, block: int, limits: SmLimits = HOPPER) -> int:
    """Dynamic shared memory per block that lets at most `target` blocks of this size fit on an SM.

    0 when the thread limit already holds the SM to `target` or fewer.
    """
    warps = -(-block // limits.warp_size)
    if limits.max_warps_per_sm // warps <= target:
        return 0
    per_block = limits.smem_per_sm // (target + 1) + limits.smem_alloc_unit  # target + 1 blocks no longer fit
    return _round_up(per_block, limits.smem_alloc_unit) - limits.reserved_smem_per_block
