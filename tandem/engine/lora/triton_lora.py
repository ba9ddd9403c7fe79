"""A step's LoRA deltas on CUDA: punica-style segmented shrink and expand Triton kernels.

    rows:    [ base | a1 a1 | base | a2 | a1 ]       order = [1 2 5 | 4]  (adapter rows by slot)
    shrink:  t[rows_s, :]  = x[rows_s] @ A[s]^T                 A: [S, n R, in]   t: fp32 [T, n R]
    expand:  y[rows_s, off_j:off_j+w_j] += t[rows_s, jR:jR+R] @ B[s, off_j:off_j+w_j]^T
                                                                 B: [S, out, R]   (scale folded in)

One launch of each per projection group for the whole batch: program (m, n, s) takes block m
of slot s's rows (gathered through ``order``), so a row only meets its own adapter's weights
and rows without an adapter are never touched. ``R`` is the step's largest rank; a smaller
adapter's A and B are zero-padded to it, and an adapter without a projection the others have
is all zeros there. The expand writes only the column range of each sub-projection (q, k, v;
gate, up) from that sub-projection's R columns of t, instead of the block-diagonal B the torch
reference multiplies (tandem/engine/lora/batch.py). Each output element belongs to exactly one
program, so the read-add-write of ``y`` needs no atomics.

The scaling (``alpha / r`` or rsLoRA's) is folded into B when an adapter is loaded
(tandem/engine/lora/adapter.py). The row grouping is computed on the host from the step's
slots, once per step, shared by every layer, and the grids are sized from host values only
(no device syncs). Under ``TRITON_INTERPRET=1`` (set before this module is imported) the
kernels run in Triton's numpy interpreter on CPU tensors: the tests' way to check them
without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tandem.engine.lora.adapter import GROUPS, LoraAdapter

# group -> (in features, the widths of its sub-projections' outputs in order)
GroupShapes = dict[str, tuple[int, tuple[int, ...]]]
# (layer, group) -> (A [S, n R, in], B [S, out, R]) of one ordered set of adapters
PaddedStacks = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
_BLOCK_N = 64
_BLOCK_K = 64
_MAX_BLOCK_R = 64


def stack_padded(adapters: Sequence[LoraAdapter], num_layers: int, shapes: GroupShapes
                 ) -> PaddedStacks:
    """Each (layer, group)'s weights of ``adapters`` (slot ``s``: ``adapters[s]``) padded to
    the largest rank: A per sub-projection at rows ``j R``, B per sub-projection at its output
    rows, compact (not block-diagonal)."""
    out: PaddedStacks = {}
    rank = max(a.rank for a in adapters)
    ref = next(iter(adapters[0].weights.values()))[0]
    for layer in range(num_layers):
        for group, subs in GROUPS.items():
            pairs = [a.weights.get((layer, group)) for a in adapters]
            if all(p is None for p in pairs):
                continue
            fan_in, widths = shapes[group]
            a_pad = ref.new_zeros(len(adapters), len(subs) * rank, fan_in)
            b_pad = ref.new_zeros(len(adapters), sum(widths), rank)
            for s, (adapter, pair) in enumerate(zip(adapters, pairs, strict=True)):
                if pair is None:
                    continue
                r, (a, b), row = adapter.rank, pair, 0
                for j, width in enumerate(widths):
                    a_pad[s, j * rank:j * rank + r] = a[j * r:(j + 1) * r]
                    b_pad[s, row:row + width, :r] = b[row:row + width, j * r:(j + 1) * r]
                    row += width
            out[(layer, group)] = (a_pad, b_pad)
    return out


@dataclass(frozen=True, slots=True)
class Segments:
    """A step's adapter rows grouped by slot: ``order[starts[s]:starts[s] + lens[s]]`` are
    the rows of slot ``s`` (int32, on the device); ``max_len`` sizes the grids."""

    order: torch.Tensor
    starts: torch.Tensor
    lens: torch.Tensor
    max_len: int

    @classmethod
    def build(cls, row_slots: Sequence[int], num_slots: int, device: torch.device
              ) -> Segments:
        """``row_slots[t]``: row t's slot in ``range(num_slots)``, -1 for the base model."""
        groups: list[list[int]] = [[] for _ in range(num_slots)]
        for row, slot in enumerate(row_slots):
            if slot >= 0:
                groups[slot].append(row)
        lens = [len(g) for g in groups]
        starts = [sum(lens[:s]) for s in range(num_slots)]
        order = [row for g in groups for row in g]
        packed = torch.tensor(order + starts + lens, dtype=torch.int32).to(device)
        n = len(order)
        return cls(packed[:n], packed[n:n + num_slots], packed[n + num_slots:],
                   max(lens, default=0))


