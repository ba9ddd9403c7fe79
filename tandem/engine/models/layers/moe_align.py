"""A step's (token, expert) slots sorted by expert and padded to whole row blocks, on the
device: what the grouped-GEMM kernels of moe_triton.py walk.

Slot ``s = t * k + j`` is token ``t``'s ``j``-th expert choice ``ids[t, j]``. Each expert's
slots, in token order, fill whole blocks of ``block_m`` rows; the last block of an expert is
padded with the sentinel ``num_slots`` (a row that reads nothing and writes nowhere)::

    ids [T=3, k=2] = [[2, 0], [2, 1], [0, 2]]         block_m = 4
    slots   = [1 5 S S | 3 S S S | 0 2 4 S | S S S S]  (S = 6: padding; the last block spare)
    experts = [0       | 1       | 2       | E      ]  (E: past the last active block)

So one program of a kernel takes one block: a single expert's weights against up to
``block_m`` of its rows. Experts without rows get no block. Every tensor is sized from host
values alone (the slot count, the expert count, ``block_m``): the number of blocks is
bounded, never read back, so the step makes no host sync (``torch.bincount`` would: its
output size is data-dependent on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ExpertBlocks:
    """The padded slot order: ``slots`` (int32 ``[num_blocks * block_m]``, ``num_slots`` for
    padding) and each block's expert (int32 ``[num_blocks]``, ``num_experts`` for a block past
    the last used one, which the kernels skip)."""

    slots: torch.Tensor
    experts: torch.Tensor
    block_m: int
    num_slots: int
    num_experts: int

    @property
    def num_blocks(self) -> int:
        """Blocks allocated (host value): an upper bound on the blocks in use."""
        return self.experts.shape[0]


def max_blocks(num_slots: int, num_experts: int, block_m: int) -> int:
    """The most blocks ``num_slots`` slots over ``num_experts`` experts can fill: at most
    ``a = min(num_experts, num_slots)`` experts are active, and ``sum ceil(c_e / block_m)
    <= (num_slots + a (block_m - 1)) / block_m``."""
    active = min(num_experts, num_slots)
    return (num_slots + active * (block_m - 1)) // block_m


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """``ids`` ``[T, k]`` (each token's experts, distinct within a row or not) -> the slots
    grouped by expert and padded to ``block_m`` rows (module docstring)."""
    flat = ids.reshape(-1).long()  # scatter_add_ indexes by int64
    n, dev = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)  # where each expert's padded run ends
    shift = (ends - padded) - (counts.cumsum(0) - counts)  # padded start - unpadded start
    order = torch.argsort(flat, stable=True)  # slots by expert, token order within
    dest = torch.arange(n, device=dev) + shift[flat[order]]
    blocks = max_blocks(n, num_experts, block_m)
    slots = torch.full((blocks * block_m,), n, dtype=torch.int32, device=dev)
    slots.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(blocks, device=dev) * block_m
    # the expert whose padded run holds each block's first row: the first run ending past it
    experts = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return ExpertBlocks(slots, experts, block_m, n, num_experts)
