"""Decode steps replayed from CUDA graphs (GPU only; needs the Triton attention backend).

A decode step launches hundreds of small kernels; on a GPU their launch overhead, not the
math, sets the time per token at small batches. We capture the whole forward of a
decode-only batch once per batch size (1, 2, 4, 8, 16, 32, ...), over static input buffers,
and replay it: a step then costs one graph launch. Smaller batches are padded to the next
captured size with rows that write nowhere (slot -1) and attend to one position.

    static buffers (max_batch rows) --copy step inputs--> replay graph[B] --> logits[:n]
"""

from __future__ import annotations

import torch

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.models.causal_lm import CausalLM


def capture_sizes(max_batch: int) -> list[int]:
    """Batch sizes to capture: powers of two up to 16, then every 16 up to ``max_batch``."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


class DecodeGraphs:
    """Captured decode forwards for a fixed set of batch sizes."""

    def __init__(
        self,
        model: CausalLM,
        kv_cache: torch.Tensor,
        backend: AttentionBackend,
        max_batch: int,
        max_blocks: int,
        block_size: int,
    ) -> None:
        dev = kv_cache.device
        self.model, self.kv_cache, self.backend = model, kv_cache, backend
        self.max_batch, self.max_blocks, self.block_size = max_batch, max_blocks, block_size
        self.ids = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.slots = torch.full((max_batch,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.tables = torch.zeros(max_batch, max_blocks, dtype=torch.int32, device=dev)
        self.qsl = torch.arange(max_batch + 1, dtype=torch.int32, device=dev)
        self.sizes = capture_sizes(max_batch)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture()

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.qsl[: b + 1],
            seq_lens=self.seq_lens[:b],
            block_tables=self.tables[:b],
            slot_mapping=self.slots[:b],
            query_lens_cpu=[1] * b,
            seq_lens_cpu=[1] * b,
            num_decodes=b,
            block_size=self.block_size,
            max_decode_blocks=self.max_blocks,
        )

    @torch.inference_mode()
    def _forward(self, b: int) -> torch.Tensor:
        hidden = self.model(
            self.ids[:b], self.positions[:b], self.kv_cache, self._meta(b), self.backend
        )
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for b in reversed(self.sizes):  # largest first, so smaller ones reuse its pool
                self._forward(b)  # warm up: compiles the Triton kernels outside capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    logits = self._forward(b)
                pool = graph.pool()
                self.graphs[b] = (graph, logits)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def fits(self, num_seqs: int, widest_table: int) -> bool:
        """Can a decode-only step of this shape replay a captured graph?"""
        return num_seqs <= self.max_batch and widest_table <= self.max_blocks

    def run(
        self,
        ids: list[int],
        positions: list[int],
        slots: list[int],
        seq_lens: list[int],
        tables: list[list[int]],
    ) -> torch.Tensor:  # [n, V] fp32 logits
        """Replay the smallest captured graph that holds ``n = len(ids)`` rows."""
        n = len(ids)
        b = next(s for s in self.sizes if s >= n)
        dev = self.ids.device
        self.ids[:n].copy_(torch.tensor(ids, dtype=torch.int64), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(positions, dtype=torch.int64), non_blocking=True)
        self.slots[:n].copy_(torch.tensor(slots, dtype=torch.int64), non_blocking=True)
        self.slots[n:b].fill_(-1)
        self.seq_lens[:n].copy_(torch.tensor(seq_lens, dtype=torch.int32), non_blocking=True)
        self.seq_lens[n:b].fill_(1)
        width = max(len(t) for t in tables)
        table = torch.zeros(n, width, dtype=torch.int32)
        for i, t in enumerate(tables):
            table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        self.tables[:n, :width].copy_(table.to(dev, non_blocking=True))
        self.tables[:n, width:].zero_()
        graph, logits = self.graphs[b]
        graph.replay()
        return logits[:n]
