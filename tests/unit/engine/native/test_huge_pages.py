"""Weights moved into the huge-page mapping are the same weights, shared where they were."""

from __future__ import annotations

import torch

from tandem.engine.native import huge_pages
from tandem.engine.native.packed_linear import PackedLinear
from tandem.engine.quant import Int4Linear


def test_gather_moves_every_weight_and_keeps_ties() -> None:
    g = torch.Generator().manual_seed(0)
    packed = PackedLinear.from_int4(Int4Linear.from_float(torch.randn(512, 1024, generator=g)))
    dense = torch.nn.Linear(1024, 1024)
    emb = torch.nn.Embedding(1024, 1024)
    dense.weight = emb.weight  # tied, as an lm_head and its embedding
    model = torch.nn.ModuleDict({"packed": packed, "dense": dense, "emb": emb})
    x = torch.randn(3, 1024, generator=g)
    before = (packed(x), dense(x), emb(torch.tensor([5, 7])))
    huge_pages.gather(model)
    after = (packed(x), dense(x), emb(torch.tensor([5, 7])))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert dense.weight.data_ptr() == emb.weight.data_ptr()  # still one tensor
    starts = sorted(t.data_ptr() for t in (packed.q, packed.d, packed.m, dense.weight))
    assert starts[-1] - starts[0] < 8 << 20  # one mapping


def test_zeros_is_zeroed_and_writable() -> None:
    t = huge_pages.zeros((3, 1 << 20), torch.float32)
    assert t.shape == (3, 1 << 20) and not t.any()
    t[1, 5] = 2.0
    assert t.sum().item() == 2.0
