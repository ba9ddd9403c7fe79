"""The torch backend's sliding window against attention written out row by row.

Transformers' rule (masking_utils.sliding_window_overlay): a query at position p sees keys
p - W + 1 .. p. The reference here gathers exactly those keys through the block table and
takes a plain softmax; blocks a freed sequence no longer holds read NaN (make_paged_case).
"""

from __future__ import annotations

import pytest
import torch

from tandem.engine.attention.torch_backend import TorchAttentionBackend
from tandem.engine.attention.triton_kernels.testing import PagedCase, make_paged_case

SCALE = 0.2


def row_by_row(c: PagedCase, window: int | None) -> torch.Tensor:
    """Each query row over its visible keys, one softmax per row and head (fp64)."""
    m, bs = c.meta, c.meta.block_size
    out = torch.empty_like(c.query, dtype=torch.float64)
    group = c.query.shape[1] // c.k_cache.shape[2]
    starts = m.query_start_loc.tolist()
    for b in range(m.num_seqs):
        ql, sl = m.query_lens_cpu[b], m.seq_lens_cpu[b]
        for i in range(ql):
            p = sl - ql + i
            lo = max(0, p - window + 1) if window else 0
            keys = torch.arange(lo, p + 1)
            blocks = m.block_tables[b, keys // bs].long()
            k = c.k_cache[blocks, keys % bs].double()  # [n, Hkv, D]
            v = c.v_cache[blocks, keys % bs].double()
            q = c.query[starts[b] + i].double()  # [Hq, D]
            kh = k.repeat_interleave(group, dim=1)  # [n, Hq, D]
            vh = v.repeat_interleave(group, dim=1)
            w = torch.softmax(torch.einsum("hd,nhd->hn", q, kh) * SCALE, dim=-1)
            out[starts[b] + i] = torch.einsum("hn,nhd->hd", w, vh)
    return out


@pytest.mark.parametrize("window", [1, 5, 16, 23, 64, None])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)], ids=lambda h: f"hq{h[0]}-hkv{h[1]}")
def test_torch_window_matches_row_by_row(window: int | None, heads: tuple[int, int]) -> None:
    chunks = [(40, 1), (15, 1), (0, 1), (0, 37), (20, 13), (90, 40)]
    c = make_paged_case(chunks, 3, num_q_heads=heads[0], num_kv_heads=heads[1], head_dim=16,
                        block_size=8, dtype=torch.float32, window=window)
    out = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE, window)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), row_by_row(c, window), atol=1e-5, rtol=1e-5)


def test_a_window_changes_the_result() -> None:
    """The window is not a no-op: rows with more than W keys differ from full attention."""
    c = make_paged_case([(40, 1), (0, 30)], 1, num_q_heads=4, num_kv_heads=2, head_dim=16,
                        block_size=8, dtype=torch.float32)
    full = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE)
    windowed = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE, 8)
    assert not torch.allclose(full[0], windowed[0])  # the decode row: 41 keys, sees 8
    torch.testing.assert_close(full[1:9], windowed[1:9])  # prefill rows 0..7: <= 8 keys
    assert not torch.allclose(full[10:], windowed[10:])
