"""Many LoRA adapters in one batch: a per-adapter loop, and a segmented shrink/expand pair of Triton kernels.

Each row t of the batch carries an adapter slot s_t (or -1 for none). Its output is the
base layer's plus the adapter's low-rank term:

    y[t] += scale * (x[t] @ A[s_t]^T) @ B[s_t]^T      A: (slots, r, in), B: (slots, out, r)

the layout vLLM 0.33 keeps its GPU slots in (vllm/lora/layers/base_linear.py). Three ways:

- `lora_reference`: fp32, through the merged weight B A of each adapter: the answer.
- `lora_loop`: for each distinct adapter, gather its rows, two small matmuls, scatter-add.
  Four launches per adapter, and each matmul is a few rows thin.
- `lora_segmented`: the Punica / SGMV idea. The rows are grouped by adapter once per step
  (`plan`); one shrink launch computes every group's x A^T into an fp32 (rows, r) buffer,
  one expand launch multiplies by B^T and adds into y. Two kernels, whatever the number
  of adapters (three launches when the shrink splits K and adds atomically into a zeroed
  buffer); each program reads the one adapter its rows share.

Standard library, torch and triton only; the kernels run on the CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

NO_ADAPTER = -1
TARGET_PROGRAMS = 264  # about two programs per SM of an H200 (132 SMs): below it, split K in the shrink


# --8<-- [start:plan]
@dataclass(frozen=True)
class Plan:
    """The batch's rows grouped by adapter, cut into tiles of at most block_m rows of one adapter.

    `order` lists the row indices adapter by adapter (rows without one are left out); tile i
    covers order[tile_start[i]:tile_end[i]], all using slot tile_slot[i]. Built once per step
    and shared by every layer, as vLLM builds its LoRAKernelMeta once per forward.
    """

    order: object  # int32 (rows with an adapter,)
    tile_slot: object  # int32 (tiles,)
    tile_start: object  # int32 (tiles,)
    tile_end: object  # int32 (tiles,)
    block_m: int
    adapters: int  # distinct adapters in the batch
    groups: tuple  # ((slot, rows as an int64 tensor), ...) for the per-adapter loop


def plan(torch, adapter_ids, block_m: int | None = None) -> Plan:
    """Group rows by adapter slot (a stable sort, then run lengths) and cut each group into tiles."""
    if adapter_ids.dim() != 1:
        raise ValueError(f"adapter_ids must be one slot per row, got shape {tuple(adapter_ids.shape)}")
    ids = adapter_ids.to(torch.int64)
    if ids.numel() and int(ids.min()) < NO_ADAPTER:
        raise ValueError(f"adapter ids must be slots >= 0 or {NO_ADAPTER} (no adapter), got {int(ids.min())}")
    order = torch.argsort(ids, stable=True)
    slots, counts = torch.unique_consecutive(ids[order], return_counts=True)
    slots, counts = slots.tolist(), counts.tolist()
    skip = counts[0] if slots and slots[0] == NO_ADAPTER else 0
    segments = [(s, c) for s, c in zip(slots, counts) if s != NO_ADAPTER]
    if block_m is None:
        block_m = block_m_for(max((c for _, c in segments), default=1))
    tile_slot, tile_start, tile_end, groups, at = [], [], [], [], 0
    for slot, count in segments:
        groups.append((slot, order[skip + at:skip + at + count]))
        for first in range(at, at + count, block_m):
            tile_slot.append(slot)
            tile_start.append(first)
            tile_end.append(at + count)
        at += count
    dev = adapter_ids.device

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device=dev)

    return Plan(order[skip:].to(torch.int32), i32(tile_slot), i32(tile_start), i32(tile_end), block_m,
                len(segments), tuple(groups))
# --8<-- [end:plan]


def block_m_for(longest_group: int) -> int:
    """Rows per tile: 16 for decode-sized groups, up to 64 when groups are long (prefill)."""
    return 16 if longest_group <= 16 else 32 if longest_group <= 32 else 64


@triton.jit
def _tile(tile, order_ptr, tile_slot_ptr, tile_start_ptr, tile_end_ptr, R, BLOCK_M: tl.constexpr,
          BLOCK_R: tl.constexpr):
    """One tile of the plan: its adapter slot, its token rows (and which are real), the rank lanes."""
    slot = tl.load(tile_slot_ptr + tile).to(tl.int64)
    first = tl.load(tile_start_ptr + tile)
    end = tl.load(tile_end_ptr + tile)
    at = first + tl.arange(0, BLOCK_M)
    row_ok = at < end
    rows = tl.load(order_ptr + at, mask=row_ok, other=0).to(tl.int64)
    rr = tl.arange(0, BLOCK_R)
    return slot, rows, row_ok, rr, rr < R


# --8<-- [start:shrink]
@triton.jit
def _shrink(x_ptr, a_ptr, z_ptr, order_ptr, tile_slot_ptr, tile_start_ptr, tile_end_ptr,
            K, R, stride_xm, stride_as, stride_ar, stride_zm, scale, split_k,
            BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, ATOMIC: tl.constexpr):
    """z[rows] (+)= scale * x[rows] @ A[slot]^T for one tile's rows and one K-slice."""
    tile, split = tl.program_id(0), tl.program_id(1)
    slot, rows, row_ok, rr, r_ok = _tile(tile, order_ptr, tile_slot_ptr, tile_start_ptr, tile_end_ptr, R, BLOCK_M, BLOCK_R)
    a_base = a_ptr + slot * stride_as
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(split * BLOCK_K, K, split_k * BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        xt = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        at_ = tl.load(a_base + rr[None, :] * stride_ar + kk[:, None], mask=k_ok[:, None] & r_ok[None, :], other=0.0)
        acc += tl.dot(xt, at_)
    acc = acc * scale
    z = z_ptr + rows[:, None] * stride_zm + rr[None, :]
    keep = row_ok[:, None] & r_ok[None, :]
    if ATOMIC:  # the K-slices of one tile add into the same fp32 rows
        tl.atomic_add(z, acc, mask=keep)
    else:
        tl.store(z, acc, mask=keep)
# --8<-- [end:shrink]


# --8<-- [start:expand]
@triton.jit
def _expand(z_ptr, b_ptr, y_ptr, order_ptr, tile_slot_ptr, tile_start_ptr, tile_end_ptr,
            N, R, stride_zm, stride_bs, stride_bn, stride_ym,
            BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """y[rows, cols] += z[rows] @ B[slot, cols]^T for one tile's rows and one block of output columns."""
    tile, pid_n = tl.program_id(0), tl.program_id(1)
    slot, rows, row_ok, rr, r_ok = _tile(tile, order_ptr, tile_slot_ptr, tile_start_ptr, tile_end_ptr, R, BLOCK_M, BLOCK_R)
    nn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = nn < N
    z = tl.load(z_ptr + rows[:, None] * stride_zm + rr[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
    bt = tl.load(b_ptr + slot * stride_bs + nn[None, :] * stride_bn + rr[:, None],
                 mask=r_ok[:, None] & n_ok[None, :], other=0.0)
    delta = tl.dot(z.to(bt.dtype), bt)
    y = y_ptr + rows[:, None] * stride_ym + nn[None, :]
    keep = row_ok[:, None] & n_ok[None, :]
    old = tl.load(y, mask=keep, other=0.0)
    tl.store(y, (old.to(tl.float32) + delta).to(old.dtype), mask=keep)
# --8<-- [end:expand]


def _check(x, y, a, b):
    t, k = x.shape
    if y.shape[0] != t or a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]:
        raise ValueError(f"shapes do not fit: x {tuple(x.shape)}, y {tuple(y.shape)}, A {tuple(a.shape)}, "
                         f"B {tuple(b.shape)}; want A (slots, r, in) and B (slots, out, r)")
    if a.shape[2] != k or b.shape[1] != y.shape[1] or a.shape[1] != b.shape[2]:
        raise ValueError(f"A {tuple(a.shape)} and B {tuple(b.shape)} do not match x {tuple(x.shape)} "
                         f"and y {tuple(y.shape)}")


# --8<-- [start:segmented]
def lora_segmented(torch, x, y, a, b, p: Plan, scale: float = 1.0, block_k: int = 128, block_n: int = 128,
                   split_k: int | None = None):
    """y += scale * LoRA(x) for every row with an adapter, in two kernels (plus the buffer's zero-fill when K is
    split); returns y (changed in place)."""
    _check(x, y, a, b)
    if not p.adapters:
        return y
    (t, k), n, r = x.shape, y.shape[1], a.shape[1]
    x, a, b = x.contiguous(), a.contiguous(), b.contiguous()
    block_r = max(16, triton.next_power_of_2(r))
    tiles = p.tile_slot.numel()
    if split_k is None:  # few tiles (decode): split K so the shrink still fills the GPU
        split_k = max(1, min(TARGET_PROGRAMS // tiles, triton.cdiv(k, block_k)))
    z = (torch.zeros if split_k > 1 else torch.empty)((t, r), dtype=torch.float32, device=x.device)
    _shrink[(tiles, split_k)](x, a, z, p.order, p.tile_slot, p.tile_start, p.tile_end,
                              k, r, x.stride(0), a.stride(0), a.stride(1), z.stride(0), scale, split_k,
                              BLOCK_M=p.block_m, BLOCK_R=block_r, BLOCK_K=block_k, ATOMIC=split_k > 1)
    _expand[(tiles, triton.cdiv(n, block_n))](z, b, y, p.order, p.tile_slot, p.tile_start, p.tile_end,
                                              n, r, z.stride(0), b.stride(0), b.stride(1), y.stride(0),
                                              BLOCK_M=p.block_m, BLOCK_R=block_r, BLOCK_N=block_n)
    return y
# --8<-- [end:segmented]


# --8<-- [start:loop]
def lora_loop(torch, x, y, a, b, p: Plan, scale: float = 1.0):
    """The same sum, one adapter at a time: gather, shrink, expand, scatter-add (four launches each)."""
    _check(x, y, a, b)
    for slot, rows in p.groups:
        xs = x.index_select(0, rows)
        y.index_add_(0, rows, (xs @ a[slot].t()) @ b[slot].t(), alpha=scale)
    return y
# --8<-- [end:loop]


def lora_reference(torch, x, y, a, b, adapter_ids, scale: float = 1.0):
    """fp32: y + scale * x (B A)^T per row, through each adapter's merged in x out weight."""
    _check(x, y, a, b)
    out = y.float().clone()
    for slot in sorted(set(adapter_ids.tolist()) - {NO_ADAPTER}):
        rows = (adapter_ids == slot).nonzero().squeeze(1)
        merged = b[slot].float() @ a[slot].float()  # (out, in)
        out[rows] += scale * (x[rows].float() @ merged.t())
    return out