def _fp32_dot(*dtypes: torch.dtype) -> bool:
    """Whether the kernels upcast to fp32 before ``tl.dot`` (then IEEE, no TF32): fp32 or
    mixed inputs, and bf16 under the interpreter (it keeps bf16 as raw uint16 and cannot
    matmul it); fp16/bf16 otherwise run on tensor cores with fp32 accumulation."""
    first = dtypes[0]
    return (any(d != first for d in dtypes) or first == torch.float32
            or (first == torch.bfloat16 and _INTERPRETED))


def _block_m(max_len: int) -> int:
    return min(64, max(16, triton.next_power_of_2(max(max_len, 1))))


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, t_ptr, order_ptr, starts_ptr, lens_ptr, K, N,
                   stride_xm, stride_xk, stride_as, stride_an, stride_ak, stride_tm, stride_tn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   FP32_DOT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot = tl.program_id(2)
    seg_len = tl.load(lens_ptr + slot)
    if pid_m * BLOCK_M >= seg_len:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < seg_len
    rows = tl.load(order_ptr + tl.load(starts_ptr + slot) + offs_m, mask=m_mask, other=0)
    rows = rows.to(tl.int64)  # row * stride may pass 2^31 on long prefills
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        a = tl.load(a_ptr + slot * stride_as + offs_n[None, :] * stride_an
                    + offs_k[:, None] * stride_ak,
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if FP32_DOT:
            acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, a)
    tl.store(t_ptr + rows[:, None] * stride_tm + offs_n[None, :] * stride_tn, acc,
             mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _expand_kernel(t_ptr, b_ptr, y_ptr, order_ptr, starts_ptr, lens_ptr, sub_ptr, R,
                   COL_BLOCKS, stride_tm, stride_tn, stride_bs, stride_bn, stride_br,
                   stride_ym, stride_yn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                   FP32_DOT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    slot = tl.program_id(2)
    sub = pid_c // COL_BLOCKS
    col0 = tl.load(sub_ptr + sub) + (pid_c % COL_BLOCKS) * BLOCK_N
    col_end = tl.load(sub_ptr + sub + 1)
    seg_len = tl.load(lens_ptr + slot)
    if (pid_m * BLOCK_M >= seg_len) | (col0 >= col_end):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < seg_len
    rows = tl.load(order_ptr + tl.load(starts_ptr + slot) + offs_m, mask=m_mask, other=0)
    rows = rows.to(tl.int64)  # row * stride may pass 2^31 on long prefills
    offs_n = col0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < col_end
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        r_mask = offs_r < R
        t = tl.load(t_ptr + rows[:, None] * stride_tm + (sub * R + offs_r)[None, :] * stride_tn,
                    mask=m_mask[:, None] & r_mask[None, :], other=0.0)
        b = tl.load(b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn
                    + offs_r[:, None] * stride_br,
                    mask=r_mask[:, None] & n_mask[None, :], other=0.0)
        if FP32_DOT:
            acc += tl.dot(t, b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(t.to(b.dtype), b)
    ptrs = y_ptr + rows[:, None] * stride_ym + offs_n[None, :] * stride_yn
    mask = m_mask[:, None] & n_mask[None, :]
    y = tl.load(ptrs, mask=mask, other=0.0)
    tl.store(ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, seg: Segments) -> torch.Tensor:
    """``t`` (fp32 ``[T, n R]``): each adapter row's ``x @ A[slot]^T`` (``x``: ``[T, in]``,
    ``a``: ``[S, n R, in]``); the rows of no adapter are left unwritten."""
    t = torch.empty(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    if seg.max_len == 0:
        return t
    block_m = _block_m(seg.max_len)
    grid = (triton.cdiv(seg.max_len, block_m), triton.cdiv(a.shape[1], _BLOCK_N), a.shape[0])
    _shrink_kernel[grid](
        x, a, t, seg.order, seg.starts, seg.lens, x.shape[1], a.shape[1],
        x.stride(0), x.stride(1), a.stride(0), a.stride(1), a.stride(2),
        t.stride(0), t.stride(1),
        BLOCK_M=block_m, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K,
        FP32_DOT=_fp32_dot(x.dtype, a.dtype),
    )  # fmt: skip
    return t


def lora_expand(y: torch.Tensor, t: torch.Tensor, b: torch.Tensor, seg: Segments,
                sub_offsets: torch.Tensor, widest: int) -> None:
    """``y[rows, o_j:o_(j+1)]`` (in place) += ``t[rows, jR:(j+1)R] @ B[slot, o_j:o_(j+1)]^T``
    for each sub-projection ``j`` and each adapter row; ``b``: ``[S, out, R]``,
    ``sub_offsets``: int32 ``[n + 1]`` column boundaries on the device, ``widest``: the
    widest sub-projection (host value: sizes the grid)."""
    if seg.max_len == 0:
        return
    rank = b.shape[2]
    block_m = _block_m(seg.max_len)
    col_blocks = triton.cdiv(widest, _BLOCK_N)
    grid = (triton.cdiv(seg.max_len, block_m), (sub_offsets.shape[0] - 1) * col_blocks,
            b.shape[0])
    _expand_kernel[grid](
        t, b, y, seg.order, seg.starts, seg.lens, sub_offsets, rank, col_blocks,
        t.stride(0), t.stride(1), b.stride(0), b.stride(1), b.stride(2),
        y.stride(0), y.stride(1),
        BLOCK_M=block_m, BLOCK_N=_BLOCK_N,
        BLOCK_R=min(_MAX_BLOCK_R, max(16, triton.next_power_of_2(rank))),
        FP32_DOT=_fp32_dot(b.dtype),
    )  # fmt: skip


def column_bounds(shapes: GroupShapes, device: torch.device
                  ) -> dict[str, tuple[torch.Tensor, int]]:
    """group -> (its sub-projections' output column boundaries, int32 ``[n + 1]`` on
    ``device``; the widest sub-projection): what ``lora_expand`` takes."""
    out: dict[str, tuple[torch.Tensor, int]] = {}
    for group, (_, widths) in shapes.items():
        bounds = [sum(widths[:j]) for j in range(len(widths) + 1)]
        out[group] = (torch.tensor(bounds, dtype=torch.int32).to(device), max(widths))
    return out


@dataclass(frozen=True, slots=True)
class TritonLoraBatch:
    """A step's padded stacks, its rows grouped by slot, and each group's sub-projection
    column boundaries: ``add_delta`` is the torch reference's (tandem/engine/lora/batch.py)
    with one shrink and one expand launch per projection."""

    stacks: PaddedStacks
    segments: Segments
    subs: dict[str, tuple[torch.Tensor, int]]  # group -> (int32 boundaries, widest)

    @classmethod
    def build(cls, row_slots: Sequence[int], num_slots: int, stacks: PaddedStacks,
              subs: dict[str, tuple[torch.Tensor, int]], device: torch.device
              ) -> TritonLoraBatch:
        """``row_slots[t]``: row t's slot (-1: the base model) in the stacks' adapters;
        ``subs``: ``column_bounds`` of the model's groups."""
        return cls(stacks, Segments.build(row_slots, num_slots, device), subs)

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        """``y`` ([T, out], in place) += each row's adapter delta of ``x`` ([T, in]) for
        projection ``group`` of ``layer``."""
        pair = self.stacks.get((layer, group))
        if pair is None:
            return
        a, b = pair
        offsets, widest = self.subs[group]
        t = lora_shrink(x, a, self.segments)
        lora_expand(y, t, b, self.segments, offsets, widest)
