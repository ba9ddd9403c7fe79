"""Random paged-attention cases for the tests and the benchmark (not used by the engine).

A case is a flattened batch (decodes first, then prefill chunks) over caches filled with random
values, whose block tables point at shuffled, non-contiguous blocks:

    chunks = [(cached, new), ...]   seq b holds cached + new positions in cdiv(., bs) blocks
    block_tables[b] = a random draw of distinct block ids, zero padded to the widest row

With a sliding ``window`` W, the blocks the KV cache manager would have freed by then (those
wholly before ``cached - W + 1``, the first query row's window start) are all named by one
extra block full of NaN, so a kernel that lets a freed block into its result fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.engine.attention.base import AttentionMetadata


@dataclass(slots=True)
class PagedCase:
    """One step's inputs: queries, the step's new K/V rows, the caches and the metadata."""

    query: torch.Tensor  # [T, Hq, D]
    key: torch.Tensor  # [T, Hkv, D] new rows, slots in meta.slot_mapping
    value: torch.Tensor  # [T, Hkv, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    meta: AttentionMetadata
    window: int | None = None  # the sliding window the case is meant for


def make_paged_case(
    chunks: list[tuple[int, int]],
    num_decodes: int,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    spare_blocks: int = 3,
    seed: int = 0,
    window: int | None = None,
) -> PagedCase:
    """Build a case from ``(cached_len, query_len)`` per sequence; the first ``num_decodes``
    chunks must have ``query_len == 1``. With ``window``, freed blocks read NaN (above)."""
    if any(q != 1 for _, q in chunks[:num_decodes]):
        raise ValueError("decode chunks must have exactly one new token")
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in chunks]
    query_lens = [q for _, q in chunks]
    nblocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(nblocks) + spare_blocks + (1 if window else 0)
    poison = num_blocks - 1  # only named when window is set
    perm = torch.randperm(poison if window else num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(len(chunks), max(nblocks) + 1, dtype=torch.int32)  # [B, max_blocks]
    slots: list[torch.Tensor] = []
    used = 0
    for b, ((cached, new), n) in enumerate(zip(chunks, nblocks, strict=True)):
        table[b, :n] = perm[used : used + n]
        used += n
        if window:  # the blocks no query of this step sees: freed, reused by now
            table[b, : max(0, cached - window + 1) // block_size] = poison
        pos = torch.arange(cached, cached + new)
        slots.append(table[b, pos // block_size].long() * block_size + pos % block_size)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)  # [B + 1]
    num_tokens = sum(query_lens)

    dev_gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=dev_gen, device=device).to(dtype)

    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    query = randn(num_tokens, num_q_heads, head_dim)
    key = randn(num_tokens, num_kv_heads, head_dim)
    value = randn(num_tokens, num_kv_heads, head_dim)
    k_cache, v_cache = randn(*cache_shape), randn(*cache_shape)
    if window:
        k_cache[poison] = float("nan")
        v_cache[poison] = float("nan")
    meta = AttentionMetadata(
        query_start_loc=starts.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=table.to(device),
        slot_mapping=torch.cat(slots).to(device),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
        num_decodes=num_decodes,
        block_size=block_size,
    )
    return PagedCase(
        query=query,
        key=key,
        value=value,
        k_cache=k_cache,
        v_cache=v_cache,
        meta=meta,
        window=window,
    )
