"""The attention backend interface and the per-step metadata every backend reads.

One engine step runs a *flattened* batch: the new tokens of B sequences concatenated into T
query rows. Decode sequences (one new token each) come first, then prefill chunks:

    query rows:   | d0 | d1 | d2 | p0 p0 p0 p0 | p1 p1 |        T = 3 + 4 + 2
    query_start:  0    1    2    3             7       9        [B + 1]
    seq_lens:     c0+1 c1+1 c2+1 ctx0+4        ctx1+2           [B] cached + new

Query row i of sequence b sits at position ``seq_lens[b] - query_len[b] + i`` and attends to
every cached position <= its own (causal); in a sliding-window layer (window W) only to the
last W of them, ``p - W + 1 .. p`` (transformers' semantics). Blocks wholly before the window
of a step's first query row may have been freed (tandem/engine/core/kv_cache_manager.py):
their table entries still name some block, whose contents a backend must never let into its
result, so it does not read them at all. The KV of layer l lives in
``k_cache = kv[l, 0]`` and ``v_cache = kv[l, 1]``, each ``[num_blocks, block_size, Hkv, D]``;
``block_tables[b, j]`` is the physical block holding positions ``j*bs .. j*bs+bs-1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Where each query row's keys live; built once per step, shared by every layer."""

    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [B] int32, context length after this step (cached + new)
    block_tables: torch.Tensor  # [B, max_blocks] int32, unused entries are 0
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset of each new token
    query_lens_cpu: list[int]  # host copies, so loops need no device sync
    seq_lens_cpu: list[int]
    num_decodes: int  # the first num_decodes sequences have query_len == 1
    block_size: int
    # Set when a CUDA graph is captured: decode kernels size their grid from this bound (the
    # block-table width) instead of the host seq_lens, so one capture serves every length.
    max_decode_blocks: int | None = None

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        tables: list[list[int]],
        slots: list[int],
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        """Metadata for sequences given host-side (decode sequences first): block tables are
        padded with 0 to the longest."""
        width = max(len(t) for t in tables)
        qsl = [0]
        for n in query_lens:
            qsl.append(qsl[-1] + n)
        return cls(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                      dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_lens_cpu=query_lens,
            seq_lens_cpu=seq_lens,
            num_decodes=sum(1 for n in query_lens if n == 1),
            block_size=block_size,
        )

    @property
    def num_seqs(self) -> int:
        """Number of sequences in the step."""
        return len(self.seq_lens_cpu)

    @property
    def num_decode_tokens(self) -> int:
        """Query rows that belong to decode sequences (one each)."""
        return self.num_decodes


class AttentionBackend(Protocol):
    """Writes new K/V into the paged cache and attends over it."""

    name: str

    def write_kv(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        slot_mapping: torch.Tensor,  # [T] int64
    ) -> None:
        """Scatter the step's new keys and values into their cache slots."""
        ...

    def attend(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Causal attention of every query row over its sequence's cached keys (GQA aware);
        with ``window``, over the last ``window`` positions up to its own only."""
        ...

    def for_layer(self, layer: int) -> AttentionBackend:
        """The backend decoder layer ``layer`` runs through: this one, but over a cache whose
        layers have scales of their own (an fp8 cache's per-layer k/v scales)."""
        ...
