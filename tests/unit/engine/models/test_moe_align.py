"""The slot order the MoE grouped-GEMM kernels walk (moe_align.py): every (token, expert)
slot exactly once, each block one expert's rows in token order, experts without rows given
no block, spare blocks marked past the last expert; the block bound never exceeded and met
exactly when every expert has one slot."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.models.layers.moe_align import align_by_expert, max_blocks


def _check(ids: torch.Tensor, num_experts: int, block_m: int) -> int:
    """Assert the alignment of ``ids`` is right; returns the blocks in use."""
    blocks = align_by_expert(ids, num_experts, block_m)
    flat = ids.reshape(-1)
    n = flat.numel()
    assert blocks.num_slots == n and blocks.block_m == block_m
    assert blocks.num_blocks == max_blocks(n, num_experts, block_m)
    slots = blocks.slots.view(-1, block_m).long()
    experts = blocks.experts.long()
    real = slots[slots < n]
    assert torch.equal(real.sort().values, torch.arange(n))  # each slot exactly once
    counts = torch.bincount(flat, minlength=num_experts)
    used = int(((counts + block_m - 1) // block_m).sum())
    assert used <= blocks.num_blocks
    assert bool((experts[used:] == num_experts).all())  # spare blocks: skipped
    assert bool((slots[used:] == n).all())
    for b in range(used):
        row = slots[b][slots[b] < n]
        assert row.numel() > 0  # no block of padding alone before the end
        assert bool((flat[row] == experts[b]).all())  # one expert's rows
        assert bool((row[1:] > row[:-1]).all())  # in token order
    assert sorted(set(experts[:used].tolist())) == torch.nonzero(counts).flatten().tolist()
    return used


@pytest.mark.parametrize("block_m", [1, 4, 16])
@pytest.mark.parametrize("rows,k", [(1, 1), (1, 8), (3, 2), (50, 2), (200, 8)])
def test_random_routing(rows: int, k: int, block_m: int) -> None:
    g = torch.Generator().manual_seed(rows * 10 + k)
    ids = torch.stack([torch.randperm(16, generator=g)[:k] for _ in range(rows)])
    _check(ids, 16, block_m)


def test_empty_experts_get_no_block() -> None:
    """Rows on experts 3, 7 and 12 of 16 only; experts 0 and 15 (the run's ends) idle too."""
    g = torch.Generator().manual_seed(1)
    ids = torch.tensor([3, 7, 12])[torch.randint(0, 3, (40, 1), generator=g)]
    assert _check(ids, 16, 8) == sum(-(-int((ids == e).sum()) // 8) for e in (3, 7, 12))


def test_all_rows_on_one_expert() -> None:
    assert _check(torch.full((37, 1), 5), 8, 16) == 3


def test_the_bound_is_met_with_one_slot_per_expert() -> None:
    ids = torch.randperm(8, generator=torch.Generator().manual_seed(2)).view(4, 2)
    assert _check(ids, 8, 16) == max_blocks(8, 8, 16) == 8


def test_no_rows() -> None:
    blocks = align_by_expert(torch.zeros(0, 2, dtype=torch.int64), 8, 16)
    assert blocks.num_blocks == 0 and blocks.slots.numel() == 0
